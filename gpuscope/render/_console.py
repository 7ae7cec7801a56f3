"""A rich Console that renders into a string, at a fixed or the terminal's width."""

from __future__ import annotations

import io
import re
import shutil

from rich.console import Console


def text_console(width: int | None = None, color: bool = False) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    width = width or shutil.get_terminal_size((100, 24)).columns
    return Console(file=buf, width=width, highlight=False, force_terminal=color,
                   color_system="auto" if color else None), buf


#: spaces a line ends with (rich pads wrapped lines and titles), before a colour's reset if any
_TRAILING = re.compile(r"[ ]+((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)


def text_of(buf: io.StringIO) -> str:
    """What a text_console printed, without the spaces rich pads its lines with."""
    return _TRAILING.sub(r"\1", buf.getvalue())
