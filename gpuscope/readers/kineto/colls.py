"""One rank's collective instances as columns (numpy only: the parse path, which may run in a
forked process before the analysis stack is imported, keeps pandas out)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Colls:
    """One rank's collective instances (steps.add_collectives' tuples: step, (group, name),
    dur_ns, end_ns, exposed_ns, grads_exposed_ns) as columns: what a rank's summary keeps and
    sends. A tuple of Python ints an instance was ~290 bytes; here ~44, so that the collectives
    of thousands of ranks' traces fit where the reader folds them."""

    keys: list            # the distinct (group, name) keys, in order of first use
    key: np.ndarray       # int32: each instance's key (an index into keys)
    step: np.ndarray      # int64 columns, one value per instance
    dur: np.ndarray
    end: np.ndarray
    exposed: np.ndarray
    grads: np.ndarray

    @classmethod
    def of(cls, items) -> "Colls":
        """From the tuples (the last field, grads_exposed_ns, may be absent: 0)."""
        if isinstance(items, Colls):
            return items
        index: dict = {}
        key = np.fromiter((index.setdefault(it[1], len(index)) for it in items), np.int32,
                          len(items))
        cols = np.array([(it[0], it[2], it[3], it[4], it[5] if len(it) > 5 else 0)
                         for it in items], np.int64).reshape(-1, 5).T
        return cls(list(index), key, *(np.ascontiguousarray(c) for c in cols))

    def __len__(self) -> int:
        return int(self.key.size)

    def tuples(self):
        """The instances as (step, key, dur_ns, end_ns, exposed_ns, grads_exposed_ns), in order."""
        keys = self.keys
        return ((s, keys[k], d, e, x, g) for s, k, d, e, x, g in zip(
            self.step.tolist(), self.key.tolist(), self.dur.tolist(), self.end.tolist(),
            self.exposed.tolist(), self.grads.tolist()))
