"""Neighbouring order statistics and medians by one selection.

numpy's partition with one kth runs a vectorised selection; with several (np.median of an even
count asks for the two middle values and the last, two neighbours asked together) it falls back
to introselect, 3-4x slower on a steps x ranks table here (numpy 2.x: 0.20 s against 0.056 s for
1,000 x 10,000 along the ranks). The neighbour of the k-th smallest is then the largest value
below it or the smallest above it, one reduction over the partitioned half: the same values as
numpy's, exactly (tests/test_order_stats.py holds them to np.partition and np.median).
"""

from __future__ import annotations

import numpy as np


def _span(part: np.ndarray, start: int, stop: int | None, axis: int) -> np.ndarray:
    """part[start:stop] along `axis` (a view, the axis kept)."""
    at = [slice(None)] * part.ndim
    at[axis] = slice(start, stop)
    return part[tuple(at)]


def _least(upper: np.ndarray, axis: int) -> np.ndarray:
    """The smallest of the values above the kth, NaN as the largest (where partition puts it):
    NaN only where they all are."""
    return np.fmin.reduce(upper, axis=axis, keepdims=True)


def pair(a: np.ndarray, k: int, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(the k-th, the (k+1)-th) smallest along `axis` (0-based, k + 1 < its length), the axis
    kept (length 1): np.partition(a, [k, k + 1]) at k and k + 1."""
    part = np.partition(a, k, axis=axis)
    return _span(part, k, k + 1, axis), _least(_span(part, k + 1, None, axis), axis)


def triple(a: np.ndarray, k: int, axis: int = -1) -> tuple[np.ndarray, ...]:
    """The (k-1)-th, k-th and (k+1)-th smallest along `axis` (0 < k, k + 1 < its length), the
    axis kept: np.partition(a, [k - 1, k, k + 1]) at those three."""
    part = np.partition(a, k, axis=axis)
    below = _span(part, 0, k, axis).max(axis=axis, keepdims=True)
    above = _least(_span(part, k + 1, None, axis), axis)
    return below, _span(part, k, k + 1, axis), above


def median(a: np.ndarray, axis: int, overwrite: bool = False) -> np.ndarray:
    """np.median(a, axis=axis) of a non-empty axis: NaN where a slice holds one, else the middle
    value, or the mean of the two middle values (as float64, as numpy's). `overwrite`: `a` is
    partitioned in place (no copy of it; its order is lost)."""
    n = a.shape[axis]
    if overwrite:
        a.partition(n // 2, axis=axis)
        part = a
    else:
        part = np.partition(a, n // 2, axis=axis)
    hi = np.take(part, n // 2, axis=axis)
    if n % 2:
        out = hi.astype(np.float64) if a.dtype.kind in "iub" else hi
    else:
        lo = _span(part, 0, n // 2, axis).max(axis=axis)
        out = np.add(lo, hi, dtype=np.float64 if a.dtype.kind in "iub" else None) / 2
    if a.dtype.kind == "f":
        nan = np.isnan(a).any(axis=axis)
        if nan.any():
            out = np.where(nan, np.nan, out)
    return out


def percentile(x: np.ndarray, q):
    """np.percentile(x, q) of a 1-D array (numpy's default, linear, method: the (n - 1) q-th
    value interpolated between its neighbours as numpy's _lerp does), each q by one selection
    and the least value above it; q a number (a float64 back) or a list (an array back). An array
    holding NaN, or empty, goes to numpy as it is."""
    x = np.asarray(x)
    if x.ndim != 1 or x.size == 0 or (x.dtype.kind == "f" and np.isnan(x).any()):
        return np.percentile(x, q)
    qs = np.atleast_1d(np.true_divide(q, 100))
    n = x.size
    out = np.empty(qs.size)
    for i, v in enumerate((n - 1) * qs):
        k = int(np.floor(v))
        if v >= n - 1:  # the top value (numpy takes the last of both neighbours)
            out[i] = x.max()
            continue
        t = v - k
        a, b = (float(y[0]) for y in pair(x, k, axis=0))
        diff = b - a
        out[i] = b - diff * (1 - t) if t >= 0.5 else a + diff * t
    return out[0] if np.ndim(q) == 0 else out
