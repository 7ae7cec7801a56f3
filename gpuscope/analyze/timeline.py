"""What a timeline export draws (render/perfetto.py), worked out on the analysis side: every
row as recorded (micro-steps, warm-up included) with its wait, the analysed step each belongs to,
and each rank's clock offset.

A recorded row holds how long each part of the step took, not where in the step it ran, so the
renderer lays the parts out in the order a step runs them: between (the loop's own work), data,
forward, backward, exposed communication (its wait first), optimizer, other. Its sync point, where
the ranks leave the step's last collective together, is then the end of the exposed
communication; clocks.host_offsets aligns other hosts on it. Profiler traces carry their own
positions: the rows are the analysed steps, the offsets the reader's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..clocks import host_offsets
from ..runtable import ns_column as _col
from .cycles import cycle_ends, group_cycles
from .wait import estimate_wait

if TYPE_CHECKING:
    from ..results import ReportData
    from ..runtable import RunTable


@dataclass
class Timeline:
    frame: pd.DataFrame         # one row per rank and step (as recorded), wait_ns filled
    results: list               # per row: the StepResult it belongs to, or None (not analysed)
    offsets: dict[int, int] = field(default_factory=dict)  # rank -> ns to add to its times



def record_sync_points(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, step, end of the exposed communication in the laid out step) of the rows that
    ran collectives."""
    end = (frame["start_ns"].to_numpy(dtype=np.int64) + _col(frame, "between_ns")
           + _col(frame, "data_ns") + _col(frame, "compute_ns") - _col(frame, "optimizer_ns")
           + _col(frame, "comm_exposed_ns"))
    sync = _col(frame, "n_comm") > 0
    return frame["rank"].to_numpy()[sync], frame["step"].to_numpy()[sync], end[sync]


def _results(report: "ReportData", frame: pd.DataFrame) -> list:
    """Per row, the StepResult of the step it belongs to (with accumulation: its optimizer
    step), or None when the analysis left the step out."""
    by_step = {s.step: s for s in report.steps}
    ends = cycle_ends(frame)
    if ends is None:
        return [by_step.get(s) for s in frame["step"].tolist()]
    _, mapping = group_cycles(frame, ends)
    return [by_step.get(s) for s in mapping["cycle_step"].tolist()]


def timeline(table: "RunTable", report: "ReportData") -> Timeline:
    """The rows to draw for `table` (as read) analysed into `report`."""
    if table.source == "record":
        frame = estimate_wait(table.frame, [], table.comm)
        hosts = {r: info.host for r, info in table.ranks.items()}
        return Timeline(frame, _results(report, frame),
                        host_offsets(*record_sync_points(frame), hosts))
    frame = report.table.frame if report.table is not None else table.frame
    by_step = {s.step: s for s in report.steps}
    offsets = {r: int(info.meta["clock_offset_ns"]) for r, info in table.ranks.items()
               if info.meta.get("clock_offset_ns")}
    return Timeline(frame, [by_step.get(s) for s in frame["step"].tolist()], offsets)
