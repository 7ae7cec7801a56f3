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

from ..results import Straggler
from ..thresholds import Thresholds
from ..vocab import COMPUTE_PHASES, IMBALANCED
from .consistency import Roles, bursts
from .layout import Layout
from .rowgroups import PerRank

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
    n_ranks = frame["rank"].nunique()
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
    if roles.decided:
        share = slow[slow.index.isin(roles.late_ranks)] / max(int(in_imb.sum()), 1)
    else:
        share = slow / steps.shape[0]
    cands = share[share >= th.straggler_steps]
    if cands.empty or len(cands) > n_ranks / 2:
        return []
    per_rank = per_rank or PerRank(frame)
    g = per_rank.groups
    needed = ("step_ns", "wait_ns", "bubble_ns") + _CAUSES + _COMPUTE_PARTS
    # each rank's mean per step (the report's one statistic), compared with the median rank's;
    # the phases as the rank table shows them (both readers leave the exposed communication out
    # of them already: taking it out again made a waiting rank's backward look short, and named
    # a straggler's backward where the table showed its forward longer)
    means = pd.DataFrame({c: per_rank.mean(c) for c in needed if c in frame},
                         index=pd.Index(g.keys, name="rank"))
    busy = means["step_ns"] - means["wait_ns"]
    if "bubble_ns" in means:  # waiting on another pipeline stage is not being slow
        busy = busy - means["bubble_ns"]
    others = [r for r in means.index if r not in cands.index]
    out = []
    for rank, s in cands.sort_values(ascending=False).items():
        group = layout.peer_group(int(rank)) if layout is not None else None
        in_group = [r for r in others if group and r in group[1]]
        peers = in_group or others
        ref = means.loc[peers].median()
        ref_busy = float(busy.loc[peers].median())
        row = means.loc[rank]
        diffs = {c[:-3]: float(row[c] - ref[c]) for c in _CAUSES if c in row}
        cause = max(diffs, key=diffs.get)
        detail = ""
        if cause == "compute":  # name the phase only if it carries most of the excess
            parts = {c[:-3]: float(row[c] - ref[c]) for c in _COMPUTE_PARTS if c in row}
            if parts and max(parts.values()) >= 0.5 * diffs["compute"]:
                detail = max(parts, key=parts.get)
            elif device_timed(frame, int(rank)):
                detail = DEVICE_COMPUTE
        probable = roles.probable is not None and roles.probable[0] == int(rank) \
            and int(rank) not in roles.late
        j = int(np.flatnonzero(np.asarray(roles.ranks) == rank)[0])
        last_in = (int(roles.slow[:, j].sum()), int(roles.n_steps))
        out.append(Straggler(int(rank), float(s), int(busy.loc[rank] - ref_busy), cause, detail,
                             int(diffs[cause]), (hosts or {}).get(int(rank), ""),
                             group=list(group[1]) if group else [],
                             probable=_probably(roles) if probable else "",
                             peers=[int(r) for r in in_group], last_in=last_in,
                             bursts=bursts(roles, steps, th.wait, int(rank)) or {}))
    return out
