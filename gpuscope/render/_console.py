"""A rich Console that renders into a string, at a fixed or the terminal's width."""

from __future__ import annotations

import io
import shutil

from rich.console import Console


def text_console(width: int | None = None, color: bool = False) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    width = width or shutil.get_terminal_size((100, 24)).columns
    return Console(file=buf, width=width, highlight=False, force_terminal=color,
                   color_system="auto" if color else None), buf
