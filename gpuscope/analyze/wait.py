"""Splits exposed communication into waiting for other ranks and moving bytes: one rule for
recorded runs and profiler traces (both readers give the same per-collective table).

For one synchronous collective, the rank that reaches it last waits least, so the shortest
exposed time among the ranks that take part approximates the transfer; each rank's excess is
waiting. Exposed, not the whole duration: waiting hidden behind a rank's own compute costs it
nothing (a DDP bucket's all-reduce that starts early on a fast rank runs beside its backward).
Ranks wait for each other only within a process group, so the comparison is made per collective
key (kind and process group: a data-parallel group of a hybrid layout, DDP's buckets, FSDP's
all-gathers and reduce-scatters apart) and step, between the ranks seen with that key, and only
where every one of them has the same number of instances of it in the step: an instance extra or
missing on one rank (a profiler cycle that cut it, a collective only some ranks issue) leaves
that key out of that step rather than making the rank that lacks it look late. The excess is
summed per rank and capped by its exposed communication outside point-to-point. Point-to-point
communication (pipeline stages) is not in it: a stage waiting on its neighbour is the pipeline's
bubble (`bubble_ns`), judged in bottlenecks/pipeline.py. Steps some ranks lack are reported.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..run_format import is_p2p
from ..runtable import key_codes, key_parts, mask_of
from .rowgroups import count_distinct, dense_unique, find_pairs, small_range


#: `cells` not given: worked out here (None is a result: nothing to compare)
UNSET = object()


def estimate_wait(frame: pd.DataFrame, warnings: list[str],
                  comm: pd.DataFrame | None = None, cells=UNSET, into=None) -> pd.DataFrame:
    """Return `frame` with wait_ns filled (other columns untouched). `cells`: wait_cells(comm),
    when the caller has it (key_waits takes the same). `into`: the memory of the frame's own
    wait_ns column where the caller owns it (prepare.own_column): the waits are written there,
    not into a new column beside it.

    1. keep steps present on every rank that recorded (others get wait 0 and a warning);
    2. per process group (or over all ranks): transfer = min over its ranks of their exposed
       communication in it, for the step;
    3. wait_ns = the sum over groups of each rank's excess, at most its exposed communication
       outside point-to-point.
    """
    frame = frame.copy(deep=False)  # the caller's frame keeps its columns; none is changed
    n_ranks = count_distinct(frame["rank"].to_numpy())
    if n_ranks < 2 or frame.empty:
        frame["wait_ns"] = np.zeros(len(frame), dtype=np.int64)
        return frame
    steps = frame["step"].to_numpy()
    _, inv, counts = dense_unique(steps)
    complete = (counts >= 2)[inv]  # the wait is split among the ranks present in the step
    partial = np.unique(steps[(counts < n_ranks)[inv]])
    del inv
    if len(partial):
        lo, hi = partial.min(), partial.max()
        warnings.append(f"{len(partial)} step(s) ({lo}..{hi}) are missing on some ranks: their "
                        "waiting is split among the ranks present, a lower bound where a missing "
                        "rank was the late one")
    exposed = frame["comm_exposed_ns"].to_numpy()
    if "bubble_ns" in frame:
        exposed = exposed - frame["bubble_ns"].to_numpy()
    grouped, mismatched = _group_waits(frame, comm, cells) if comm is not None else (None, 0)
    if mismatched:
        warnings.append(f"{mismatched} (collective, step) pair(s) have a different number of "
                        "instances on some ranks (a profiler cycle cut one, or only some ranks "
                        "issue it): left out of the wait split")
    if grouped is None:  # no per-collective table: all ranks form one group
        frame["wait_ns"] = np.zeros(len(frame), dtype=np.int64)
        sub = pd.Series(exposed[complete], index=frame.index[complete])
        transfer = sub.groupby(frame.loc[complete, "step"]).transform("min")
        frame.loc[complete, "wait_ns"] = (sub - transfer).astype("int64")
        return frame
    # in place: the grouped excess (a fresh array, >= 0) at most the exposed time where that
    # is positive, 0 in thin steps (min(g, max(e, 0)) = max(min(g, e), 0) for g >= 0)
    wait = np.minimum(grouped, exposed, out=grouped)
    np.maximum(wait, 0, out=wait)
    wait[~complete] = 0
    if into is not None and into.shape == wait.shape and is_column(frame, "wait_ns", into):
        into[:] = wait  # the frame's own column: no second one
    else:
        frame["wait_ns"] = wait.astype(np.int64)
    return frame


def is_column(frame: pd.DataFrame, name: str, arr: np.ndarray) -> bool:
    """Whether `arr` is the memory of frame[name] itself."""
    col = frame[name].to_numpy()
    return col.dtype == arr.dtype and col.shape == arr.shape and \
        col.ctypes.data == arr.ctypes.data


def _group_waits(frame: pd.DataFrame, comm: pd.DataFrame,
                 cells=UNSET) -> tuple[np.ndarray | None, int]:
    """Per frame row, the summed excess over the least of its exposed collectives, key by key
    and step by step; and the number of (key, step) pairs left out for unequal instance
    counts."""
    cells = wait_cells(comm, frame) if cells is UNSET else cells
    if cells is None:
        return None, 0
    _, s, r, wait, mismatched, _ = cells
    hit, at = find_pairs(frame["rank"].to_numpy(), frame["step"].to_numpy(), r, s)
    if not hit.all():
        at, wait = at[hit], wait[hit]
    return np.bincount(at, wait, len(frame)), mismatched  # (float: whole ns, summed exactly)


def key_waits(comm: pd.DataFrame | None, cells=UNSET) -> pd.DataFrame | None:
    """rank, step, key (categorical), wait_ns: each rank's waiting inside each collective key
    (kind and process group) and step, by the rule above (point-to-point left out); None when
    the table has nothing to compare. What comm_groups.py sums per process group and mesh
    dimension. `cells`: wait_cells(comm), when the caller has it."""
    if comm is None or comm.empty:
        return None
    cells = wait_cells(comm) if cells is UNSET else cells
    if cells is None:
        return None
    g, s, r, wait, _, names = cells
    # the cells' own rank and step arrays (often the collectives' columns, read-only): no copies
    return pd.DataFrame({"rank": r, "step": s,
                         "key": pd.Categorical.from_codes(g, categories=names),
                         "wait_ns": wait.astype(np.int64)}, copy=False)


def wait_cells(comm: pd.DataFrame | None, frame: pd.DataFrame | None = None,
               warm: pd.DataFrame | None = None):
    """(key codes, steps, ranks, wait, mismatched pairs, key names) per (key, step, rank) cell
    of the table outside point-to-point (numpy on a (key, step, rank) grid, or on one sort of
    the table when the grid would be sparse: the table has a row per rank, step and key, up to
    millions); None when it holds only point-to-point, or there is no table.

    `frame`: the step rows, which say which ranks recorded each step: a key's step is compared
    among the members that recorded it (a rank whose file ends early, or that lost a few rows,
    leaves its peers' waiting split among themselves), where without it every member must have
    the key in the step. `warm`: rows the reader set apart from `frame` (RunTable.warm): they
    recorded their steps too."""
    if comm is None or comm.empty:
        return None
    kinds, _ = key_parts(comm)
    keep = ~mask_of(kinds, is_p2p)
    if not keep.any():
        return None
    codes, names = key_codes(comm)
    every = bool(keep.all())  # no point-to-point: the columns as they are, no copies

    def col(values, dtype=np.int64):
        return np.asarray(values if every else values[keep]).astype(dtype, copy=False)

    # the key codes as they are (int8 for a few keys): the grid's index is made in int64 below
    g = col(np.asarray(codes), np.asarray(codes).dtype)
    r, s = col(comm["rank"].to_numpy()), col(comm["step"].to_numpy())
    e = col(comm["exposed_ns"].to_numpy())
    c = col(comm["count"].to_numpy()) if "count" in comm else np.ones(g.size, np.int64)
    have = None if frame is None else [
        (p["rank"].to_numpy(np.int64), p["step"].to_numpy(np.int64))
        for p in ([frame] if warm is None else [frame, warm])]
    found = _dense_waits(g, s, r, e, c, have)
    if found is None:
        found = _sorted_waits(g.astype(np.int64, copy=False), s, r, e, c, have)
    elif found[0] is g and every:  # the rows' own codes, not their row-long int64 copy
        found = (np.asarray(codes), *found[1:])
    return (*found, [str(n) for n in names])


def _dense_waits(g, s, r, e, c, have=None):
    """On a (key, step, rank) grid: each cell's exposed time and instance count summed, the
    key's members (ranks seen with it at all), and per (key, step) seen on all of them with one
    count the excess over the least. Returns (keys, steps, ranks, wait, mismatched pairs) of the
    cells (in the rows' order when each row is a cell of its own, else the grid's), or None when
    the grid would be much larger than the table (sparse keys, huge step numbers)."""
    g0, s0, r0 = int(g.min()), int(s.min()), int(r.min())
    ng, ns, nr = int(g.max()) - g0 + 1, int(s.max()) - s0 + 1, int(r.max()) - r0 + 1
    cells = ng * ns * nr
    if not small_range(cells, g.size):
        return None
    idx = np.subtract(g, g0, dtype=np.int64)  # ((g - g0) * ns + s - s0) * nr + r - r0,
    idx *= ns                                  # in one array (no row-long temporaries)
    idx += s
    idx -= s0
    idx *= nr
    idx += r
    idx -= r0
    seen = np.zeros(cells, bool)
    seen[idx] = True
    seen = seen.reshape(ng, ns, nr)
    member = seen.any(axis=1)                                  # (key, rank)
    if have is None:  # every member of the key, in every step
        expected = np.broadcast_to(member.sum(axis=1)[:, None], (ng, ns))
    else:  # the members that recorded the step (or had the key in it)
        has = np.zeros((ns, nr), bool)
        for hr, hs in have:  # the frame's rows, and any the reader set apart
            ok = (hs >= s0) & (hs < s0 + ns) & (hr >= r0) & (hr < r0 + nr)
            at = np.subtract(hs if ok.all() else hs[ok], s0, dtype=np.int64)  # the flat (step,
            at *= nr                                                         # rank) of each
            np.add(at, hr if ok.all() else hr[ok], out=at)                   # row, in one array
            at -= r0
            has.reshape(-1)[at] = True
            del at, ok
        expected = (member[:, None, :] & (has[None, :, :] | seen)).sum(axis=2)
    got = seen.sum(axis=2)
    present = (got == expected) & (got >= 2)                   # (key, step)
    if int(seen.sum()) == idx.size:  # a cell per row: placed, not summed (no float copy of e)
        total = np.zeros(cells)
        total[idx] = e
        total = total.reshape(ng, ns, nr)
    else:
        total = np.bincount(idx, e, cells).reshape(ng, ns, nr)
    if int(seen.sum()) == idx.size and c.size and c.min() == c.max():
        same = np.ones((ng, ns), bool)  # a cell per row, all of one count: counts agree
    else:
        count = np.bincount(idx, c.astype(np.float64), cells).reshape(ng, ns, nr)
        same = (np.where(seen, count, np.inf).min(axis=2)
                == np.where(seen, count, -np.inf).max(axis=2))
        del count
    full = present & same
    mismatched = int((present & ~same).sum())
    np.copyto(total, np.inf, where=~seen)  # only the seen cells are read below
    low = total.min(axis=2)                                    # per (key, step)
    if int(seen.sum()) == idx.size:  # a cell per row: the cells are the rows, in their order
        pair = np.floor_divide(idx, nr, out=idx)  # each row's (key, step), in place
        del total, seen, idx
        wait = low.reshape(-1)[pair]  # each row's excess over its (key, step)'s least, in place
        np.subtract(e, wait, out=wait)
        wait[~full.reshape(-1)[pair]] = 0
        return g, s, r, wait, mismatched
    flat = np.flatnonzero(seen)
    pair = flat // nr                                          # each cell's (key, step)
    wait = np.where(full.reshape(-1)[pair], total.reshape(-1)[flat] - low.reshape(-1)[pair], 0)
    gi, si = np.divmod(pair, ns)
    return gi + g0, si + s0, flat % nr + r0, wait, mismatched


def _sorted_waits(g, s, r, e, c, have=None):
    """The same on one sort of the table (any numbering)."""
    order = np.lexsort((r, s, g))
    g, s, r, e, c = g[order], s[order], r[order], e[order], c[order]
    # one row per (key, step, rank): its exposed time and count summed over its instances
    new = np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1]) | (r[1:] != r[:-1])]
    at = np.flatnonzero(new)
    g, s, r, e, c = g[at], s[at], r[at], np.add.reduceat(e, at), np.add.reduceat(c, at)
    # the key's members: the ranks seen with it at all; a step counts when all of them are
    # there with the same number of instances
    gu, g_inv = np.unique(g, return_inverse=True)
    g_inv = g_inv.reshape(-1)
    n_r = int(r.max(initial=0)) + 1
    pairs = np.unique(g_inv * n_r + r)  # distinct (key, rank)
    members = np.bincount(pairs // n_r, minlength=gu.size)
    first = np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1])]
    starts = np.flatnonzero(first)
    size = np.diff(np.r_[starts, g.size])
    low = np.minimum.reduceat(e, starts)
    expected = members[g_inv[starts]]
    if have is not None:  # no more than the ranks that recorded the step (see wait_cells)
        hr = np.concatenate([p[0] for p in have])
        hs = np.concatenate([p[1] for p in have])
        span = max(n_r, int(hr.max(initial=0)) + 1)
        steps_ranks = np.unique(np.concatenate([hs * span + hr, s * span + r]))
        per_step, counts_ = np.unique(steps_ranks // span, return_counts=True)
        at = np.searchsorted(per_step, s[starts])
        expected = np.minimum(expected, counts_[np.minimum(at, per_step.size - 1)])
    present = (size == expected) & (size >= 2)
    same = np.minimum.reduceat(c, starts) == np.maximum.reduceat(c, starts)
    step_of = np.cumsum(first) - 1  # each row's (key, step)
    full = (present & same)[step_of]
    return g, s, r, np.where(full, e - low[step_of], 0), int((present & ~same).sum())
