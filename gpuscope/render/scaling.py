"""The scaling comparison for the terminal: one row per world size, and where adding ranks stops
paying."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from ._console import text_console, text_of
from .terminal import say

if TYPE_CHECKING:
    from ..analyze.scaling import ScalePoint


def render(points: list[ScalePoint], stops_at: int | None, why: str, *,
           width: int | None = None, color: bool = False) -> str:
    console, buf = text_console(width, color)
    unit = "samples/s" if points[0].batch_per_rank else "steps/s"
    t = Table(title="Scaling", title_justify="left")
    for col in ("ranks", "step ms", unit, "eff.", "transfer %", "wait %", "verdict"):
        t.add_column(col, justify="left" if col == "verdict" else "right", no_wrap=True)
    for p in points:
        t.add_row(str(p.world_size), f"{p.step_ms:.1f}", f"{p.throughput:,.1f}",
                  f"{p.efficiency:.0%}", f"{p.comm_exposed_pct - p.wait_pct:.0f}",
                  f"{p.wait_pct:.0f}",
                  p.verdict)
    console.print(t)
    say(console, "step ms: mean over analysed steps; transfer and wait: the two parts of "
        "exposed communication, % of the step", style="dim")
    for p in points:
        say(console, f"{p.world_size} rank{'s' * (p.world_size != 1)}: {p.path}", style="dim")
    say(console, (f"Adding ranks stops paying at {stops_at}: " if stops_at else "") + why)
    return text_of(buf)
