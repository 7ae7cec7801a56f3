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
          "host_ns", "bubble_ns", "data_ops_ns", "syncs", "sync_ns",
          "sync_idle_ns", "launches", "cpu_math_ns", "python_ns")


def cycle_ends(frame: pd.DataFrame) -> np.ndarray | None:
    """Bool per row: the micro-step closes a cycle; None when rows are not micro-steps of
    longer cycles (every row is its own step)."""
    if frame.empty:
        return None
    by = closed_by([frame])
    if by == "optimizer_ns":
        return frame["optimizer_ns"].to_numpy() > 0
    return frame["synced"].to_numpy() == 1 if by == "synced" else None


def closed_by(parts: list[pd.DataFrame]) -> str | None:
    """The column that tells where cycles end in the rows of `parts` taken together (one
    frame, or a frame and the rows the reader set apart from it): "optimizer_ns" where some
    micro-steps ran the optimizer and some did not, else "synced" where some synchronized
    gradients and some did not; None when every row is its own step."""
    if "optimizer_ns" in parts[0]:
        opt = [p["optimizer_ns"].to_numpy() > 0 for p in parts]
        every = all(o.all() for o in opt)
        if any(o.any() for o in opt) and not every:
            return "optimizer_ns"
        if every:
            return None
    if "synced" in parts[0]:
        synced = [p["synced"].to_numpy() for p in parts]
        if any((s == 1).any() for s in synced) and any((s == 0).any() for s in synced):
            return "synced"
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
    # the rows are sorted by rank and step: each (rank, cycle) is one run of rows
    starts = np.flatnonzero(first_of_rank | np.r_[True, cycle[1:] != cycle[:-1]])[:rank.size]
    sizes = np.diff(np.r_[starts, rank.size])
    out = {"rank": rank[starts]}
    for c in (c for c in SUMMED if c in frame):
        out[c] = np.add.reduceat(frame[c].to_numpy(), starts) if starts.size else \
            frame[c].to_numpy()[:0]
    if "data_cpu_ns" in out and starts.size:  # one micro-step not measured (-1): unknown
        unknown = np.minimum.reduceat(frame["data_cpu_ns"].to_numpy(), starts) < 0
        out["data_cpu_ns"] = np.where(unknown, -1, out["data_cpu_ns"])
    step = frame["step"].to_numpy()
    out["start_ns"] = _reduce(np.minimum, frame["start_ns"].to_numpy(), starts)
    out["step"] = _reduce(np.maximum, step, starts)
    out["micro_steps"] = sizes.astype(np.int64)
    if "synced" in frame:
        out["synced"] = _reduce(np.maximum, frame["synced"].to_numpy(), starts)
    mapping = pd.DataFrame({"rank": rank, "step": step,
                            "cycle_step": np.repeat(out["step"], sizes)})
    return pd.DataFrame(out), mapping


def _reduce(ufunc, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return ufunc.reduceat(values, starts) if starts.size else values[:0]


def sync_interval(cycles: pd.DataFrame) -> int:
    """Micro-steps per optimizer step: the median over full cycles."""
    counts = cycles["micro_steps"].to_numpy()
    return int(np.median(counts)) if counts.size else 1
