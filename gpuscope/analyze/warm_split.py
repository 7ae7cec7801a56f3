"""The warm-up the reader already left out (RunTable.warm): used where it gives what leaving it
out here would, else put back.

prepare.py leaves each rank's first `warmup_steps` rows out after it has left out empty and
thin steps, and after it looked for accumulation, profiler writes and the FLOP-counted step.
The reader's split (readers/warm_split.py) is the same only where none of those moves a rank's
first rows: no empty row, no step that few ranks recorded over both parts, no accumulation, no
profiler or counted step. Those are checked here on both parts (the set-apart rows are a few
per rank); anything else puts the rows back first, and the analysis is the one it always was.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..runtable import RunTable
from .cycles import closed_by
from .rowgroups import count_distinct, value_counts


def whole(table: RunTable) -> RunTable:
    """The table with its set-apart rows back in front of each rank's kept ones."""
    if table.warm is None:
        return table
    frame, block = table.warm.merge(table.frame)
    return replace(table, frame=frame, int_block=block, warm=None)


def split_holds(table: RunTable, warmup: int, own: bool) -> bool:
    """Whether the analysis of the kept rows alone, with no warm-up left out, is the analysis
    of the whole table with `warmup` left out (see the module doc)."""
    w = table.warm
    if w is None or not own or w.steps != warmup or warmup <= 0:
        return False
    for info in table.ranks.values():
        k = info.knobs
        if k.get("profiler_trace_steps") or (isinstance(k.get("flops_counted_step"), int)
                                             and not isinstance(k.get("flops_counted_step"),
                                                                bool)):
            return False
    kept, warm = table.frame, w.frame
    if (warm["step_ns"].to_numpy() <= 0).any() or (kept["step_ns"].to_numpy() <= 0).any():
        return False
    return not accumulates(kept, warm) and not thin_steps(kept, warm)


def accumulates(kept: pd.DataFrame, warm: pd.DataFrame) -> bool:
    """cycle_ends(whole frame) is not None, from the two parts."""
    return closed_by([kept, warm]) is not None


def thin_steps(kept: pd.DataFrame, warm: pd.DataFrame) -> bool:
    """Whether prepare.without_thin_steps would leave steps out of the whole frame."""
    n = count_distinct(kept["rank"].to_numpy())
    if n < 2:
        return False
    keys, counts = zip(*(value_counts(p["step"].to_numpy()) for p in (kept, warm)))
    steps, at = np.unique(np.concatenate(keys), return_inverse=True)
    total = np.bincount(at.reshape(-1), np.concatenate(counts).astype(np.float64), steps.size)
    thin = thin_of(total, n)
    return bool(thin.any()) and not bool(thin.all())


def thin_of(counts: np.ndarray, n_ranks: int) -> np.ndarray:
    """Per step (its count of rows): recorded by one rank only, or by fewer than half of the
    n_ranks (prepare.without_thin_steps leaves such steps out, unless every step is one)."""
    return (counts < 2) | (counts * 2 < n_ranks)
