"""Splits exposed communication into waiting for other ranks and moving bytes.

For one synchronous step, the rank that reaches the collective last waits least, so the shortest
exposed communication across ranks approximates the transfer; each rank's excess is waiting.
Steps are matched across ranks by step index; steps some ranks lack are reported.
"""

from __future__ import annotations

import pandas as pd


def estimate_wait(frame: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Return `frame` with wait_ns filled from comm_exposed_ns (other columns untouched).

    1. keep steps present on every rank that recorded (others get wait 0 and a warning);
    2. transfer = min over ranks of comm_exposed_ns for the step;
    3. wait_ns = comm_exposed_ns - transfer.
    """
    frame = frame.copy()
    frame["wait_ns"] = 0
    n_ranks = frame["rank"].nunique()
    if n_ranks < 2 or frame.empty:
        return frame
    per_step = frame.groupby("step")["rank"].transform("size")
    complete = per_step == n_ranks
    partial = frame.loc[~complete, "step"].unique()
    if len(partial):
        lo, hi = partial.min(), partial.max()
        warnings.append(f"{len(partial)} step(s) ({lo}..{hi}) are missing on some ranks "
                        "(mismatched step counts); waiting is not estimated for them")
    sub = frame.loc[complete]
    transfer = sub.groupby("step")["comm_exposed_ns"].transform("min")
    frame.loc[complete, "wait_ns"] = (sub["comm_exposed_ns"] - transfer).astype("int64")
    return frame
