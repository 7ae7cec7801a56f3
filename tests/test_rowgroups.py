"""Per-group numbers in numpy (gpuscope.groups) agree with pandas groupby."""

import numpy as np
import pytest
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


def _as_pandas(g, keys, values, exact_mean=True):
    by = pd.Series(values).groupby(keys)
    assert g.keys.tolist() == by.median().index.tolist()
    assert np.array_equal(g.counts, by.size().to_numpy())
    assert np.array_equal(g.median(values), by.median().to_numpy())
    assert np.array_equal(g.max(values), by.max().to_numpy().astype(float))
    assert np.array_equal(g.sum(values), np.bincount(np.unique(keys, return_inverse=True)[1],
                                                     np.asarray(values, float)))
    assert np.allclose(g.mean(values), by.mean().to_numpy())
    assert np.array_equal(g.inv, np.unique(keys, return_inverse=True)[1].reshape(-1))


def test_steps_of_a_rank_major_table_are_columns_of_one_table():
    """Every rank with the same steps, rank after rank: step groups are the columns of a
    (ranks x steps) table; ints and floats, odd and even rank counts, as pandas says."""
    rng = np.random.default_rng(1)
    for ranks in (1, 2, 7):
        steps = np.array([3, 4, 5, 9, 12])
        keys = np.tile(steps, ranks)
        g = Groups(keys)
        assert g._width == (steps.size if ranks > 1 else 0)
        _as_pandas(g, keys, rng.integers(0, 10**12, keys.size))
        _as_pandas(g, keys, rng.random(keys.size))


def test_steps_that_are_not_one_run_repeated_are_grouped_as_any_keys():
    rng = np.random.default_rng(2)
    for keys in (np.array([0, 1, 2, 0, 1, 2, 0, 1]),      # the last rank lacks a step
                 np.array([0, 1, 2, 0, 2, 1, 0, 1, 2]),   # one rank in another order
                 np.array([0, 1, 2, 0, 1, 3, 0, 1, 2])):  # one rank with another step
        g = Groups(keys)
        assert g._width == 0
        _as_pandas(g, keys, rng.integers(0, 10**9, keys.size))


@pytest.mark.parametrize("spread", [1, 10**6])  # a small grid (the table), a sparse one (sort)
def test_find_pairs_matches_a_pandas_merge(spread):
    from gpuscope.analyze.rowgroups import find_pairs

    rng = np.random.default_rng(3)
    ranks, steps = np.meshgrid(np.arange(7), np.arange(40) * spread, indexing="ij")
    keys = pd.DataFrame({"rank": ranks.ravel(), "step": steps.ravel()}).sample(frac=0.8,
                                                                                random_state=1)
    keys = keys.reset_index(drop=True)
    a = rng.integers(0, 8, 3000)
    b = rng.integers(0, 41, 3000) * spread
    hit, at = find_pairs(keys["rank"].to_numpy(), keys["step"].to_numpy(), a, b)
    want = pd.DataFrame({"rank": a, "step": b}).merge(
        keys.reset_index(names="at"), how="left", on=["rank", "step"])
    assert hit.tolist() == want["at"].notna().tolist()
    assert 0 < hit.sum() < hit.size
    assert at[hit].tolist() == want["at"][hit].astype(int).tolist()


def test_per_rank_helpers_match_pandas_in_any_order():
    """warm_rows, step_by_rank and count_distinct, on rank-sorted frames (their fast paths) and
    on the same rows shuffled, against pandas' cumcount, groupby min/max and nunique."""
    from gpuscope.analyze.rowgroups import count_distinct, step_by_rank, warm_rows

    rng = np.random.default_rng(7)
    for trial in range(100):
        counts = rng.integers(1, 8, rng.integers(1, 6))
        ranks = np.repeat(np.sort(rng.choice(50, counts.size, replace=False)), counts)
        steps = np.concatenate([np.sort(rng.choice(100, c, replace=False)) for c in counts])
        sorted_ = pd.DataFrame({"rank": ranks, "step": steps})
        for frame in (sorted_, sorted_.sample(frac=1, random_state=trial)):
            position = frame.groupby("rank").cumcount().to_numpy()
            for n in (0, 1, 2, 10):
                assert np.array_equal(warm_rows(frame, n), position < n)
            for how in ("min", "max"):
                assert step_by_rank(frame, how) == getattr(frame.groupby("rank")["step"],
                                                           how)().to_dict()
            assert count_distinct(frame["rank"].to_numpy()) == frame["rank"].nunique()
            assert count_distinct(frame["step"].to_numpy()) == frame["step"].nunique()


def test_the_collectives_summed_per_rank_and_key_with_rows_left_out_are_pandas_sums():
    """rank_summary._cell_sums: one key (all rows by rank, less the few left out) and several
    keys (a cell per rank and key) give pandas' sums over the kept rows, counts too."""
    from gpuscope.analyze.rank_summary import _cell_sums

    rng = np.random.default_rng(8)
    n = 500
    w = rng.integers(0, 10**9, n)
    for n_keys, r in ((1, np.sort(rng.integers(0, 7, n))), (3, np.sort(rng.integers(0, 7, n))),
                      (1, rng.integers(0, 7, n))):  # sorted ranks (runs), and not (a count)
        code = rng.integers(0, n_keys, n)
        ok = rng.random(n) > 0.05
        summed = _cell_sums(r, code, ok, n_keys)
        df = pd.DataFrame({"cell": r * n_keys + code, "w": w})[ok]
        want = df.groupby("cell")["w"].sum().reindex(range(7 * n_keys), fill_value=0)
        assert summed(w).tolist() == want.astype(float).tolist()
        count = df.groupby("cell").size().reindex(range(7 * n_keys), fill_value=0)
        assert summed(None).tolist() == count.astype(float).tolist()


def test_run_starts_says_sorted_keys_runs_and_nothing_else():
    """run_starts against the plain definition on short random keys, sorted and not (its
    sample check and its one-pass check of where runs end)."""
    from gpuscope.analyze.rowgroups import run_starts

    rng = np.random.default_rng(11)
    for _ in range(500):
        k = np.sort(rng.integers(0, 5, rng.integers(1, 40)))
        if rng.random() < 0.5:
            rng.shuffle(k)
        want = (np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
                if bool((k[1:] >= k[:-1]).all()) else None)
        got = run_starts(k)
        assert (got is None and want is None) or np.array_equal(got, want)
    big = np.repeat(np.arange(3000), 7)
    assert np.array_equal(run_starts(big), np.arange(0, big.size, 7))
    big[-1] = 0  # the last value out of order: past the sample, caught by the full check
    assert run_starts(big) is None
    assert run_starts(np.tile(np.arange(1000), 30)) is None  # a rank-major table's steps
