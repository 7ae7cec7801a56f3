"""Per-group numbers in numpy (gpuscope.groups) agree with pandas groupby."""

import numpy as np
import pandas as pd

from gpuscope.analyze.rowgroups import Groups


def test_groups_match_pandas():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 50, 2001)
    values = rng.integers(0, 10**9, 2001)
    g = Groups(keys)
    by = pd.Series(values).groupby(keys)
    assert g.keys.tolist() == by.median().index.tolist()
    assert np.array_equal(g.median(values), by.median().to_numpy())
    assert np.array_equal(g.max(values), by.max().to_numpy().astype(float))
    assert np.allclose(g.mean(values), by.mean().to_numpy())
    assert np.array_equal(g.counts, by.size().to_numpy())
