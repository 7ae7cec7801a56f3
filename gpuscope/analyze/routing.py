"""Expert routing: how unevenly the all-to-alls deliver rows (tokens) to the ranks.

From the recorder's all-to-all rows (RunTable.routing: per rank, micro-step and instance, the
rows that all_to_all_single delivered). Instance i of a step is the same call on every rank
(collectives are issued in one order), so comparing the ranks instance by instance separates an
MoE layer's dispatch (uneven when the router favours some experts) from its combine (each rank
gets its own tokens back) and from a small exchange of counts. The most uneven instance is the
evidence: each rank's mean rows per analysed step, the busiest rank, its share of all rows and
how many times the mean rank it gets. Traces carry no split sizes on CPU: unknown there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..sections import Routing
from .rowgroups import in_analysed

#: below this max / mean ratio the rows are taken as even (no rank named)
UNEVEN = 1.2


def analysed_rows(routing: pd.DataFrame, frame: pd.DataFrame, mapping) -> pd.DataFrame:
    """The routing rows of the analysed (micro-)steps."""
    hit, _ = in_analysed(frame, mapping, routing["rank"].to_numpy(np.int64),
                         routing["step"].to_numpy(np.int64))
    return routing[hit]


def routing_section(routing: pd.DataFrame | None, frame: pd.DataFrame,
                    mapping) -> Routing | None:
    """None when nothing was recorded or fewer than two ranks sent rows; else the most uneven
    instance (sections.Routing)."""
    if routing is None or routing.empty:
        return None
    rows = analysed_rows(routing, frame, mapping)
    if rows.empty:
        return None
    per = rows.groupby(["instance", "rank"], sort=True)["rows"].mean()
    best = None
    for inst, by_rank in per.groupby(level=0, sort=True):
        by_rank = by_rank.droplevel(0)
        if len(by_rank) < 2 or by_rank.mean() <= 0:
            continue
        ratio = float(by_rank.max() / by_rank.mean())
        if best is None or ratio > best[0] + 1e-9:
            best = (ratio, int(inst), by_rank)
    if best is None:
        return None
    ratio, inst, by_rank = best
    top = int(by_rank.idxmax())
    return Routing(instance=inst, instances=int(rows["instance"].max()) + 1,
                   steps=int(rows["step"].nunique()),
                   rows_by_rank={str(int(r)): round(float(v), 1) for r, v in by_rank.items()},
                   busiest_rank=top, busiest_share=round(float(by_rank[top] / by_rank.sum()), 4),
                   max_over_mean=round(ratio, 3), uneven=bool(ratio >= UNEVEN))


def routing_note(section: Routing | None) -> str:
    """One line for the report and the straggler's suggestion; "" when even or unknown."""
    if section is None or not section.uneven:
        return ""
    return (f"rank {section.busiest_rank} receives {section.busiest_share:.0%} of the rows of "
            f"the most uneven all-to-all ({section.max_over_mean:.1f}x the mean of "
            f"{len(section.rows_by_rank)} ranks; call {section.instance + 1} of "
            f"{section.instances} per step, an expert layer's dispatch)")
