"""Report: the analysis result every renderer consumes, and its stable JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .classify import Verdict
from .runtable import RunTable
from .stragglers import Straggler
from .suggest import Suggestion
from .thresholds import Thresholds

SCHEMA = "gpuscope.report/1"
MS = 1e6


def jitter_note(jitter: dict) -> str:
    """One line on waiting that moves between ranks ("" when it costs under 1% of step time)."""
    if jitter.get("wait_pct", 0) < 1:
        return ""
    return (f"Rank jitter: {jitter['wait_pct']:.1f}% of step time is spent waiting in steps where "
            f"the late rank changes from step to step ({jitter['steps_time_pct']:.0f}% of step "
            "time): no consistent straggler")


@dataclass
class Report:
    table: RunTable
    steps: pd.DataFrame           # one row per step (classify_steps)
    rank_summary: pd.DataFrame    # one row per rank: medians and shares
    verdict: Verdict
    stragglers: list[Straggler]
    suggestions: list[Suggestion]
    thresholds: Thresholds
    warnings: list[str] = field(default_factory=list)
    analysed_steps: int = 0
    jitter: tuple[float, float] = (0.0, 0.0)   # (step-time share of jitter steps, share lost waiting)
    consistent_early: list[int] = field(default_factory=list)  # ranks that wait every step

    @property
    def source(self) -> str:
        return self.table.source

    def to_dict(self) -> dict:
        """The JSON report (DESIGN.md keys; times in ms, shares in %)."""
        r2 = lambda x: round(float(x), 3)  # noqa: E731
        steps = [{"step": int(s.step), "label": s.label, "step_ms": r2(s.step_ns / MS),
                  "data_pct": r2(100 * s.data_share), "comm_exposed_pct": r2(100 * s.comm_share),
                  "wait_pct": r2(100 * s.wait_share), "compute_pct": r2(100 * s.compute_share),
                  "secondary": list(s.secondary)}
                 for s in self.steps.itertuples(index=False)]
        ranks = []
        for r in self.rank_summary.itertuples(index=False):
            d = {"rank": int(r.rank), "host": self.table.ranks.get(int(r.rank)).host
                 if int(r.rank) in self.table.ranks else "",
                 "steps": int(r.steps), "step_ms": r2(r.step_ns / MS)}
            for part in ("data", "compute", "comm", "comm_exposed", "wait", "other"):
                d[f"{part}_ms"] = r2(getattr(r, f"{part}_ns") / MS)
                d[f"{part}_pct"] = r2(getattr(r, f"{part}_pct"))
            tel = (self.table.extras.get("telemetry_summary") or {}).get(int(r.rank))
            if tel:
                d["telemetry"] = tel
            extra = self.table.extras.get("gpu_breakdown", {}).get(int(r.rank))
            if extra:  # HTA-compatible: idle_pct, compute_pct, non_compute_pct, comm_overlap_pct
                d["gpu_breakdown"] = extra
            ranks.append(d)
        return {
            "schema": SCHEMA, "source": self.source, "path": self.table.path,
            "world_size": int(self.table.world_size),
            "ranks_analysed": len(self.rank_summary),
            "steps_analysed": self.analysed_steps,
            "verdict": self.verdict.label,
            "verdict_share": round(self.verdict.share, 4),
            "confidence": self.verdict.confidence,
            "time_by_label": self.verdict.time_by_label,
            "stragglers": [s.rank for s in self.stragglers],
            "straggler_details": [{"rank": s.rank, "host": s.host, "slow_steps_pct":
                                   round(100 * s.slow_steps_share, 1),
                                   "excess_ms": r2(s.excess_ns / MS), "cause": s.cause,
                                   "cause_detail": s.cause_detail,
                                   "telemetry": s.extra.get("telemetry", "")}
                                  for s in self.stragglers],
            "jitter": {"steps_time_pct": round(100 * self.jitter[0], 2),
                       "wait_pct": round(100 * self.jitter[1], 2)},
            "steps": steps,
            "ranks": ranks,
            "suggestions": [s.to_dict() for s in self.suggestions],
            "knobs": self.table.knobs(),
            "thresholds": self.thresholds.to_dict(),
            "warnings": list(self.warnings),
        }
