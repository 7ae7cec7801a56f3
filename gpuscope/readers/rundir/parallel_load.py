"""The rank files read in two processes where there are many (a forked child decodes its share
into a shared arena: fork.py), else one by one; their rows placed in one row block
(rowblock.py) that spills to disk past what memory holds."""

from __future__ import annotations

import os

import numpy as np

import gpuscope.progress as progress
from ..._log import logger
from ...errors import TraceFormatError
from ...trace_files import file_size
from ..speed import forks
from ..record_body import BLOCK_ROWS, block_columns
from ..readahead import Ahead, advise_record
from .rank_data import RankFile
from .rank_file import load_rank_file


#: read files in two processes from this many files or bytes on (fork: a second core)
PARALLEL_MIN_FILES = 64


PARALLEL_MIN_BYTES = 32 << 20


CHILD_SHARE = 0.45  # of the bytes: it also copies what it read into the shared arena


ARENA_PER_BYTE = 4  # bytes of columns per byte of file, at most (see load_all)


def _child_cut(sizes: list[int]) -> int:
    """How many of the files (their sizes, in order) the child process reads: the first ones,
    up to CHILD_SHARE of the bytes (it also copies its collectives into the shared arena, so it
    takes a little less)."""
    total, acc = sum(sizes), 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= CHILD_SHARE * total:
            return i + 1
    return len(sizes)


def _row_block(n_rows: int, spill, warnings: list[str]):
    """One block for every file's step rows: in a file under `spill` where the plan spills
    (held in memory instead when that file cannot be made, and said), else in memory; None
    when it cannot be mapped at all (each file then its own arrays)."""
    from ..rowblock import RowBlock

    for where in (spill, None) if spill is not None else (None,):
        try:
            return RowBlock(n_rows, where)
        except OSError as exc:
            if where is not None:  # a full disk: the table stays in memory, and that is said
                warnings.append(f"the step table could not be kept in a file under {where} "
                                f"({exc.strerror or exc}): it is held in memory")
        except (ValueError, OverflowError):  # no room to map it: each file its own arrays
            return None
    return None


def _load_files(batch: list[str], scale: float = 1.0, region=None,
                sizes: list[int] | None = None, warm: int = 0) -> list:
    """(name, RankFile or the TraceFormatError) per file of `batch`, read in this process.
    `scale`: each file counted that many times on the bar (the child reads meanwhile); a
    region filled from its right end takes the files last to first. `sizes`: the files'
    bytes, in batch order, where the caller has them."""
    down = region is not None and region.downward
    out = []
    order = list(reversed(batch) if down else batch)
    sizes = [file_size(n) for n in batch] if sizes is None else list(sizes)
    if down:
        sizes.reverse()
    # the disk asked for the next files while one is decoded: a record file and its side
    # file (about as large) each, or the side file and the record file's head (advise_record)
    ahead = Ahead(order, [2 * b for b in sizes], ask=advise_record)
    for i, name in enumerate(order):
        ahead.before(i)
        try:
            out.append((name, load_rank_file(name, region, warm)))
        except TraceFormatError as exc:
            out.append((name, exc))
        progress.advance(int(sizes[i] * scale))
    return out[::-1] if down else out


def load_all(names: list[str], warnings: list[str], warm: int = 0) -> tuple[list, tuple | None]:
    """(name, RankFile or the TraceFormatError) per file, and (the RowBlock their columns were
    written into, its regions) or None; a big run dir is read by two processes (the child takes
    the first files), anything unexpected falls back to one. A run dir that may need more
    memory than is available says so first (`warnings`, and the log, before it is read)."""
    from ..fork import SharedArena, in_child
    from ..rowblock import Region, memory_plan, rows_bound, side_rows_bound

    big = len(names) >= PARALLEL_MIN_FILES or (
        len(names) >= 2 and sum(file_size(n) for n in names) >= PARALLEL_MIN_BYTES)
    if not big:
        return _load_files(names), None
    sides = [side_rows_bound(n) for n in names]
    # files without a side file are not counted: their JSON's bound is too loose to warn on
    too_big, spill = memory_plan(sum(b for b in sides if b is not None), shared=forks())
    if too_big is not None:  # said before reading: the analysis may be stopped for memory
        logger.warning("gpuscope: %s: %s", os.path.dirname(names[0]) or ".", too_big)
        warnings.append(too_big)
    if not forks():
        return _load_files(names), None
    sizes = [file_size(n) for n in names]
    cut = _child_cut(sizes)
    theirs, mine = names[:cut], names[cut:]
    share = sum(sizes[cut:]) / max(sum(sizes), 1)
    # the child's collectives come back through shared memory: a row of the file takes at
    # least 32 bytes, a collective at least 12 and gives 40
    try:
        arena = SharedArena(ARENA_PER_BYTE * sum(sizes[:cut]) + (1 << 20), spill)
    except (OSError, ValueError, OverflowError):  # no room to map it: pickled through the pipe
        arena = SharedArena(0)
    bounds = [b if b is not None else rows_bound(n) for n, b in zip(names, sides)]
    rows = _row_block(sum(bounds), spill, warnings)
    # the child's region fills leftwards from the parent's: they meet with no gap to close
    regions = ([Region(rows, 0, sum(bounds[:cut]), downward=True),
                Region(rows, sum(bounds[:cut]), sum(bounds[cut:]))]
               if rows is not None else [None, None])

    def child():
        out = []
        for name, got in _load_files(theirs, region=regions[0], sizes=sizes[:cut], warm=warm):
            if rows is not None and isinstance(got, RankFile):
                got.block = rows.marker(got.block)
            out.append((name, _packed(got, arena.put)))
        return out, regions[0].used if regions[0] is not None else 0

    with in_child(child) as collect:
        # the bar tracks the parent's half
        done = _load_files(mine, 1.0 / max(share, 1e-9), regions[1], sizes[cut:], warm)
        status, value = collect()
    if status == "ok":
        value, used = value
        if regions[0] is not None:
            regions[0].used = used  # what the child wrote into its region
        for name, got in value:
            got = _packed(got, arena.get)
            if rows is not None and isinstance(got, RankFile) and got.block is not None:
                got.block = rows.view(got.block)
                got.frame = {**block_columns(got.block), **(got.frame or {})}
            done.append((name, got))
    else:
        if regions[0] is not None:
            regions[0].used = 0
        done += _load_files(theirs, 0.0, regions[0], sizes[:cut], warm)
    order = {n: i for i, n in enumerate(names)}
    return sorted(done, key=lambda item: order[item[0]]), (
        (rows, regions) if rows is not None else None)


def _packed(got, move):
    """A RankFile with each array of its columns passed through `move` (into or out of the
    shared arena); an error as it is. A block moves once, as a whole (the frame's views of it
    are made again where it arrives); one already placed (rowblock.InBlock) as it is."""
    if isinstance(got, RankFile):
        if got.block is not None and got.frame is not None:
            got.block = move(got.block)
            rest = {k: move(v) for k, v in got.frame.items() if k not in BLOCK_ROWS}
            got.frame = ({**block_columns(got.block), **rest}
                         if isinstance(got.block, np.ndarray) else rest)
        elif got.frame is not None:
            got.frame = {k: move(v) for k, v in got.frame.items()}
        if got.comm is not None:
            got.comm = tuple(move(v) for v in got.comm)
        if got.warm is not None:
            got.warm = {k: move(v) for k, v in got.warm.items()}
    return got
