"""The preparation pass: the run table made ready for the bottleneck passes. Steps of no length
are left out; ranks that stopped early are found; with gradient accumulation the micro-steps are
summed into optimizer steps; warm-up steps are dropped; exposed communication is split into
waiting and transfer (the one wait split of both sources, wait.py); how forward grows with the
batch and the micro-step statistics are kept for the estimates.

Order matters once: with accumulation, waits are split per micro-step (a micro-step that syncs
is where ranks wait) before the micro-steps are summed; without it, the warm-up is dropped first.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..errors import InputError
from ..runtable import RunTable
from .cycles import cycle_ends, group_cycles, sync_interval
from .ddp_share import ddp_knobs
from .rowgroups import count_distinct, dense_unique, step_by_rank, warm_rows
from .stopped import stopped_ranks, stopped_warnings
from .wait import estimate_wait, is_column, wait_cells
from .warm_split import split_holds, thin_of, whole as with_warm_rows
from .passes import declares
from .whatif import batch_growth, micro_steps


def drop_warmup(frame: pd.DataFrame, n: int, warnings: list[str],
                int_block: tuple | None = None) -> pd.DataFrame:
    """Leave out the first `n` steps of each rank (all of them kept, with a warning, when that
    would leave nothing). `int_block`: the frame's int columns as one writable block
    (RunTable.int_block) that may be written over: the kept rows are then moved up inside it
    instead of copied (the frame given is not valid afterwards)."""
    if n <= 0 or frame.empty:
        return frame
    keep = ~warm_rows(frame, n)
    if not keep.any():
        warnings.append(f"only {frame['step'].nunique()} step(s): warm-up steps kept in the analysis")
        return frame
    moved = compacted(frame, keep, int_block) if int_block is not None else None
    return moved if moved is not None else frame[keep]


def compacted(frame: pd.DataFrame, keep: np.ndarray, int_block: tuple) -> pd.DataFrame | None:
    """frame[keep], its int block's rows moved up in place (each column's kept values to its
    front: a row never moves down, so one column at a time is safe) and the frame made again on
    the block's first rows; the other columns are copied. None when the block is not the
    frame's (a reader's later step copied it)."""
    block, names = int_block
    cols = list(frame.columns)
    if block.shape != (len(names), len(frame)) or not block.flags.writeable or \
            not set(names) <= set(cols):
        return None
    for name, row in zip(names, block):
        if frame[name].to_numpy().ctypes.data != row.ctypes.data:
            return None
    k = int(keep.sum())
    others = {c: frame[c].to_numpy()[keep] for c in cols if c not in names}
    _move_up(block, keep, k)
    out = pd.DataFrame(block[:, :k].T, columns=list(names), copy=False)
    for c in cols:  # the other columns where they were
        if c in others:
            out.insert(cols.index(c), c, others[c])
    return out


#: the kept rows are moved a run at a time where runs are this long on average or more
RUN_MOVE_MIN = 64


def _move_up(block: np.ndarray, keep: np.ndarray, k: int) -> None:
    """Each row of `block` with its `keep` values moved to its front (k of them). Where the
    kept rows lie in long runs (a rank's rows after its warm-up), each run moves as one slice
    of all the rows (no copy of a column's kept values, each value read and written once);
    else one column at a time by the mask."""
    edges = np.flatnonzero(np.diff(keep.view(np.int8), prepend=0, append=0))
    starts, ends = edges[0::2].tolist(), edges[1::2].tolist()
    if len(starts) * RUN_MOVE_MIN > k:
        for row in block:
            row[:k] = row[keep]
        return
    at = 0
    for a, b in zip(starts, ends):
        if a != at:  # a move to the left: numpy copies overlapping slices as memmove does
            block[:, at:at + b - a] = block[:, a:b]
        at += b - a


def own_column(frame: pd.DataFrame, int_block: tuple, name: str) -> np.ndarray | None:
    """The writable block row that frame[name] is (its first len(frame) values), or None."""
    block, names = int_block
    if name not in names or name not in frame or not block.flags.writeable:
        return None
    row = block[list(names).index(name), :len(frame)]
    return row if is_column(frame, name, row) else None


def growth(frame: pd.DataFrame, knobs: dict, warmup: int) -> dict:
    """{m: how forward grows for m x the batch}, where the run had batches of another size."""
    bs = knobs.get("batch_size")
    if not isinstance(bs, int) or "samples" not in frame:
        return {}
    return {m: g for m in (2, 4) if (g := batch_growth(frame, bs, m, warmup)) is not None}


def to_cycles(frame: pd.DataFrame, ends, warnings: list[str]):
    """Micro-steps summed into optimizer steps; returns (frame, micro-step -> cycle map)."""
    cycles, mapping = group_cycles(frame, ends)
    last = cycles.groupby("rank")["step"].transform("max") == cycles["step"]
    partial = last & (cycles["micro_steps"] < sync_interval(cycles))
    if partial.any() and (~partial).any():
        warnings.append(f"the last {int(cycles.loc[partial, 'micro_steps'].max())} micro-step(s) "
                        "did not complete an optimizer step and are left out")
        cycles = cycles[~partial].reset_index(drop=True)
    return cycles, mapping


def without_empty_steps(table: RunTable, warnings: list[str]) -> RunTable:
    """The table less its steps of no length (nothing in them adds up to anything: said)."""
    frame = table.frame
    if frame.empty:
        raise InputError(f"{table.path}: no steps to analyse (the run recorded none)")
    empty = frame["step_ns"].to_numpy() <= 0
    if not empty.any():
        return table
    warnings.append(f"{int(empty.sum())} step(s) of no length (a cut trace, a damaged row) "
                    "left out")
    frame = frame[~empty].reset_index(drop=True)
    if frame.empty:
        raise InputError(f"{table.path}: no steps to analyse (every step has no length)")
    return replace(table, frame=frame)


@declares("table th own warnings",
          "table frame knobs stopped missing mapping micro growth last_steps wait_cells warnings")
def prepare(a) -> None:
    """The pass (run.Analysis -> its table, frame, knobs, stopped ranks, cycle map, micro-step
    statistics and batch growth). Where the reader set each rank's warm-up apart already
    (RunTable.warm) and that is what leaving it out here gives (warm_split.split_holds), the
    steps below that would not change anything are skipped; else those rows are put back."""
    split = split_holds(a.table, a.th.warmup_steps, a.own)
    if not split:
        a.table = with_warm_rows(a.table)
        a.table = without_empty_steps(a.table, a.warnings)  # (split: none, over both parts)
    a.knobs = a.table.knobs()
    a.knobs.update(ddp_knobs(a.table.ranks))  # what DDP's own logging says backward hid
    if not a.knobs.get("world_size") and a.table.world_size:
        # a trace's knobs lack it: what the traces hold (distributedInfo, the rank files read)
        a.knobs["world_size"] = int(a.table.world_size)
    a.stopped, a.missing = stopped_ranks(a.table)
    a.warnings += stopped_warnings(a.stopped)
    whole = a.table.frame
    a.last_steps = step_by_rank(whole, "max")
    if not split:  # (split: none, over both parts)
        a.table = without_thin_steps(a.table, a.warnings)
    frame, warmup = a.table.frame, a.th.warmup_steps
    ends = cycle_ends(frame) if not split else None
    # the wait split's cells (here and in key_waits), each step among the ranks that recorded it
    a.wait_cells = wait_cells(a.table.comm, frame, a.table.warm.frame if split else None)
    if ends is not None:  # accumulation: waits per micro-step, then optimizer steps
        frame = estimate_wait(frame, a.warnings, a.table.comm, a.wait_cells)
        clean = without_profiler_writes(frame, a.table, [])  # the micro-step statistics'
        a.micro = micro_steps(clean, max(warmup, 1))
        a.growth = growth(clean, a.knobs, max(warmup, 1))
        frame, a.mapping = to_cycles(frame, ends, a.warnings)
        # the optimizer steps a profiler wrote its trace in (seen: 1-2 s in one micro-step of
        # 23 cycles, 40% of the mean step and a straggler's excess "mostly in other")
        frame = without_profiler_writes(frame, a.table, a.warnings, a.mapping)
        frame = drop_warmup(frame, warmup, a.warnings)
        a.knobs["sync_interval"] = sync_interval(frame)
    else:
        frame = without_profiler_writes(without_counted_step(frame, a.knobs), a.table,
                                        a.warnings)
        into = None
        if split:  # the warm-up was left out as the files were read
            into = own_column(frame, a.table.int_block, "wait_ns")
            a.table = replace(a.table, frame=frame, int_block=None, warm=None)
        elif a.own and frame is a.table.frame and a.table.int_block is not None:
            # the table is the analysis's own (read for it): the warm-up is left out in place,
            # the waits written into its own column, and the table keeps the analysed frame
            # instead of the one it was read with
            frame = drop_warmup(frame, warmup, a.warnings, a.table.int_block)
            into = own_column(frame, a.table.int_block, "wait_ns")
            a.table = replace(a.table, frame=frame, int_block=None)
        else:
            frame = drop_warmup(frame, warmup, a.warnings)
        frame = estimate_wait(frame, a.warnings, a.table.comm, a.wait_cells, into)
        a.growth = growth(frame, a.knobs, 0)
    a.frame = frame


def without_thin_steps(table: RunTable, warnings: list[str]) -> RunTable:
    """The table less the steps only one rank, or fewer than half its ranks, recorded (a rank's
    file cut, a dead rank's peers' last flush): nobody there to compare a rank's waiting with,
    so its waiting would count as transfer, and flip the verdict of the steps still whole.
    Said."""
    frame = table.frame
    n = count_distinct(frame["rank"].to_numpy())
    if n < 2:
        return table
    steps = frame["step"].to_numpy()
    _, inv, counts = dense_unique(steps)
    thin = thin_of(counts, n)  # per step
    if not thin.any() or thin.all():
        return table
    thin = thin[inv]  # per row
    left = np.unique(steps[thin])
    warnings.append(f"{len(left)} step(s) ({left.min()}..{left.max()}) recorded by one rank or "
                    f"fewer than half of the {n} (a rank's file ends earlier, or lost rows) are "
                    "left out: their waiting cannot be told from transfer")
    return replace(table, frame=frame[~thin].reset_index(drop=True), int_block=None)


def without_profiler_writes(frame, table: RunTable, warnings: list[str], mapping=None):
    """The frame less the steps in which a torch.profiler beside the recording wrote its trace
    (the recorder notes them: profiler_trace_steps): hundreds of ms of the profiler's own work
    between two steps, not the training's. `mapping` (to_cycles'): the frame's rows are
    optimizer steps, and the ones holding such a micro-step go. Kept when nothing else would be
    left; said."""
    drop = {(r, s) for r, info in table.ranks.items()
            for s in info.knobs.get("profiler_trace_steps") or ()}
    if drop and mapping is not None and len(mapping):
        hit = pd.Series(list(zip(mapping["rank"], mapping["step"]))).isin(drop).to_numpy()
        drop = set(zip(mapping["rank"].to_numpy()[hit].tolist(),
                       mapping["cycle_step"].to_numpy()[hit].tolist()))
    if not drop or frame.empty:
        return frame
    keep = ~pd.Series(list(zip(frame["rank"], frame["step"])), index=frame.index).isin(drop)
    if keep.all() or not keep.any():
        return frame
    steps = sorted({s for _, s in drop})
    warnings.append(f"step(s) {', '.join(map(str, steps[:8]))}{' ...' if len(steps) > 8 else ''}"
                    " left out: a torch.profiler beside the recording wrote its trace in them")
    return frame[keep.to_numpy()].reset_index(drop=True)


def without_counted_step(frame, knobs: dict):
    """The frame less the micro-step whose FLOPs were counted (record(count_flops=True)): every
    op went through Python in it, so it is slower than the others, on every rank alike. Kept
    when nothing else would be left."""
    n = knobs.get("flops_counted_step")
    if not isinstance(n, int) or isinstance(n, bool):
        return frame
    keep = frame["step"] != n
    return frame[keep].reset_index(drop=True) if keep.sum() and not keep.all() else frame
