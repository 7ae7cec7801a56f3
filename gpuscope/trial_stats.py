"""What repeated trials know of a mean: the rounds' mean, how far one round strays from it, and
the interval that holds the mean (or a repeat of the same rounds) 95 times in 100.

A round's value is a mean over many steps, but those steps are not independent draws: a loader's
workers hand over in bursts (a long wait, then short ones while the queue is full) and a whole-
epoch trial holds exactly one epoch start, so the steps' own spread overstates what a round's
mean can miss (the demo's 12-worker trials on 2 cores: a round's mean known to +-25-34% from its
steps, where 6 rounds strayed 16%). What a round can miss is read from the rounds: each value
against its own group's mean (a candidate's rounds), pooled over every group that ran alike, the
machine's round-to-round noise, with the degrees of freedom the groups give and Student's t for
them (two rounds alone know little of their spread: t = 12.7 at one degree of freedom). A single
round falls back on its steps' spread.
"""

from __future__ import annotations

import math
import statistics

from .analyze.consistency import t_critical

#: two-sided 95%: the one-sided level of the t table
LEVEL = 0.025


def t95(df: int) -> float:
    """Student's t for a two-sided 95% interval (consistency.t_critical at LEVEL)."""
    return t_critical(df, LEVEL)


def round_noise(groups: list[list]) -> tuple[float, int] | None:
    """(how far one round strays from its group's mean, as a share of it, pooled over the
    groups; its degrees of freedom), from groups of rounds that measured the same thing (None
    values left out); None where no group has two rounds."""
    ss, df = 0.0, 0
    for g in groups:
        x = [v for v in g if isinstance(v, (int, float)) and v > 0]
        if len(x) < 2:
            continue
        m = statistics.mean(x)
        ss += sum((v / m - 1) ** 2 for v in x)
        df += len(x) - 1
    return (math.sqrt(ss / df), df) if df else None


def interval(values: list, noise: tuple[float, int] | None, rel_ses: list = (),
             repeat: bool = False) -> tuple[float, float] | None:
    """(the rounds' mean, the half-width of its 95% interval as a share of it): t for the noise's
    degrees of freedom times its share over the root of the rounds; `repeat`: the interval a
    repeat of as many rounds falls in (root 2 wider). Without a noise (a single round), twice the
    round's own error from its steps (rel_ses). None without a value."""
    x = [v for v in values if v is not None]
    if not x:
        return None
    mean, n = sum(x) / len(x), len(x)
    k = math.sqrt(2) if repeat else 1.0
    if noise is not None:
        share, df = noise
        return mean, t95(df) * share * k / math.sqrt(n)
    own = [e for v, e in zip(values, list(rel_ses) + [None] * len(values))
           if v is not None and isinstance(e, (int, float))]
    return mean, 2 * k * (math.sqrt(sum(e * e for e in own)) / n if own else 0.0)
