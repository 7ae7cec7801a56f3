"""The recorder's all-to-all rows (record/sinks.Routing) read into one table, checked on the way.

`RunTable.routing` has one row per (rank, step, instance): the rows the instance-th
all_to_all_single of that micro-step delivered to the rank (an expert layer's dispatch: the
tokens its experts got). Issue order is the same on every rank (collectives are), so instance i
is one call seen from each side. A record whose steps and rows do not match is left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .validate import MAX_STEP, is_int

ROUTING_COLUMNS = ("rank", "step", "instance", "rows")
MAX_ROWS = 1 << 48


def routing_ok(m) -> bool:
    """A routing side record's body: {"steps": [step, ...], "rows": [[rows, ...], ...]}."""
    if not isinstance(m, dict):
        return False
    steps, rows = m.get("steps"), m.get("rows")
    return (isinstance(steps, list) and isinstance(rows, list) and len(steps) == len(rows)
            and all(is_int(s, 0, MAX_STEP) for s in steps)
            and all(isinstance(r, list) and all(is_int(n, -1, MAX_ROWS) for n in r)
                    for r in rows))


def routing_frame(parts: list[tuple[int, list[dict]]]) -> pd.DataFrame | None:
    """One table (ROUTING_COLUMNS) from each rank's routing records (checked by routing_ok);
    rows of -1 (a tensor without a shape) left out."""
    rank_l, step_l, inst_l, rows_l = [], [], [], []
    for rank, records in parts:
        for m in records:
            for step, rows in zip(m["steps"], m["rows"]):
                for i, n in enumerate(rows):
                    if n >= 0:
                        rank_l.append(rank)
                        step_l.append(step)
                        inst_l.append(i)
                        rows_l.append(n)
    if not rank_l:
        return None
    return pd.DataFrame({"rank": np.array(rank_l, np.int64), "step": np.array(step_l, np.int64),
                         "instance": np.array(inst_l, np.int64),
                         "rows": np.array(rows_l, np.int64)})
