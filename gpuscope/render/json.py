"""The JSON report: `Report.to_dict()` as indented UTF-8 JSON (orjson; NaN never written)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..results import ReportData


def render(report: ReportData) -> bytes:
    import orjson

    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2)
