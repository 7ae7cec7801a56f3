"""Matching collectives across ranks: waiting vs transfer, and mismatches reported, not fatal."""

import pandas as pd

from gpuscope.readers.kineto.collectives import match_collectives

MS = 1_000_000


def _frame(exposed: dict) -> pd.DataFrame:
    rows = [{"rank": r, "step": s, "comm_exposed_ns": e, "wait_ns": 0}
            for (r, s), e in exposed.items()]
    return pd.DataFrame(rows)


def test_the_shortest_duration_is_transfer_the_excess_is_waiting():
    colls = {0: [(1, ("0", "allreduce"), 30 * MS), (1, ("0", "allreduce"), 5 * MS)],
             1: [(1, ("0", "allreduce"), 10 * MS), (1, ("0", "allreduce"), 5 * MS)]}
    frame = _frame({(0, 1): 40 * MS, (1, 1): 15 * MS})
    warnings = []
    out = match_collectives(colls, frame, warnings).set_index("rank")
    assert out.loc[0, "wait_ns"] == 20 * MS and out.loc[1, "wait_ns"] == 0
    assert warnings == []


def test_waiting_is_capped_by_exposed_communication():
    colls = {0: [(1, ("", "gloo:all_reduce"), 50 * MS)], 1: [(1, ("", "gloo:all_reduce"), 5 * MS)]}
    out = match_collectives(colls, _frame({(0, 1): 10 * MS, (1, 1): 5 * MS}), [])
    assert out.set_index("rank").loc[0, "wait_ns"] == 10 * MS  # the rest was hidden by compute


def test_missing_and_extra_collectives_are_reported_and_the_rest_matched():
    colls = {0: [(1, ("0", "allreduce"), 30 * MS), (1, ("0", "broadcast"), 9 * MS)],
             1: [(1, ("0", "allreduce"), 10 * MS)],
             2: [(1, ("0", "allreduce"), 12 * MS), (1, ("0", "allreduce"), 3 * MS)]}
    frame = _frame({(0, 1): 40 * MS, (1, 1): 20 * MS, (2, 1): 20 * MS})
    warnings = []
    out = match_collectives(colls, frame, warnings).set_index("rank")
    assert out.loc[0, "wait_ns"] == 20 * MS and out.loc[2, "wait_ns"] == 2 * MS
    assert len(warnings) == 1 and "2 collective instance(s) are not present" in warnings[0]


def test_one_rank_has_nothing_to_match():
    out = match_collectives({0: [(1, ("", "x"), 5)]}, _frame({(0, 1): 5}), [])
    assert (out["wait_ns"] == 0).all()
