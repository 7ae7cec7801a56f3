"""Report: the result of an analysis (gpuscope/results.py holds its data and its JSON form) with
the ways out: print, write_json, write_html. The renderers read results.ReportData, so they never
import this module back.
"""

from __future__ import annotations

import os
import sys

from .breakdown import GpuBreakdown
from .results import (SCHEMA, Jitter, PipelineResult, RankResult,  # noqa: F401
                      ReportData, StageResult, StepResult, Straggler, Suggestion,
                      TelemetrySummary, Verdict)

__all__ = ["Report", "SCHEMA", "GpuBreakdown", "Jitter", "PipelineResult", "RankResult",
           "StageResult", "StepResult", "Straggler", "Suggestion", "TelemetrySummary", "Verdict"]


class Report(ReportData):
    """What an analysis found (results.ReportData's fields and JSON form), and its ways out."""

    def write_json(self, path) -> None:
        from .render import json

        _write(path, json.render(self))

    def write_html(self, path, plotlyjs: str = "inline") -> None:
        from .render import html

        _write(path, html.render(self, plotlyjs=plotlyjs))

    def print(self, file=None, width: int | None = None) -> None:
        """The terminal report on `file` (stdout), in colour when it is a terminal."""
        from .render import terminal

        file = file or sys.stdout
        color = bool(getattr(file, "isatty", lambda: False)())
        file.write(terminal.render(self, width=width, color=color))
        file.flush()



def _write(path, data: str | bytes) -> None:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
