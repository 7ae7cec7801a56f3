"""Order statistics by one selection (analyze/order_stats.py): the same values as numpy's
partition at several kth and np.median, exactly, along either axis, with ties, integers, NaN
and odd and even counts."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscope.analyze import order_stats


def _tables(seed: int):
    rng = np.random.default_rng(seed)
    for shape in [(7, 10), (5, 11), (1, 2), (3, 3), (40, 257), (33, 1000)]:
        f = rng.normal(6e7, 3e6, shape)
        yield f
        yield np.round(f / 1e6)  # many ties
        yield rng.integers(-5, 5, shape)  # integers, ties
        g = f.copy()
        g[rng.random(shape) < 0.2] = np.nan  # some NaN
        yield g


@pytest.mark.parametrize("seed", range(4))
def test_neighbours_are_numpy_s(seed):
    for a in _tables(seed):
        for axis in (0, 1):
            n = a.shape[axis]
            for k in {0, n // 2 - 1, n // 2, n - 2} - {-1}:
                if k + 1 >= n or k < 0:
                    continue
                want = np.partition(a, [k, k + 1], axis=axis)
                lo, hi = order_stats.pair(a, k, axis=axis)
                np.testing.assert_array_equal(lo, np.take(want, [k], axis=axis))
                np.testing.assert_array_equal(hi, np.take(want, [k + 1], axis=axis))
                if k >= 1:
                    want = np.partition(a, [k - 1, k, k + 1], axis=axis)
                    got = order_stats.triple(a, k, axis=axis)
                    for i, g in zip((k - 1, k, k + 1), got):
                        np.testing.assert_array_equal(g, np.take(want, [i], axis=axis))


@pytest.mark.parametrize("seed", range(4))
def test_median_is_numpy_s(seed):
    for a in _tables(seed):
        for axis in (0, 1):
            want = np.median(a, axis=axis)
            got = order_stats.median(a, axis=axis)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)  # NaN where numpy gives NaN


def test_median_in_place_is_numpy_s_and_keeps_the_values():
    rng = np.random.default_rng(7)
    for a in (rng.normal(0, 1, 1000), rng.normal(0, 1, (20, 31)), rng.integers(0, 9, 999)):
        for axis in range(a.ndim):
            b = a.copy()
            got = order_stats.median(b, axis=axis, overwrite=True)
            np.testing.assert_array_equal(got, np.median(a, axis=axis))
            np.testing.assert_array_equal(np.sort(b, axis=axis), np.sort(a, axis=axis))


@pytest.mark.parametrize("seed", range(3))
def test_percentile_is_numpy_s(seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 10, 11, 99, 1000, 4097):
        for x in (rng.normal(6e7, 3e6, n), np.round(rng.normal(6e7, 3e6, n), -6),
                  rng.integers(0, 7, n).astype(float), rng.integers(-9, 9, n)):
            for q in (0, 10, 25, 33.3, 50, 75, 90, 99.9, 100, [25, 75], [10]):
                want = np.percentile(x, q)
                got = order_stats.percentile(x, q)
                assert type(got) is type(want), (type(got), type(want))
                np.testing.assert_array_equal(got, want)
