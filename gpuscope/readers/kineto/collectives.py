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
from .kernels import kind_of


def comm_table(colls: dict[int, list]) -> pd.DataFrame | None:
    """COMM_COLUMNS and GRADS_COLUMN from {rank: [(step, (group, name), dur_ns, end_ns,
    exposed_ns, grads_exposed_ns), ...]};
    None when no rank has a collective."""
    keys: dict = {}
    rank_l, step_l, key_l, dur_l, exp_l, grad_l = [], [], [], [], [], []
    for rank, items in colls.items():
        for step, key, dur, _end, exposed, *grads in items:
            name = keys.get(key)
            if name is None:
                name = keys[key] = f"{kind_of(str(key[1]))}:{key[0]}"
            rank_l.append(rank)
            step_l.append(step)
            key_l.append(name)
            dur_l.append(dur)
            exp_l.append(max(0, exposed))
            grad_l.append(max(0, grads[0]) if grads else 0)
    if not rank_l:
        return None
    df = pd.DataFrame({"rank": np.array(rank_l, np.int64), "step": np.array(step_l, np.int64),
                       "key": key_l, "comm_ns": np.array(dur_l, np.int64),
                       "exposed_ns": np.array(exp_l, np.int64), "count": 1,
                       GRADS_COLUMN: np.array(grad_l, np.int64)})
    out = df.groupby(["rank", "step", "key"], sort=True, as_index=False).sum()
    return out[list(COMM_COLUMNS) + [GRADS_COLUMN]]


def sync_points(colls: dict[int, list]) -> tuple[list, list, list]:
    """(rank, instance, end_ns) of every collective instance: the n-th of its name and group in
    the step; its end is the moment all its ranks were released."""
    rank_l, inst_l, end_l = [], [], []
    for rank, items in colls.items():
        seen: dict = {}
        for step, key, _dur, end, *_ in items:
            k = (step, key)
            n = seen[k] = seen.get(k, -1) + 1
            rank_l.append(rank)
            inst_l.append((step, str(key), n))
            end_l.append(end)
    return rank_l, inst_l, end_l
