"""Small interval arithmetic on (start_ns, end_ns) pairs, for the recorder's per-step math."""

from __future__ import annotations

Interval = tuple[int, int]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of the given intervals (empty ones dropped)."""
    out: list[Interval] = []
    lo = hi = None
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if hi is not None and a <= hi:
            if b > hi:
                hi = b
        else:
            if hi is not None:
                out.append((lo, hi))
            lo, hi = a, b
    if hi is not None:
        out.append((lo, hi))
    return out


def length(intervals: list[Interval]) -> int:
    """The length of the union of the given intervals (total(merge(intervals)), without the
    list: what the recorder's per-step sums need most)."""
    acc = 0
    hi = None
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if hi is None or a > hi:
            acc += b - a
            hi = b
        elif b > hi:
            acc += b - hi
            hi = b
    return acc


def total(merged: list[Interval]) -> int:
    return sum(b - a for a, b in merged)


def overlap(a: list[Interval], b: list[Interval]) -> int:
    """Length of the intersection of two merged interval lists."""
    acc = 0
    j, nb = 0, len(b)
    for lo, hi in a:
        while j < nb and b[j][1] <= lo:  # b's spans that end before this one: done with
            j += 1
        k = j
        while k < nb:
            blo, bhi = b[k]
            if blo >= hi:
                break
            acc += (hi if hi < bhi else bhi) - (lo if lo > blo else blo)
            k += 1
    return acc


def clip(intervals: list[Interval], lo: int, hi: int) -> list[Interval]:
    return [(a if a > lo else lo, b if b < hi else hi) for a, b in intervals if b > lo and a < hi]
