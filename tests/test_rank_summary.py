"""Per-rank summary: medians per rank without per-group Python."""


def test_group_medians_match_pandas():
    import numpy as np
    import pandas as pd

    from gpuscope.pipeline import group_medians

    rng = np.random.default_rng(0)
    keys = rng.integers(0, 50, 2001)
    values = rng.integers(0, 10**9, 2001)
    uniq, med = group_medians(keys, values)
    expected = pd.Series(values).groupby(keys).median()
    assert uniq.tolist() == expected.index.tolist()
    assert np.array_equal(med, expected.to_numpy())
