"""Interval algebra on numpy arrays of [start, end) integer ns: union, length, intersection."""

from __future__ import annotations

import numpy as np

_EMPTY = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint union of the intervals (empty and negative ones dropped)."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if s.size == 0:
        return _EMPTY
    if s.size > 1:
        order = s.argsort(kind="stable")
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # a span starts where an interval begins past every end before it, and ends before the next
    first = np.empty(s.size, dtype=bool)
    first[0] = True
    np.greater(s[1:], reach[:-1], out=first[1:])
    last = np.empty(s.size, dtype=bool)
    last[:-1] = first[1:]
    last[-1] = True
    return s[first], reach[last]


def length(spans: tuple[np.ndarray, np.ndarray]) -> int:
    return int((spans[1] - spans[0]).sum())


def union(*sets: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return merge(np.concatenate([np.asarray(s[0], np.int64) for s in sets]),
                 np.concatenate([np.asarray(s[1], np.int64) for s in sets]))


def overlap(a, b) -> int:
    """|a ∩ b| for two merged sets: |a| + |b| - |a ∪ b|."""
    if a[0].size == 0 or b[0].size == 0:
        return 0
    return length(a) + length(b) - length(union(a, b))


def subtract(a, b):
    """The parts of merged set `a` outside merged set `b`."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    pts.sort()  # a repeated point makes a piece of no length, which merge drops
    lo, hi = pts[:-1], pts[1:]
    keep = _inside(a, lo) & ~_inside(b, lo)
    return merge(lo[keep], hi[keep])


def _inside(s, at: np.ndarray) -> np.ndarray:
    """Whether each point of `at` lies in the merged set `s` (in one of its [start, end))."""
    return s[0].searchsorted(at, "right") > s[1].searchsorted(at, "right")


def intersect(a, b):
    """The parts of merged set `a` inside merged set `b`."""
    if a[0].size == 0 or b[0].size == 0:
        return a[0][:0], a[1][:0]
    return subtract(a, subtract(a, b))


def clip(spans, lo: int, hi: int):
    s = np.maximum(spans[0], lo)
    e = np.minimum(spans[1], hi)
    keep = e > s
    return s[keep], e[keep]


def window(spans, lo: int, hi: int):
    """`clip` for a large merged set: only the spans that can reach [lo, hi) are looked at (two
    binary searches), so a window costs its own spans, not the whole set's."""
    s, e = spans
    a = int(e.searchsorted(lo, "right"))  # spans before a end by lo
    b = int(s.searchsorted(hi, "left"))   # spans from b on start at hi or later
    return clip((s[a:b], e[a:b]), lo, hi)
