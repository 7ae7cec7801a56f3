"""The warm-up left out as the files are read, where the analysis asks (read_path(warm=N)).

A big run dir's rows go into one block (rowblock.RowBlock), rank after rank, and the analysis
leaves each rank's first N rows out (its warm-up). Moved up afterwards, every row of the block
is read and written again: at 10,000 ranks x 10,000 steps, a 16 GB block in a file, 23 s of
the analysis. Here each file's first N rows are set apart while they are still in the cache
(its kept rows written where the region's next file starts), so the block holds the kept rows
only, in order, and the table carries the set-apart rows beside it (RunTable.warm).

The analysis uses the split only where leaving those rows out first cannot change what it
finds (analyze/prepare.py: the same warm-up, no thin or empty steps, no accumulation, no
profiler steps); anywhere else it asks for the whole table back (WarmRows.merge), as the
reader would have made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from .record_body import BLOCK_ROWS, block_columns


@dataclass
class WarmRows:
    """Each rank's first `steps` rows, left out of the table's frame by the reader."""

    frame: pd.DataFrame   # those rows, rank after rank, the frame's columns
    steps: int            # how many per rank
    #: (kept frame) -> (the whole frame, its int block (RunTable.int_block) or None)
    merge: Callable


def split_file(got, region, n: int) -> bool:
    """Set a file's first `n` rows apart (got.warm: {"block": their BLOCK_ROWS x n copy, and
    "samples" where the file has them}: one array to pass between processes) and keep the rest in
    its region, where the region's next rows start (a move of this file's rows only, in the
    cache). Only a file whose rows are in the region, in step order, with more than `n` of
    them; False (the file as it is) otherwise."""
    block = got.block
    if block is None or got.frame is None or not region.block.holds(block) or \
            region.block.offset_of(block) != region._at(block.shape[1]):
        return False
    total = block.shape[1]
    steps = block[1]
    if total <= n or not bool((steps[1:] > steps[:-1]).all()):
        return False
    warm = {"block": block[:, :n].copy()}
    samples = got.frame.get("samples")
    if samples is not None:
        warm["samples"] = np.array(samples[:n])
    kept = total - n
    if region.downward:  # filled right to left: its kept rows already end where they should
        view = block[:, n:]
    else:  # left to right: moved to the region's next column (memmove: overlap safe)
        view = block[:, :kept]
        view[...] = block[:, n:]  # (numpy copies overlapping slices as memmove does)
    got.block, got.warm = view, warm
    got.frame = {**block_columns(view), **({"samples": np.array(samples[n:])}
                                            if samples is not None else {})}
    return True


def unsplit(got) -> None:
    """A file's set-apart rows put back in front of its kept ones (its own arrays)."""
    warm = getattr(got, "warm", None)
    if warm is None:
        return
    cols = warm_columns(warm)
    got.frame = {k: np.concatenate([cols[k], np.asarray(v)]) if k in cols else v
                 for k, v in got.frame.items()}
    got.block, got.warm = None, None


def warm_columns(warm: dict) -> dict:
    """A file's set-apart rows as {column: values}."""
    return {**block_columns(warm["block"]),
            **({"samples": warm["samples"]} if "samples" in warm else {})}


def warm_frame(warms: list[dict], columns: list[str]) -> pd.DataFrame:
    """The set-apart rows of every file, in file order, with the kept frame's columns (its
    wait_ns zeros, as the reader's)."""
    block = np.concatenate([w["block"] for w in warms], axis=1)
    out = dict(zip(BLOCK_ROWS, block))
    out["wait_ns"] = np.zeros(block.shape[1], np.int64)
    if "samples" in columns:
        out["samples"] = np.concatenate([w["samples"] if "samples" in w else
                                         np.full(w["block"].shape[1], -1, np.int64)
                                         for w in warms])
    return pd.DataFrame({c: out[c] for c in columns}, columns=columns)


def merged(kept: pd.DataFrame, warm: pd.DataFrame, names: list[str], make_block
           ) -> tuple[pd.DataFrame, tuple]:
    """The whole frame, each rank's set-apart rows in front of its kept ones, as the reader
    would have made it: its int columns `names` in one block from `make_block(rows, n)` (in a
    file where the table's was), the other columns beside. Both frames are sorted by rank
    and hold the same ranks."""
    kr, wr = kept["rank"].to_numpy(), warm["rank"].to_numpy()
    ranks, k_counts = np.unique(kr, return_counts=True)
    w_ranks, w_counts = np.unique(wr, return_counts=True)
    if not np.array_equal(ranks, w_ranks):
        raise ValueError("the set-apart rows' ranks are not the table's")
    offset = np.cumsum(k_counts + w_counts) - (k_counts + w_counts)
    w_pos = np.repeat(offset, w_counts) + _within(w_counts)
    k_pos = np.repeat(offset + w_counts, k_counts) + _within(k_counts)
    n = kr.size + wr.size
    block = make_block(len(names), n)
    for i, name in enumerate(names):
        block[i, w_pos] = warm[name].to_numpy()
        block[i, k_pos] = kept[name].to_numpy()
    out = pd.DataFrame(block.T, columns=names, copy=False)
    cols = list(kept.columns)
    for c in cols:
        if c in names:
            continue
        values = np.empty(n, dtype=kept[c].to_numpy().dtype)
        values[w_pos] = warm[c].to_numpy()
        values[k_pos] = kept[c].to_numpy()
        out.insert(cols.index(c), c, values)  # in the kept frame's order (names keep theirs)
    return out, (block, names)


def _within(counts: np.ndarray) -> np.ndarray:
    """0 .. count - 1 for each count, one after another."""
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
