"""RunTable: the one rank x step table both readers produce and every rule and renderer reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

#: columns every reader fills (integer ns unless noted); readers may add more
TIME_COLUMNS = ("step_ns", "data_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "wait_ns",
                "other_ns")
DETAIL_COLUMNS = ("forward_ns", "backward_ns", "optimizer_ns", "n_comm", "data_cpu_ns")
KEY_COLUMNS = ("rank", "step", "start_ns")


@dataclass
class RankInfo:
    """What is known of one rank besides its steps: host, knobs, how it was measured."""

    rank: int
    host: str = ""
    knobs: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


@dataclass
class RunTable:
    """Per-rank, per-step timings. `frame` has one row per (rank, step), sorted, with
    KEY_COLUMNS + TIME_COLUMNS (+ DETAIL_COLUMNS where known)."""

    frame: pd.DataFrame
    source: str  # "record" | "kineto"
    path: str
    ranks: dict[int, RankInfo]
    world_size: int
    warnings: list[str] = field(default_factory=list)
    extras: dict = field(default_factory=dict)  # reader-specific results (e.g. HTA breakdown)

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    def knobs(self) -> dict:
        """Knobs of the lowest rank (ranks normally share their settings)."""
        if not self.ranks:
            return {}
        return dict(self.ranks[self.rank_ids[0]].knobs)


def empty_frame() -> pd.DataFrame:
    cols = list(KEY_COLUMNS) + list(TIME_COLUMNS) + list(DETAIL_COLUMNS)
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
