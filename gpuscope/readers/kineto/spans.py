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
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
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
    pts = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    lo, hi = pts[:-1], pts[1:]
    inside = lambda s: (np.searchsorted(s[0], lo, "right")  # noqa: E731
                        - np.searchsorted(s[1], lo, "right")) > 0
    keep = inside(a) & ~inside(b)
    return merge(lo[keep], hi[keep])


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
    a = int(np.searchsorted(e, lo, "right"))  # spans before a end by lo
    b = int(np.searchsorted(s, hi, "left"))   # spans from b on start at hi or later
    return clip((s[a:b], e[a:b]), lo, hi)
