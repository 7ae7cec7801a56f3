"""Scaling across runs of the same training at several world sizes: throughput, efficiency, and
the point where adding GPUs stops paying.

For each run: throughput = world size x per-rank batch / mean step time (samples/s; steps/s
per rank when the batch is unknown). Exposed communication holds the waiting: transfer (exposed
less waiting) and waiting are the two disjoint parts of it, each counted once. Efficiency of a run = its throughput per rank over the
smallest run's. Adding GPUs "stops paying" at the first size whose marginal speed-up is under
half of the ideal one (e.g. going 8 -> 16 ranks gives less than 1.5x).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InputError
from ..report import Report
from ..vocab import MS


@dataclass
class ScalePoint:
    path: str
    world_size: int
    step_ms: float
    batch_per_rank: int | None
    throughput: float          # samples/s (or steps/s x ranks when the batch is unknown)
    efficiency: float          # throughput per rank relative to the smallest run
    comm_exposed_pct: float    # exposed communication: transfer + waiting
    wait_pct: float            # the part of it spent waiting for other ranks
    data_pct: float
    verdict: str


def scaling_points(reports: list[Report]) -> list[ScalePoint]:
    if len(reports) < 2:
        raise InputError("scaling needs two or more runs")
    rows = []
    for r in reports:
        step_ms = r.step_ns / MS  # the report's one step figure (ReportData.step_ns)
        bs = r.knobs.get("batch_size")
        bs = bs if isinstance(bs, int) and bs > 0 else None
        per_step = (bs or 1) * r.world_size
        mean = lambda part: float(np.mean([x.part_pct(part) for x in r.ranks]))  # noqa: E731
        rows.append([r.path, int(r.world_size), step_ms, bs, per_step / (step_ms / 1e3),
                     mean("comm_exposed"), mean("wait"), mean("data"), r.verdict.label])
    rows.sort(key=lambda x: x[1])
    if len({x[1] for x in rows}) < 2:
        raise InputError("scaling needs runs at different world sizes "
                         f"(all have {rows[0][1]} ranks)")
    if len({x[3] for x in rows}) > 1:
        raise InputError("the runs use different per-rank batch sizes; compare like with like")
    base = rows[0][4] / rows[0][1]
    return [ScalePoint(p, n, round(s, 3), b, round(t, 2), round(t / n / base, 4), round(c, 2),
                       round(w, 2), round(d, 2), v) for p, n, s, b, t, c, w, d, v in rows]


def stops_paying(points: list[ScalePoint]) -> tuple[int | None, str]:
    """World size from which adding ranks pays less than half the ideal speed-up, and why."""
    for prev, cur in zip(points, points[1:]):
        ideal = cur.world_size / prev.world_size
        got = cur.throughput / prev.throughput
        if got - 1 < 0.5 * (ideal - 1):
            grew = cur.comm_exposed_pct - prev.comm_exposed_pct
            cause = (f"exposed communication grows from {prev.comm_exposed_pct:.0f}% to "
                     f"{cur.comm_exposed_pct:.0f}% of the step (of which waiting for other "
                     f"ranks: {prev.wait_pct:.0f}% -> {cur.wait_pct:.0f}%)"
                     if grew > 2 else f"the step is {cur.verdict} at {cur.world_size} ranks")
            return cur.world_size, (f"going from {prev.world_size} to {cur.world_size} ranks gives "
                                    f"{got:.2f}x instead of {ideal:.0f}x: {cause}")
    return None, "every step up in ranks paid at least half of its ideal speed-up"


def scaling_dict(points: list[ScalePoint]) -> dict:
    at, why = stops_paying(points)
    return {"schema": "gpuscope.scaling/1", "points": [asdict(p) for p in points],
            "stops_paying_at": at, "why": why}
