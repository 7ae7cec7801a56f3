"""Confidence from evidence: how much the input supports the verdict (docs/rules.md, "Confidence").

1. The verdict's share of step time sets the starting level: high (>= 75%), medium (>= 50%), low.
2. Each lack of evidence caps it, with the reason kept on the verdict:
   - steps: one analysed step caps at low, two at medium; an imbalanced or jitter-bound verdict,
     or a named straggler, needs at least three (fewer cannot tell a consistent straggler from
     one step's lateness): low;
   - step markers: a trace without ProfilerStep ranges is read as one step: low;
   - ranks: fewer ranks with steps than the world size caps at medium (waiting for a rank that
     is not there cannot be told from transfer), one rank of several at low;
   - communication: several ranks and no collective recognised: low;
   - clocks: ranks on several hosts whose clocks could not be aligned: medium;
   - margin: when the deciding share of the verdict's steps (the part's share of their time)
     lies within a fifth of its threshold (15% against 15%: one noisy step flips it), medium;
   - compute-bound, the healthy state, when compute is under half of its steps' time: low;
   - a near tie: the next label holds within 15 points of the verdict's share of time: low;
   - a probable straggler (consistency.Roles.probable): one rank arrived last in three quarters
     of the steps or more, or caused three quarters of the waiting or more, and no test found it
     consistent (too few or too noisy steps): the waiting it caused is imbalance, said at low
     confidence with that evidence, whatever the verdict it gives or leaves;
   - a straggler not ruled out (consistency.Roles.unruled): steps that leave room, at a
     one-sided 5%, for one rank to be late by the imbalance threshold's share of the step on
     average, where no rank is named late: a jitter verdict low (jitter is the claim that no
     rank is; where the steps fit a straggler as well, either could be the verdict, as in a near
     tie), any other but imbalanced (the claim that a rank is late) medium (its label may
     hold, but "no straggler" is not shown: a backward
     slowed 10% on one rank of a data-bound accumulation run was "data-bound, high", nobody
     named);
   - GPU runs whose collectives outside DDP hold the comm threshold's share of the step or more,
     timed on the host only (launch to completion; the GPU's waiting for them is not seen), when
     the verdict is not comm-bound: medium;
   - one step decides it: without some single step the verdict would be another label
     (leave-one-out): low. Two sources of the same run measure a step near a threshold on either
     side of it now and then; a verdict that rests on such a step is a close call either way;
   - the steps cannot settle it: in RESAMPLE_FLIP of bootstrap resamples of the analysed steps
     or more, another label wins (classify.resampled_lead): low. 6 healthy steps of 9 are that
     (jitter wins 35% of resamples), where no single step decides it; 7 of 10 (14%) are not;
3. Each rule the report broke and had to clip (invariants.py) drops one level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..results import Verdict
from ..thresholds import Thresholds
from ..vocab import COMM, COMPUTE, IMBALANCED, JITTER_BOUND
from .bottlenecks.table import TABLE
from .classify import NEAR_TIE, changes_without_one_step, resampled_lead

LEVELS = ("low", "medium", "high")
MARGIN = 0.2  # relative distance from the threshold under which one noisy step flips a label
RUNNER_UP = NEAR_TIE  # the verdict's lead over the next label (share of time): a near tie
#: the share of resamples of the steps in which another label wins that makes the verdict a
#: close call (one in five: a lead that one resample in eight undoes, 7 of 9 steps, is still
#: "likely", medium or high as its share says)
RESAMPLE_FLIP = 0.2


@dataclass(frozen=True)
class Evidence:
    """What the input holds that the verdict rests on."""

    steps: int                 # analysed (optimizer) steps
    ranks: int                 # ranks with data
    world: int                 # world size
    step_markers: bool = True  # steps come from markers (rec.step(), ProfilerStep#N)
    comm_seen: bool = True     # some communication recognised (matters with 2+ ranks)
    clocks_aligned: bool = True  # ranks on several hosts placed on one clock (or one host)
    stragglers: bool = False   # a straggler is named
    minor: bool = False        # a minor straggler is named
    broken_rules: int = 0      # invariant rules the analysis had to clip
    #: (rank, steps last, share of the waiting caused): late most of the time, not significant
    leaning: tuple[int, int, float] | None = None
    leaning_of: int = 0        # ... of this many steps
    #: (rank, mean lateness ns, upper bound ns, material ns): a straggler these steps cannot
    #: rule out (consistency.Roles.unruled)
    unruled: tuple[int, float, float, float] | None = None
    #: on a GPU, the share of the step in collectives timed on the host only (launch to
    #: completion: how long the GPU waited for them is not seen); the largest over ranks
    host_comm_share: float = 0.0


def start_level(share: float) -> str:
    return "high" if share >= 0.75 else "medium" if share >= 0.5 else "low"


#: the per-step share that decides each label, and its threshold's name
_DECIDING = {b.label: (b.share, b.threshold) for b in TABLE}


def share_of_time(steps: pd.DataFrame, col: str) -> float:
    """A per-step share over these steps, each weighted by its time (the part's share of their
    total time: the statistic of every share the report gives)."""
    w = steps["step_ns"].to_numpy(np.float64)
    return float((steps[col].to_numpy(np.float64) * w).sum() / max(w.sum(), 1.0))


def margin(steps: pd.DataFrame, label: str, th: Thresholds) -> tuple[float, str]:
    """(relative distance of the deciding share of the verdict's steps from its threshold, what
    it was). For compute-bound: the distance of the nearest other label."""
    mine = steps[steps["label"] == label]
    if mine.empty:
        return 1.0, ""
    if label in _DECIDING:
        col, name = _DECIDING[label]
        thr = getattr(th, name)
        v = share_of_time(mine, col)
        return (abs(v - thr) / thr if thr > 0 else 1.0), f"{col[:-6]} {v:.0%} against {thr:.0%}"
    best, what = 1.0, ""
    for other, (col, name) in _DECIDING.items():
        thr = getattr(th, name)
        if other == JITTER_BOUND or thr <= 0 or col not in mine:
            continue
        v = share_of_time(mine, col)
        d = (thr - v) / thr
        if d < best:
            best, what = d, f"{col[:-6]} {v:.0%} against {thr:.0%} for {other}"
    return max(best, 0.0), what


def earn(verdict: Verdict, ev: Evidence, steps: pd.DataFrame, th: Thresholds) -> Verdict:
    """The verdict with its confidence capped by the evidence, and the reasons."""
    caps: list[tuple[str, str]] = []
    waiting = verdict.label in (IMBALANCED, JITTER_BOUND)
    if ev.steps < 3 and (waiting or ev.stragglers):
        caps.append(("low", f"{ev.steps} step(s) cannot tell a consistent straggler from one "
                            "step's lateness"))
    if ev.steps <= 1:
        caps.append(("low", "1 step analysed"))
    elif ev.steps == 2:
        caps.append(("medium", "2 steps analysed"))
    if not ev.step_markers:
        caps.append(("low", "no step markers: the whole trace is one step"))
    if ev.ranks == 1 < ev.world:
        caps.append(("low", f"1 of {ev.world} ranks: one rank's data cannot tell its waiting "
                            "for the others from transfer"))
    elif ev.ranks < ev.world:
        caps.append(("medium", f"{ev.ranks} of {ev.world} ranks: waiting for the others cannot "
                               "be told from transfer"))
    if ev.world > 1 and ev.ranks > 1 and not ev.comm_seen:
        caps.append(("low", "no communication recognised"))
    if not ev.clocks_aligned:
        caps.append(("medium", "clocks of several hosts could not be aligned"))
    if verdict.label == COMPUTE:  # the healthy state must be earned: mostly compute
        mine = steps[steps["label"] == COMPUTE]
        busy = share_of_time(mine, "compute_share") if len(mine) and "compute_share" in steps \
            else None
        if busy is not None and busy < 0.5:
            caps.append(("low", f"compute is only {busy:.0%} of the step: most of it is time "
                                "gpuscope cannot place (other)"))
    others = {k: v for k, v in verdict.time_by_label.items() if k != verdict.label}
    if others:
        other = max(others, key=others.get)
        if verdict.share - others[other] < RUNNER_UP:  # a near tie: noise picks the other
            caps.append(("low", f"{other} holds {others[other]:.0%} of the time against its "
                                f"{verdict.share:.0%}: either could be the verdict"))
    if waiting and ev.leaning is not None:
        rank, n, caused = ev.leaning
        caps.append(("low", f"rank {rank} is probably a straggler: it arrived last in {n} of "
                            f"{ev.leaning_of} steps, causing {caused:.0%} of the waiting, but so "
                            "few steps cannot rule out chance: record more steps"))
    if ev.unruled is not None and ev.leaning is None and (verdict.label == JITTER_BOUND or (
            verdict.label != IMBALANCED and not (ev.stragglers or ev.minor))):
        rank, late, upper, bound = ev.unruled
        caps.append(("low" if verdict.label == JITTER_BOUND else "medium",
                     f"{ev.steps} steps cannot rule out a straggler: rank {rank} "
                     f"arrived {late / 1e6:.1f} ms after the others on average, and up "
                     f"to {upper / 1e6:.1f} ms is within chance (a straggler from "
                     f"{bound / 1e6:.1f} ms on is imbalance)"))
    moved = changes_without_one_step(steps, verdict.label) if ev.steps >= 3 else None
    if moved is not None:
        caps.append(("low", f"without step {moved[0]} the verdict would be {moved[1]}: one "
                            "step decides it"))
    else:
        flip = resampled_lead(steps, verdict.label)
        if flip is not None and flip[0] >= RESAMPLE_FLIP:
            caps.append(("low", f"{flip[1]} wins in {flip[0]:.0%} of resamples of these "
                                f"{len(steps)} steps: they cannot settle it"))
    if verdict.label != COMM and ev.host_comm_share >= th.comm:
        caps.append(("medium", f"collectives outside DDP took {ev.host_comm_share:.0%} of the "
                               "step on the GPU, timed on the host: how long the GPU waited for "
                               "them is not seen"))
    dist, what = margin(steps, verdict.label, th)
    if what and dist < MARGIN:
        caps.append(("medium", f"close to its threshold ({what})"))
    level = LEVELS.index(start_level(verdict.share))
    reasons = []
    for cap, why in caps:
        if LEVELS.index(cap) < level:
            level = LEVELS.index(cap)
        reasons.append(why)
    if ev.broken_rules:
        level = max(level - 1, 0)
        reasons.append(f"{ev.broken_rules} rule(s) of the report did not add up and were clipped")
    return replace(verdict, confidence=LEVELS[level], evidence=tuple(reasons))
