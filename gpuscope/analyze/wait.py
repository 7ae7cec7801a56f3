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
from .groups import dense_unique, find_pairs, small_range


def estimate_wait(frame: pd.DataFrame, warnings: list[str],
                  comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Return `frame` with wait_ns filled (other columns untouched).

    1. keep steps present on every rank that recorded (others get wait 0 and a warning);
    2. per process group (or over all ranks): transfer = min over its ranks of their exposed
       communication in it, for the step;
    3. wait_ns = the sum over groups of each rank's excess, at most its exposed communication
       outside point-to-point.
    """
    frame = frame.copy(deep=False)  # the caller's frame keeps its columns; none is changed
    frame["wait_ns"] = np.zeros(len(frame), dtype=np.int64)
    n_ranks = frame["rank"].nunique()
    if n_ranks < 2 or frame.empty:
        return frame
    steps = frame["step"].to_numpy()
    _, inv, counts = dense_unique(steps)
    complete = counts[inv] == n_ranks
    partial = np.unique(steps[~complete])
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
    """Per frame row, the summed excess over the group minimum of its exposed collectives
    (numpy on a (group, step, rank) grid, or on one sort of the table when the grid would be
    sparse: the table has a row per rank, step and collective key, up to millions)."""
    kinds, groups = key_parts(comm)
    keep = ~mask_of(kinds, is_p2p)
    if not keep.any():
        return None
    # rec.phase("comm") has no group: the ranks that use it form one (-1)
    g = np.where(mask_of(kinds, lambda k: k == "phase")[keep], -1,
                 np.asarray(groups.codes)[keep]).astype(np.int64)
    r = comm["rank"].to_numpy()[keep].astype(np.int64)
    s = comm["step"].to_numpy()[keep].astype(np.int64)
    e = comm["exposed_ns"].to_numpy()[keep].astype(np.int64)
    dense = _dense_waits(g, s, r, e)
    if dense is not None:
        s, r, wait = dense
    else:
        s, r, wait = _sorted_waits(g, s, r, e)
    hit, at = find_pairs(frame["rank"].to_numpy(), frame["step"].to_numpy(), r, s)
    return np.bincount(at[hit], wait[hit], len(frame)).astype(np.int64)


def _dense_waits(g, s, r, e):
    """On a (group, step, rank) grid: each cell's exposed time summed over its collectives, the
    group's members (ranks seen in it at all), and per (group, step) seen on all of them the
    excess over the least. Returns (steps, ranks, wait) of the cells, or None when the grid
    would be much larger than the table (sparse groups, huge step numbers)."""
    g0, s0, r0 = int(g.min()), int(s.min()), int(r.min())
    ng, ns, nr = int(g.max()) - g0 + 1, int(s.max()) - s0 + 1, int(r.max()) - r0 + 1
    cells = ng * ns * nr
    if not small_range(cells, g.size):
        return None
    idx = ((g - g0) * ns + (s - s0)) * nr + (r - r0)
    total = np.bincount(idx, e.astype(np.float64), cells).reshape(ng, ns, nr)
    seen = np.bincount(idx, minlength=cells).reshape(ng, ns, nr) > 0
    members = seen.any(axis=1).sum(axis=1)                     # per group
    full = seen.sum(axis=2) == members[:, None]                # per (group, step)
    low = np.where(seen, total, np.inf).min(axis=2)            # per (group, step)
    wait = np.where(seen & full[:, :, None], total - np.where(full, low, 0)[:, :, None], 0)
    per = wait.sum(axis=0)                                     # per (step, rank), over groups
    any_seen = seen.any(axis=0)
    si, ri = np.nonzero(any_seen)
    return si + s0, ri + r0, per[si, ri]


def _sorted_waits(g, s, r, e):
    """The same on one sort of the table (any numbering)."""
    order = np.lexsort((r, s, g))
    g, s, r, e = g[order], s[order], r[order], e[order]
    # one row per (group, step, rank): its exposed time summed over the group's collectives
    new = np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1]) | (r[1:] != r[:-1])]
    at = np.flatnonzero(new)
    g, s, r, e = g[at], s[at], r[at], np.add.reduceat(e, at)
    # the group's members: the ranks seen in it at all; a step counts when all of them are there
    gu, g_inv = np.unique(g, return_inverse=True)
    g_inv = g_inv.reshape(-1)
    n_r = int(r.max(initial=0)) + 1
    pairs = np.unique(g_inv * n_r + r)  # distinct (group, rank)
    members = np.bincount(pairs // n_r, minlength=gu.size)
    first = np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1])]
    starts = np.flatnonzero(first)
    size = np.diff(np.r_[starts, g.size])
    low = np.minimum.reduceat(e, starts)
    step_of = np.cumsum(first) - 1  # each row's (group, step)
    full = (size == members[g_inv[starts]])[step_of]
    return s, r, np.where(full, e - low[step_of], 0)
