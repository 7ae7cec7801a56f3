"""Splits exposed communication into waiting for other ranks and moving bytes.

For one synchronous collective, the rank that reaches it last waits least, so the shortest
exposed communication among the ranks that take part approximates the transfer; each rank's
excess is waiting. Ranks wait for each other only within a process group: with the recorder's
per-collective table, the split is made group by group (a data-parallel group of a hybrid
layout, DDP's buckets, ...) and summed per rank; without it, over all ranks. Point-to-point
communication (pipeline stages) is not in it: a stage waiting on its neighbour is the pipeline's
bubble (`bubble_ns`), judged in pipeline.py. Steps some ranks lack are reported.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..record_format import is_p2p
from ..runtable import key_parts, mask_of


def estimate_wait(frame: pd.DataFrame, warnings: list[str],
                  comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Return `frame` with wait_ns filled (other columns untouched).

    1. keep steps present on every rank that recorded (others get wait 0 and a warning);
    2. per process group (or over all ranks): transfer = min over its ranks of their exposed
       communication in it, for the step;
    3. wait_ns = the sum over groups of each rank's excess, at most its exposed communication
       outside point-to-point.
    """
    frame = frame.copy()
    frame["wait_ns"] = 0
    n_ranks = frame["rank"].nunique()
    if n_ranks < 2 or frame.empty:
        return frame
    per_step = frame.groupby("step")["rank"].transform("size")
    complete = (per_step == n_ranks).to_numpy()
    partial = frame.loc[~complete, "step"].unique()
    if len(partial):
        lo, hi = partial.min(), partial.max()
        warnings.append(f"{len(partial)} step(s) ({lo}..{hi}) are missing on some ranks "
                        "(mismatched step counts); waiting is not estimated for them")
    bubble = frame["bubble_ns"].to_numpy() if "bubble_ns" in frame else 0
    exposed = frame["comm_exposed_ns"].to_numpy() - bubble
    grouped = _group_waits(frame, comm) if comm is not None else None
    if grouped is None:  # no per-collective table: all ranks form one group
        sub = pd.Series(exposed[complete], index=frame.index[complete])
        transfer = sub.groupby(frame.loc[complete, "step"]).transform("min")
        frame.loc[complete, "wait_ns"] = (sub - transfer).astype("int64")
        return frame
    wait = np.minimum(grouped, np.maximum(exposed, 0))
    frame["wait_ns"] = np.where(complete, wait, 0).astype("int64")
    return frame


def _group_waits(frame: pd.DataFrame, comm: pd.DataFrame) -> np.ndarray | None:
    """Per frame row, the summed excess over the group minimum of its exposed collectives."""
    kinds, groups = key_parts(comm)
    keep = ~mask_of(kinds, is_p2p)
    if not keep.any():
        return None
    c = comm.loc[keep, ["rank", "step", "exposed_ns"]].copy()
    # rec.phase("comm") has no group: the ranks that use it form one (-1)
    c["group"] = np.where(mask_of(kinds, lambda k: k == "phase")[keep], -1,
                          np.asarray(groups.codes)[keep])
    members = c.groupby("group")["rank"].nunique()
    per = c.groupby(["group", "step", "rank"])["exposed_ns"].sum().reset_index()
    size = per.groupby(["group", "step"])["rank"].transform("size")
    per = per[size.to_numpy() == members.reindex(per["group"]).to_numpy()]  # every member there
    per["wait"] = per["exposed_ns"] - per.groupby(["group", "step"])["exposed_ns"].transform("min")
    total = per.groupby(["rank", "step"])["wait"].sum()
    idx = pd.MultiIndex.from_arrays([frame["rank"].to_numpy(), frame["step"].to_numpy()])
    return total.reindex(idx).fillna(0).to_numpy(np.int64)
