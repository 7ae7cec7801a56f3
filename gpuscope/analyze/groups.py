"""Rows grouped by one key column (step or rank): sums, means, maxima and medians per group in
numpy, without pandas groupby's fixed cost per call (which dominates small analyses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


class Groups:
    def __init__(self, keys: np.ndarray):
        keys = np.asarray(keys)
        # rows already grouped (sorted keys, as rank is in the readers' tables): no sort needed
        self._sorted = bool(keys.size and keys.dtype.kind in "iu" and (keys[1:] >= keys[:-1]).all())
        self._order_cache = None  # row indices grouped by key, when not sorted
        if self._sorted:
            new = np.r_[True, keys[1:] != keys[:-1]]
            self.keys, self.inv = keys[new], np.cumsum(new) - 1
        else:
            self.keys, self.inv = np.unique(keys, return_inverse=True)
            self.inv = self.inv.reshape(-1)
        self.counts = np.bincount(self.inv, minlength=self.keys.size)

    def sum(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.inv, np.asarray(values, np.float64), self.keys.size)

    def mean(self, values: np.ndarray) -> np.ndarray:
        return self.sum(values) / self.counts

    def max(self, values: np.ndarray) -> np.ndarray:
        out = np.full(self.keys.size, -np.inf)
        np.maximum.at(out, self.inv, np.asarray(values, np.float64))
        return out

    def median(self, values: np.ndarray) -> np.ndarray:
        """Per group, as pandas computes it (the mean of the two middle values of an even count).
        Groups of one size (every rank has every step) take a partition per row of a
        (groups x size) table: linear, where sorting all values is not."""
        values = np.asarray(values)
        n = int(self.counts[0]) if self.counts.size else 0
        if n and (self.counts == n).all():
            table = values if self._sorted else values[self._order()]
            table = table.reshape(self.keys.size, n).astype(np.float64)
            return np.median(table, axis=1)
        v = values[np.lexsort((values, self.inv))].astype(np.float64)
        starts = np.cumsum(self.counts) - self.counts
        return (v[starts + (self.counts - 1) // 2] + v[starts + self.counts // 2]) / 2

    def _order(self) -> np.ndarray:
        """Row indices grouped by key (stable), computed once."""
        order = self._order_cache
        if order is None:
            order = self._order_cache = np.argsort(self.inv, kind="stable")
        return order


def rank_position(frame: "pd.DataFrame") -> np.ndarray:
    """Each row's position among its rank's rows (groupby("rank").cumcount(), in one numpy pass
    when the frame is sorted by rank, as the readers leave it)."""
    r = frame["rank"].to_numpy()
    if r.size and (r[1:] >= r[:-1]).all():
        idx = np.arange(r.size)
        first = np.r_[True, r[1:] != r[:-1]]
        return idx - np.maximum.accumulate(np.where(first, idx, 0))
    return frame.groupby("rank").cumcount().to_numpy()
