"""A suggestion's value as a training command takes it."""

from __future__ import annotations

import re


def setting(value):
    """A suggestion's current or proposed value as a command takes it: the count in a phrase
    ("every 8 steps", "accumulation 16 (sync every 16 micro-steps)" -> 8, 16), else as it is."""
    if isinstance(value, str):
        m = re.search(r"\d+", value)
        if m and re.match(r"(every|accumulation) ", value):
            return int(m.group(0))
    return value
