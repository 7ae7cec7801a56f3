"""Micro-steps -> optimizer steps (sync cycles) when training accumulates gradients.

A recorded row is one micro-step (one rec.step(): one batch through forward and backward). With
gradient accumulation k micro-steps make one optimizer step, and only the last one synchronizes
gradients, so the bottleneck of a step only means something over the whole cycle:

1. a cycle ends at a micro-step that ran the optimizer (optimizer_ns > 0); when no row shows an
   optimizer, at one that synchronized gradients (synced == 1, with some rows synced == 0);
   when neither tells, each micro-step is a cycle of its own and nothing changes;
2. cycles are numbered per rank in order, so cycle n is the same optimizer step on every rank;
3. a cycle's times are the sums of its micro-steps', its start the first one's, and it is
   named by its last micro-step (`step`), with `micro_steps` counting them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SUMMED = ("step_ns", "data_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "wait_ns", "other_ns",
          "forward_ns", "backward_ns", "optimizer_ns", "n_comm", "data_cpu_ns", "between_ns",
          "host_ns", "bubble_ns", "data_ops_ns")


def cycle_ends(frame: pd.DataFrame) -> np.ndarray | None:
    """Bool per row: the micro-step closes a cycle; None when rows are not micro-steps of
    longer cycles (every row is its own step)."""
    if frame.empty:
        return None
    if "optimizer_ns" in frame:
        opt = frame["optimizer_ns"].to_numpy() > 0
        if opt.any() and not opt.all():
            return opt
        if opt.all():
            return None
    if "synced" in frame:
        synced = frame["synced"].to_numpy()
        if (synced == 1).any() and (synced == 0).any():
            return synced == 1
    return None


def group_cycles(frame: pd.DataFrame, ends: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per rank and cycle, the micro-step -> cycle map: rank, step, cycle_step).

    `frame` is sorted by rank and step; a rank's trailing micro-steps after its last cycle end
    make a last, partial cycle."""
    rank = frame["rank"].to_numpy()
    ends = np.asarray(ends, dtype=bool)
    # cycle number within the rank: how many cycle ends came before this row on the rank
    before = np.cumsum(ends) - ends
    first_of_rank = np.r_[True, rank[1:] != rank[:-1]]
    offset = np.maximum.accumulate(np.where(first_of_rank, before, 0))
    cycle = before - offset
    keys = pd.DataFrame({"rank": rank, "cycle": cycle})
    g = frame.assign(cycle=cycle).groupby(["rank", "cycle"], sort=True)
    cols = [c for c in SUMMED if c in frame]
    out = g[cols].sum()
    out["start_ns"] = g["start_ns"].min()
    out["step"] = g["step"].max()
    out["micro_steps"] = g["step"].size()
    if "synced" in frame:
        out["synced"] = g["synced"].max()
    out = out.reset_index()
    mapping = keys.assign(step=frame["step"].to_numpy()).merge(
        out[["rank", "cycle", "step"]].rename(columns={"step": "cycle_step"}),
        on=["rank", "cycle"], how="left")
    return out.drop(columns="cycle"), mapping[["rank", "step", "cycle_step"]]


def sync_interval(cycles: pd.DataFrame) -> int:
    """Micro-steps per optimizer step: the median over full cycles."""
    counts = cycles["micro_steps"].to_numpy()
    return int(np.median(counts)) if counts.size else 1
