"""Finds stragglers: the same rank(s) the others wait for across most imbalanced steps.

1. In each imbalanced step, the slow ranks are those that waited at most half as long as the
   rank that waited longest (they arrived last; consistency.find_roles marks them).
2. A rank that is consistently late (consistency.py) and slow in at least `straggler_steps` of
   the imbalanced steps is a straggler, provided such ranks are a minority of the world (else it
   is the fast ranks that are odd). With too few steps to test consistency, a rank slow in that
   share of all analysed steps is named.
3. For each straggler, the part of the step that differs most from the median rank says why;
   where the layout names its peer group (the ranks doing the same work: its data-parallel
   group), the median is of the peers, the ranks that wait for it (another pipeline stage does
   other work, so its time says nothing of this rank's excess).
Per-step jitter is never consistent, so it names no one. A rank late in most steps (or
causing most of the waiting) that too few steps cannot confirm (consistency.Roles.probable) is
named as probably a straggler, with that evidence, never as jitter.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import MinorStraggler, Straggler
from ..thresholds import Thresholds
from ..vocab import COMPUTE_PHASES, IMBALANCED
from .consistency import Roles, bursts
from .layout import Layout
from .rowgroups import PerRank, count_distinct

_CAUSES = ("data_ns", "compute_ns", "other_ns")


def _probably(roles: Roles) -> str:
    """Why a rank is only probably a straggler, in words."""
    rank, n, caused = roles.probable
    return (f"last in {n} of {roles.n_steps} steps, causing {caused:.0%} of the waiting, but "
            "too few steps to rule out chance: record more steps to confirm")
_COMPUTE_PARTS = tuple(f"{p}_ns" for p in COMPUTE_PHASES)
#: a straggler's compute excess measured on the GPU's own clock, its host phases like its peers'
DEVICE_COMPUTE = ("on the GPU: its host launched forward, backward and optimizer as fast as its "
                  "peers', its kernels ran longer")


def device_timed(frame: pd.DataFrame, rank: int) -> bool:
    """Whether the rank's steps were timed on its GPU (CUDA events: its compute is the device's
    busy time, while the forward / backward / optimizer columns stay the host's launch times)."""
    if "gpu_step_ns" not in frame:
        return False
    mine = frame["rank"].to_numpy() == rank
    return bool(mine.any() and frame["gpu_step_ns"].to_numpy(dtype=float)[mine].size
                and not np.isnan(frame["gpu_step_ns"].to_numpy(dtype=float)[mine]).all())


def find_stragglers(frame: pd.DataFrame, steps: pd.DataFrame, th: Thresholds, roles: Roles,
                    hosts: dict[int, str] | None = None,
                    layout: Layout | None = None,
                    per_rank: PerRank | None = None) -> list[Straggler]:
    n_ranks = count_distinct(frame["rank"].to_numpy())
    # the steps where ranks wait for a late one: imbalanced as their label, or beside a larger
    # one (a data-bound step whose waiting is still a straggler's: else the report said "rank 1
    # waits for the rest every step" and named no one)
    held = (steps["label"] == IMBALANCED).to_numpy().copy()
    if "secondary" in steps:
        held |= np.array([IMBALANCED in sec for sec in steps["secondary"]], dtype=bool)
    imb = steps.loc[held, "step"].to_numpy()
    if imb.size == 0 or roles.slow is None:
        return []
    in_imb = np.isin(roles.steps, imb)
    slow = pd.Series(roles.slow[in_imb].sum(axis=0), index=roles.ranks)  # steps arrived last
    need = th.straggler_steps
    if roles.decided:
        share = slow[slow.index.isin(roles.late_ranks)] / max(int(in_imb.sum()), 1)
        # several ranks the tests find late, taking turns (one slower every step, another
        # stalled every other step): together last in the share a straggler needs, each in
        # its part of it (else the one late in 9 of 19 steps, 40 ms each time, went unnamed)
        if len(share) > 1 and float(share.sum()) >= need:
            need /= len(share)
    else:
        share = slow / steps.shape[0]
    cands = share[share >= need]
    if cands.empty or len(cands) > n_ranks / 2:
        return []
    why = _Why(frame, per_rank, layout, set(cands.index))
    out = []
    for rank, s in cands.sort_values(ascending=False).items():
        excess, cause, detail, cause_excess, group, in_group = why(int(rank))
        probable = roles.probable is not None and roles.probable[0] == int(rank) \
            and int(rank) not in roles.late
        out.append(Straggler(int(rank), float(s), excess, cause, detail, cause_excess,
                             (hosts or {}).get(int(rank), ""),
                             group=list(group[1]) if group else [],
                             probable=_probably(roles) if probable else "",
                             peers=[int(r) for r in in_group], last_in=_last_in(roles, rank),
                             bursts=bursts(roles, steps, th.wait, int(rank)) or {}))
    return out


