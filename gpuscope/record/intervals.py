"""Small interval arithmetic on (start_ns, end_ns) pairs, for the recorder's per-step math."""

from __future__ import annotations

Interval = tuple[int, int]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of the given intervals (empty ones dropped)."""
    out: list[list[int]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(merged: list[Interval]) -> int:
    return sum(b - a for a, b in merged)


def overlap(a: list[Interval], b: list[Interval]) -> int:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    acc = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            acc += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return acc


def clip(intervals: list[Interval], lo: int, hi: int) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]
