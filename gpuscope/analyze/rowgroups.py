"""Rows grouped by one key column (step or rank): sums, means, maxima and medians per group in
numpy, without pandas groupby's fixed cost per call (which dominates small analyses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import order_stats

if TYPE_CHECKING:
    import pandas as pd


def small_range(cells: int, n: int) -> bool:
    """A table of `cells` entries (indexed by value) is worth it for `n` values: O(n), no sort."""
    return cells <= 4 * n + 1024


def _bincount(v: np.ndarray) -> np.ndarray | None:
    """np.bincount(v) for non-negative ints of a small range (steps, ranks), else None."""
    if v.size and v.dtype.kind in "iu":
        lo, hi = int(v.min()), int(v.max())
        if lo >= 0 and small_range(hi + 1, v.size):
            return np.bincount(v)
    return None


def value_counts(values) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_counts=True), in one O(n) pass where _bincount can."""
    v = np.asarray(values)
    counts = _bincount(v)
    if counts is None:
        return np.unique(v, return_counts=True)
    keys = np.flatnonzero(counts)
    return keys.astype(v.dtype), counts[keys]


def dense_unique(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True, return_counts=True) (inverse flat), in one O(n)
    pass (bincount) for non-negative ints of a small range, as steps and ranks are."""
    v = np.asarray(values)
    counts = _bincount(v)
    if counts is not None:
        keys = np.flatnonzero(counts)
        lookup = np.zeros(counts.size, np.intp)
        lookup[keys] = np.arange(keys.size)
        return keys.astype(v.dtype), lookup[v], counts[keys]
    keys, inv, counts = np.unique(v, return_inverse=True, return_counts=True)
    return keys, inv.reshape(-1), counts


def run_starts(keys: np.ndarray) -> np.ndarray | None:
    """Where each run of equal keys starts, when the keys are sorted ints (rank in the readers'
    tables); None when they are not (or there are none)."""
    if not keys.size or keys.dtype.kind not in "iu":
        return None
    sample = keys[::1024]  # unsorted keys (step in a rank-major table) told from a sample
    if not bool((sample[1:] >= sample[:-1]).all()):
        return None
    change = np.flatnonzero(keys[1:] != keys[:-1])  # one pass: where a run ends
    if change.size and not bool((keys[change + 1] > keys[change]).all()):
        return None  # sorted means every change goes up
    return np.r_[0, change + 1]


def count_distinct(values) -> int:
    """len(set(values)) (pandas' nunique() of a column without NaN): a count of the values seen
    for non-negative ints of a small range (ranks, steps), as dense_unique's, without a hash."""
    v = np.asarray(values)
    if not v.size:
        return 0
    starts = run_starts(v)
    if starts is not None:  # sorted (rank): its runs
        return int(starts.size)
    if v.dtype.kind in "iu":
        lo, hi = int(v.min()), int(v.max())
        if lo >= 0 and small_range(hi + 1, v.size):
            return int(np.count_nonzero(np.bincount(v, minlength=hi + 1)))
    return int(np.unique(v).size)


def same_rows(a: "pd.DataFrame | None", b: "pd.DataFrame | None") -> bool:
    """Whether two per-(rank, step) tables have the same rows in the same order (a table made
    from another's rows, e.g. the waits from the collectives)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(np.array_equal(a[c].to_numpy(), b[c].to_numpy()) for c in ("rank", "step"))


def find_pairs(keys_a: np.ndarray, keys_b: np.ndarray, a: np.ndarray, b: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """For each (a, b): whether it is one of the pairs (keys_a, keys_b) (distinct, non-negative
    ints: rank and step), and at which position of them. A table indexed by the pair where its
    range is small (a rank x step grid), else a binary search."""
    keys_a, keys_b = np.asarray(keys_a, np.int64), np.asarray(keys_b, np.int64)
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if not keys_a.size or not a.size:
        return np.zeros(a.size, dtype=bool), np.zeros(a.size, dtype=np.int64)
    span = int(max(keys_b.max(), b.max())) + 1
    # the pairs as one int (int32 where every one fits: half the bytes), made in place
    width = np.int32 if (int(max(keys_a.max(), a.max())) + 1) * span <= np.iinfo(np.int32).max \
        else np.int64
    key, want = keys_a.astype(width), a.astype(width)
    key *= span
    want *= span
    np.add(key, keys_b, out=key, casting="unsafe")  # (fits: checked above)
    np.add(want, b, out=want, casting="unsafe")
    size = int(max(key.max(), want.max())) + 1
    if small_range(size, key.size + want.size):
        # positions in int32 where they fit: half the bytes to fill, scatter and gather
        width = np.int32 if key.size < np.iinfo(np.int32).max else np.int64
        table = np.full(size, -1, width)
        table[key] = np.arange(key.size, dtype=width)
        at = table[want]
        hit = at >= 0
        np.maximum(at, 0, out=at)  # a position to index with, as the search's
        return hit, at
    sorter = (np.arange(key.size) if (key[1:] > key[:-1]).all()
              else np.argsort(key, kind="stable"))
    pos = np.minimum(np.searchsorted(key[sorter], want), key.size - 1)
    at = sorter[pos]
    return key[at] == want, at


class Groups:
    """Rows grouped by one key column. Three layouts, the same answers: rows already grouped
    (sorted keys, as rank is in the readers' tables: runs summed where they lie); one run of
    keys repeated (step in a rank-major table where every rank has the same steps: the values
    are a (repeats x keys) table and a group is a column); anything else (a table indexed by
    key, or a sort)."""

    def __init__(self, keys: np.ndarray):
        keys = np.asarray(keys)
        # rows already grouped (sorted keys, as rank is in the readers' tables): no sort needed
        starts = run_starts(keys)
        self._sorted = starts is not None
        self._order_cache = None  # row indices grouped by key, when not sorted
        self._inv = None
        self._width = repeated_run(keys) if not self._sorted else 0
        if self._sorted:
            self._starts = starts
            self.keys = keys[self._starts]
            self.counts = np.diff(np.r_[self._starts, keys.size])
        elif self._width:
            self.keys = keys[:self._width].copy()
            self.counts = np.full(self._width, keys.size // self._width, np.int64)
        else:
            self.keys, self._inv, self.counts = dense_unique(keys)

    @property
    def inv(self) -> np.ndarray:
        """Each row's group (0 .. len(keys) - 1)."""
        if self._inv is None:  # made only when asked (a row-long array)
            if self._sorted:
                self._inv = np.repeat(np.arange(self.keys.size), self.counts)
            else:  # the repeated run
                self._inv = np.tile(np.arange(self._width), self.counts[0] if self._width else 0)
        return self._inv

    def _table(self, values: np.ndarray) -> np.ndarray:
        return values.reshape(-1, self._width)  # (repeats x keys): a group per column

    def sum(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if (self._sorted or self._width) and values.dtype.kind in "iuf":
            acc = np.int64 if values.dtype.kind in "iu" else np.float64
            if self._width:  # the rows added in order, as bincount adds them
                return self._table(values).sum(axis=0, dtype=acc).astype(np.float64)
            # runs of rows: summed where they lie
            return np.add.reduceat(values, self._starts, dtype=acc).astype(np.float64)
        return np.bincount(self.inv, np.asarray(values, np.float64), self.keys.size)

    def mean(self, values: np.ndarray) -> np.ndarray:
        return self.sum(values) / self.counts

    def max(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if self._width and values.dtype.kind in "iuf":
            return self._table(values).max(axis=0).astype(np.float64)
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
            if self._width:
                table = self._table(values).T
            else:
                table = values if self._sorted else values[self._order()]
                table = table.reshape(self.keys.size, n)
            if table.dtype.kind in "iu":  # ints (ns) partitioned as they are, no float copy
                return order_stats.median(table, axis=1)
            return order_stats.median(table.astype(np.float64), axis=1, overwrite=True)
        v = values[np.lexsort((values, self.inv))].astype(np.float64)
        starts = np.cumsum(self.counts) - self.counts
        return (v[starts + (self.counts - 1) // 2] + v[starts + self.counts // 2]) / 2

    def _order(self) -> np.ndarray:
        """Row indices grouped by key (stable), computed once."""
        order = self._order_cache
        if order is None:
            order = self._order_cache = np.argsort(self.inv, kind="stable")
        return order


def repeated_run(keys: np.ndarray) -> int:
    """The length of the strictly increasing run of int keys that, repeated, makes all of them
    (the steps of a rank-major table where every rank has the same steps); 0 when they are not
    that."""
    if not keys.size or keys.dtype.kind not in "iu":
        return 0
    drops = np.flatnonzero(keys[1:] <= keys[:-1])
    width = int(drops[0]) + 1 if drops.size else keys.size
    if width == keys.size or keys.size % width:
        return 0  # one run: sorted (handled as such); or not a whole number of runs
    return width if bool((keys.reshape(-1, width) == keys[:width]).all()) else 0


class PerRank:
    """Per-rank means of one frame's columns over its steps (the report's one statistic per
    quantity: they add up, as the parts of a step do, and they are the time per step that
    throughput is made of), each computed once: the ranks' summary, the straggler search and the
    what-if estimates ask for the same ones. The caller passes it only along with frames of the
    same rows and values (columns may have been added)."""

    def __init__(self, frame: "pd.DataFrame"):
        self.frame = frame
        self.groups = Groups(frame["rank"].to_numpy())
        self._memo: dict[str, np.ndarray] = {}
        self._sums: dict[str, np.ndarray] = {}

    def sum(self, col: str) -> np.ndarray:
        """Per rank, the column's sum (Groups.sum), computed once (a pass over a column of a
        big table may read it from a file again)."""
        out = self._sums.get(col)
        if out is None:
            out = self._sums[col] = self.groups.sum(self.frame[col].to_numpy())
        return out

    def mean(self, col: str) -> np.ndarray:
        out = self._memo.get(col)
        if out is None:
            out = self._memo[col] = self.sum(col) / self.groups.counts
        return out


def step_by_rank(frame: "pd.DataFrame", how: str = "max") -> dict[int, int]:
    """{rank: its last ("max") or first ("min") step} (groupby("rank")["step"].max() as a dict),
    by runs of rows where the frame is sorted by rank, as the readers leave it."""
    if not len(frame):
        return {}
    r, s = frame["rank"].to_numpy(), frame["step"].to_numpy()
    starts = run_starts(r) if s.dtype.kind in "iu" else None
    if starts is not None:
        ufunc = np.maximum if how == "max" else np.minimum
        return dict(zip(r[starts].tolist(), ufunc.reduceat(s, starts).tolist()))
    return getattr(frame.groupby("rank")["step"], how)().to_dict()


def warm_rows(frame: "pd.DataFrame", n: int) -> np.ndarray:
    """Bool per row: one of its rank's first `n` rows (rank_position(frame) < n), set rank by
    rank from where each starts when the frame is sorted by rank, as the readers leave it."""
    r = frame["rank"].to_numpy()
    starts = run_starts(r)
    if starts is None:
        return rank_position(frame) < n
    take = np.minimum(np.diff(np.r_[starts, r.size]), max(n, 0))
    out = np.zeros(r.size, dtype=bool)
    # rank i's rows starts[i] .. starts[i] + take[i] - 1, as offsets of one arange
    out[np.repeat(starts - (np.cumsum(take) - take), take) + np.arange(int(take.sum()))] = True
    return out


def rank_position(frame: "pd.DataFrame") -> np.ndarray:
    """Each row's position among its rank's rows (groupby("rank").cumcount(), in one numpy pass
    when the frame is sorted by rank, as the readers leave it)."""
    r = frame["rank"].to_numpy()
    starts = run_starts(r)
    if starts is not None:
        return np.arange(r.size) - np.repeat(starts, np.diff(np.r_[starts, r.size]))
    return frame.groupby("rank").cumcount().to_numpy()


def in_analysed(frame: "pd.DataFrame", mapping, rank, step) -> tuple[np.ndarray, np.ndarray]:
    """For rows given by (rank, step) of a per-micro-step table (collectives, all-to-all
    rows): whether each belongs to an analysed step of `frame`, and that step (with
    accumulation, `mapping` (cycles.py) takes a micro-step to its optimizer step first)."""
    r, s = np.asarray(rank, np.int64), np.asarray(step, np.int64)
    keep = np.ones(r.size, dtype=bool)
    if mapping is not None:
        keep, at = find_pairs(mapping["rank"].to_numpy(np.int64),
                              mapping["step"].to_numpy(np.int64), r, s)
        s = np.where(keep, mapping["cycle_step"].to_numpy(np.int64)[np.where(keep, at, 0)], s)
    hit, _ = find_pairs(frame["rank"].to_numpy(np.int64), frame["step"].to_numpy(np.int64), r, s)
    return keep & hit, s
