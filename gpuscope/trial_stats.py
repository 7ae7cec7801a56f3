"""What repeated trials know of a mean: the rounds' mean and its standard error."""

from __future__ import annotations

import math
import statistics


def pooled(values: list, rel_ses: list) -> tuple[float, float] | None:
    """(mean, its standard error) of per-round values, each known to within its own standard
    error (a share of it, rel_ses; None: unknown, taken as 0): the larger of the rounds' own
    errors combined and their spread between rounds, so that it shrinks as rounds are added;
    None without a value."""
    x = [(v, e if isinstance(e, (int, float)) else 0.0)
         for v, e in zip(values, list(rel_ses) + [None] * len(values)) if v is not None]
    if not x:
        return None
    n = len(x)
    mean = sum(v for v, _ in x) / n
    within = math.sqrt(sum((v * e) ** 2 for v, e in x)) / n
    between = statistics.stdev([v for v, _ in x]) / math.sqrt(n) if n >= 2 else 0.0
    return mean, max(within, between)
