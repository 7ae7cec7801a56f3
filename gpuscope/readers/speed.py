"""The readers' fast paths behind one switch.

Each fast path gives exactly what the plain one gives (tests/test_reader_fast_paths.py reads the
samples both ways); they only make big inputs quicker:
  - forks: a second process for half of a big input (run dirs of many rank files, a big trace
    cut in two, one process per trace file, the command line's early parse: fork.py, prefetch.py)
  - bulk: a run dir's body decoded in one call into typed rows (record_body.py), its column side
    files taken when they account for the record file (record_columns.py), collectives checked
    in bulk
The plain path decodes every line with msgspec in this process and checks each value.
`GPUSCOPE_PLAIN_READ=1` (or `plain()` in a test) turns every fast path off at once.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from .fork import can_fork

FAST = os.environ.get("GPUSCOPE_PLAIN_READ", "") in ("", "0")


def forks() -> bool:
    """Whether a reader may fork a process for part of its input now."""
    return FAST and can_fork()


def bulk() -> bool:
    """Whether a reader may take its bulk decoders and side files."""
    return FAST


@contextmanager
def plain():
    """Every fast path off inside the block (tests compare the two paths)."""
    global FAST
    was, FAST = FAST, False
    try:
        yield
    finally:
        FAST = was
