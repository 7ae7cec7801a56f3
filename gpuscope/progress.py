"""A progress bar on stderr while a big input is read (more than BIG_BYTES or BIG_FILES): the CLI
turns it on (`enable()`) when stderr is a terminal; library calls stay silent. The readers call
`advance(nbytes)` as files are done; the bar disappears when the reading ends. It draws from the
calling thread only (no refresh thread: the readers fork only a process without threads), and
only in the process that started it (a forked reader's advance() is ignored)."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

BIG_BYTES = 100 << 20
BIG_FILES = 64

_enabled = False
_bar = None  # (rich Progress, task id, pid, [last drawn]) while a big read is shown


def enable(on: bool = True) -> None:
    global _enabled
    _enabled = on


def wanted(total_bytes: int, n_files: int) -> bool:
    return _enabled and (total_bytes > BIG_BYTES or n_files >= BIG_FILES)


@contextmanager
def reading(total_bytes: int, n_files: int, what: str):
    """Show a bar for reading `n_files` files of `total_bytes` (when big and enabled)."""
    global _bar
    if not wanted(total_bytes, n_files) or _bar is not None:
        yield
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    force = os.environ.get("GPUSCOPE_PROGRESS") == "1"  # tests: a bar on a captured stderr
    console = Console(file=sys.stderr, force_terminal=force or None)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                   auto_refresh=False)
    name = os.path.basename(os.path.normpath(what)) or what
    task = bar.add_task(f"reading {name} ({n_files} file{'s' * (n_files != 1)})",
                        total=max(total_bytes, 1))
    _bar = (bar, task, os.getpid(), [0.0])
    bar.start()
    bar.refresh()
    try:
        yield
    finally:
        _bar = None
        bar.stop()


def advance(nbytes: int) -> None:
    if _bar is None or nbytes <= 0:
        return
    bar, task, pid, drawn = _bar
    if os.getpid() != pid:
        return
    bar.advance(task, nbytes)
    now = time.monotonic()
    if now - drawn[0] >= 0.1:  # at most 10 draws a second
        drawn[0] = now
        bar.refresh()