def find_minor(frame: pd.DataFrame, roles: Roles, named: list[Straggler],
               hosts: dict[int, str] | None = None, layout: Layout | None = None,
               per_rank: PerRank | None = None) -> list[MinorStraggler]:
    """The ranks consistently late by less than the imbalance threshold (Roles.minor) that are
    not named stragglers already, with the part of their step that differs most from their
    peers', latest first."""
    if not roles.minor or roles.ranks is None:
        return []
    skip = {s.rank for s in named}
    late = {r: v for r, v in roles.minor.items() if r not in skip}
    if not late:
        return []
    why = _Why(frame, per_rank, layout, set(late))
    typical = roles.typical_ns
    out = []
    for rank in sorted(late, key=late.get, reverse=True):
        excess, cause, detail, _, _, _ = why(rank)
        out.append(MinorStraggler(rank, int(late[rank]),
                                  late[rank] / typical if typical > 0 else 0.0, excess, cause,
                                  detail, (hosts or {}).get(rank, ""), _last_in(roles, rank)))
    return out


def _last_in(roles: Roles, rank) -> tuple[int, int]:
    """(N, M): the rank arrived last in N of the M steps every rank recorded."""
    j = int(np.flatnonzero(np.asarray(roles.ranks) == rank)[0])
    return int(roles.slow[:, j].sum()), int(roles.n_steps)


class _Why:
    """Why a rank is late: its mean busy time per step against its peers' median (the ranks of
    its peer group where the layout names one, else every rank not in `apart`), and the part of
    the step that differs most (the phase of the compute where it carries most of it)."""

    def __init__(self, frame: pd.DataFrame, per_rank: PerRank | None, layout: Layout | None,
                 apart: set):
        self.frame, self.layout = frame, layout
        per_rank = per_rank or PerRank(frame)
        needed = ("step_ns", "wait_ns", "bubble_ns") + _CAUSES + _COMPUTE_PARTS
        # each rank's mean per step (the report's one statistic), compared with the median
        # rank's; the phases as the rank table shows them (both readers leave the exposed
        # communication out of them already: taking it out again made a waiting rank's
        # backward look short, and named a straggler's backward where the table showed its
        # forward longer)
        self.means = pd.DataFrame({c: per_rank.mean(c) for c in needed if c in frame},
                                  index=pd.Index(per_rank.groups.keys, name="rank"))
        busy = self.means["step_ns"] - self.means["wait_ns"]
        if "bubble_ns" in self.means:  # waiting on another pipeline stage is not being slow
            busy = busy - self.means["bubble_ns"]
        self.busy = busy
        self.others = [r for r in self.means.index if r not in apart]

    def __call__(self, rank: int):
        """(excess busy ns, cause, detail, the cause's excess ns, peer group, peers in it)."""
        group = self.layout.peer_group(rank) if self.layout is not None else None
        in_group = [r for r in self.others if group and r in group[1]]
        peers = in_group or self.others
        ref = self.means.loc[peers].median()
        row = self.means.loc[rank]
        diffs = {c[:-3]: float(row[c] - ref[c]) for c in _CAUSES if c in row}
        cause = max(diffs, key=diffs.get)
        detail = ""
        if cause == "compute":  # name the phase only if it carries most of the excess
            parts = {c[:-3]: float(row[c] - ref[c]) for c in _COMPUTE_PARTS if c in row}
            if parts and max(parts.values()) >= 0.5 * diffs["compute"]:
                detail = max(parts, key=parts.get)
            elif device_timed(self.frame, rank):
                detail = DEVICE_COMPUTE
        excess = int(self.busy.loc[rank] - float(self.busy.loc[peers].median()))
        return excess, cause, detail, int(diffs[cause]), group, in_group
