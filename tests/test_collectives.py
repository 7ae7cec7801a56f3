"""The wait split from collectives (readers' per-collective table + analyze/wait.py, one rule
for traces and records): waiting vs transfer, hidden waiting free, mismatches left out and
reported, never fatal, never flipping who was late."""

import pandas as pd

from gpuscope.analyze.wait import estimate_wait
from gpuscope.readers.kineto.collectives import comm_table

MS = 1_000_000


def _frame(exposed: dict) -> pd.DataFrame:
    rows = [{"rank": r, "step": s, "comm_exposed_ns": e, "wait_ns": 0}
            for (r, s), e in exposed.items()]
    return pd.DataFrame(rows)


def _waits(colls, exposed, warnings=None):
    """{(rank, step): wait} from {rank: [(step, key, dur, end, exposed)]}."""
    out = estimate_wait(_frame(exposed), warnings if warnings is not None else [],
                        comm_table(colls))
    return {(r, s): w for r, s, w in zip(out["rank"], out["step"], out["wait_ns"])}


def test_the_table_names_kinds_as_the_recorder_does():
    t = comm_table({0: [(1, ("0", "allreduce"), 5, 9, 4), (1, ("0", "allreduce"), 3, 12, 1),
                        (1, ("", "gloo:_allgather_base"), 2, 14, 2)]})
    assert t.to_dict("records") == [
        {"rank": 0, "step": 1, "key": "all_gather:", "comm_ns": 2, "exposed_ns": 2, "count": 1,
         "grads_exposed_ns": 0},
        {"rank": 0, "step": 1, "key": "all_reduce:0", "comm_ns": 8, "exposed_ns": 5, "count": 2,
         "grads_exposed_ns": 0}]
    assert comm_table({0: [], 1: []}) is None


def test_the_least_exposed_is_transfer_the_excess_is_waiting():
    colls = {0: [(1, ("0", "allreduce"), 30 * MS, 0, 30 * MS), (1, ("0", "allreduce"), 5 * MS, 0, 5 * MS)],
             1: [(1, ("0", "allreduce"), 10 * MS, 0, 10 * MS), (1, ("0", "allreduce"), 5 * MS, 0, 5 * MS)]}
    warnings = []
    w = _waits(colls, {(0, 1): 40 * MS, (1, 1): 15 * MS}, warnings)
    assert w == {(0, 1): 20 * MS, (1, 1): 0}
    assert warnings == []


def test_waiting_hidden_behind_compute_costs_nothing():
    # rank 0's all-reduce lasts 50 ms but runs beside its own backward: 10 ms of it exposed;
    # rank 1's 5 ms are all exposed. A duration rule would say rank 0 waited 45 (capped at 10)
    colls = {0: [(1, ("", "gloo:all_reduce"), 50 * MS, 0, 10 * MS)],
             1: [(1, ("", "gloo:all_reduce"), 5 * MS, 0, 5 * MS)]}
    assert _waits(colls, {(0, 1): 10 * MS, (1, 1): 5 * MS}) == {(0, 1): 5 * MS, (1, 1): 0}


def test_missing_and_extra_collectives_are_left_out_and_reported():
    # rank 2 has an extra all-reduce in step 1, rank 0 a broadcast no one else has
    colls = {0: [(1, ("0", "allreduce"), 30 * MS, 0, 30 * MS), (1, ("0", "broadcast"), 9 * MS, 0, 9 * MS)],
             1: [(1, ("0", "allreduce"), 10 * MS, 0, 10 * MS)],
             2: [(1, ("0", "allreduce"), 12 * MS, 0, 12 * MS), (1, ("0", "allreduce"), 3 * MS, 0, 3 * MS)]}
    warnings = []
    w = _waits(colls, {(0, 1): 40 * MS, (1, 1): 20 * MS, (2, 1): 20 * MS}, warnings)
    assert w == {(0, 1): 0, (1, 1): 0, (2, 1): 0}
    assert len(warnings) == 1 and "1 (collective, step) pair(s)" in warnings[0]


def test_an_instance_cut_on_the_waiting_rank_does_not_make_it_late():
    # rank 0 waits ~20 ms for rank 1 every step in the second of two all-reduces; in step 3 a
    # profiler cycle cut rank 0's second all-reduce off: compared by sums, rank 0 would look
    # like the late one (5 against 6 ms); left out, step 3 says nothing
    ar = ("0", "allreduce")
    colls = {0: [(s, ar, 5 * MS, 0, 5 * MS) for s in (1, 2, 3)]
             + [(s, ar, 21 * MS, 0, 21 * MS) for s in (1, 2)],
             1: [(s, ar, 5 * MS, 0, 5 * MS) for s in (1, 2, 3)]
             + [(s, ar, 1 * MS, 0, 1 * MS) for s in (1, 2, 3)]}
    exposed = {(0, 1): 26 * MS, (0, 2): 26 * MS, (0, 3): 5 * MS,
               (1, 1): 6 * MS, (1, 2): 6 * MS, (1, 3): 6 * MS}
    w = _waits(colls, exposed)
    assert w[(0, 1)] == w[(0, 2)] == 20 * MS
    assert w[(1, 1)] == w[(1, 2)] == w[(1, 3)] == 0


def test_one_rank_has_nothing_to_match():
    assert _waits({0: [(1, ("", "x"), 5, 0, 5)]}, {(0, 1): 5}) == {(0, 1): 0}


def test_a_rank_s_collectives_kept_as_columns_give_the_same_table_and_sync_points():
    """A summary keeps its rank's collective instances as columns (Colls: ~44 bytes an
    instance, not a tuple of Python ints): the table and the sync points are those of the
    tuples, in order, the optional gradient field included."""
    from gpuscope.readers.kineto.colls import Colls
    from gpuscope.readers.kineto.collectives import sync_points

    r0 = [(1, ("0", "allreduce"), 5, 9, 4, 2), (1, ("0", "allreduce"), 3, 12, -1, 0),
          (2, ("", "gloo:_allgather_base"), 2, 14, 2, 1), (2, ("0", "allreduce"), 7, 30, 6, 6)]
    r1 = [(1, ("0", "allreduce"), 6, 11, 5), (2, ("0", "allreduce"), 8, 31, 1)]  # no grads
    cols = {0: Colls.of(r0), 1: Colls.of(r1)}
    assert list(cols[0].tuples()) == r0 and cols[0].keys == [("0", "allreduce"),
                                                              ("", "gloo:_allgather_base")]
    assert [t[:5] for t in cols[1].tuples()] == r1 and cols[1].grads.tolist() == [0, 0]
    assert comm_table(cols).equals(comm_table({0: r0, 1: r1}))
    assert comm_table({0: Colls.of([]), 1: cols[1]}).equals(comm_table({1: r1}))
    assert sync_points(cols) == ([0, 0, 0, 0, 1, 1],
                                 [(1, "('0', 'allreduce')", 0), (1, "('0', 'allreduce')", 1),
                                  (2, "('', 'gloo:_allgather_base')", 0),
                                  (2, "('0', 'allreduce')", 0), (1, "('0', 'allreduce')", 0),
                                  (2, "('0', 'allreduce')", 0)], [9, 12, 14, 30, 11, 31])
    table = comm_table(cols)
    assert table.loc[(table["rank"] == 0) & (table["step"] == 1), "exposed_ns"].tolist() == [4]
