"""The collectives of a set of traces, as the table the wait split reads, and as sync points.

1. comm_table: per rank, step and collective key ("kind:process group", kinds named as the
   recorder names them), its time (the union of its instances in the step), the part of it no
   compute hid (exposed) and the number of instances; and the part of the exposed time that
   synchronized gradients (GRADS_COLUMN: issued between the step's backward and its optimizer). analyze/wait.py splits exposed communication into waiting and transfer
   from it, by the same rule for traces and records.
2. sync_points: the end of each collective instance (the n-th of its name and group in the
   step), the moment all its ranks were released, for clock offsets between hosts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...runtable import COMM_COLUMNS, GRADS_COLUMN
from .colls import Colls
from .kernels import kind_of


def comm_table(colls: dict) -> pd.DataFrame | None:
    """COMM_COLUMNS and GRADS_COLUMN from {rank: Colls, or its tuples}; None when no rank has
    a collective. Made from the ranks' columns (no Python object per instance)."""
    parts = [(rank, Colls.of(items)) for rank, items in colls.items()]
    parts = [(rank, c) for rank, c in parts if len(c)]
    if not parts:
        return None
    names: dict = {}  # (group, name) -> "kind:group", worked out once per distinct key
    key_names = []
    for _, c in parts:
        named = [names.setdefault(k, f"{kind_of(str(k[1]))}:{k[0]}") for k in c.keys]
        key_names.append(np.array(named, dtype=object)[c.key])

    def cat(col: str) -> np.ndarray:
        return np.concatenate([getattr(c, col) for _, c in parts])

    df = pd.DataFrame({"rank": np.repeat(np.array([r for r, _ in parts], np.int64),
                                         [len(c) for _, c in parts]),
                       "step": cat("step"), "key": np.concatenate(key_names),
                       "comm_ns": cat("dur"), "exposed_ns": np.maximum(cat("exposed"), 0),
                       "count": 1, GRADS_COLUMN: np.maximum(cat("grads"), 0)})
    out = df.groupby(["rank", "step", "key"], sort=True, as_index=False).sum()
    return out[list(COMM_COLUMNS) + [GRADS_COLUMN]]


def sync_points(colls: dict) -> tuple[list, list, list]:
    """(rank, instance, end_ns) of every collective instance: the n-th of its name and group in
    the step; its end is the moment all its ranks were released."""
    rank_l, inst_l, end_l = [], [], []
    for rank, items in colls.items():
        seen: dict = {}
        for step, key, _dur, end, *_ in Colls.of(items).tuples():
            k = (step, key)
            n = seen[k] = seen.get(k, -1) + 1
            rank_l.append(rank)
            inst_l.append((step, str(key), n))
            end_l.append(end)
    return rank_l, inst_l, end_l
