"""Op timelines (readers/optimeline.py): a table of operations per rank and step, as large jobs
keep them, read into the rank x step table. Hand-built timelines with answers worked out here;
the published jobs (sample_traces/external/bytedance_whatif_*) are checked against the paper's
answers in tests/test_accuracy_corpus.py."""

import os

import numpy as np
import pandas as pd
import pytest

import gpuscope
from gpuscope.errors import InputError
from gpuscope.readers import read_path
from gpuscope.readers.optimeline import SYNC_KEY, union_ns

MS = 1_000_000


def _write(tmp_path, rows, meta="dp_size: 2\npp_size: 2\ntp_size: 1\nworld_size: 4\n"):
    d = tmp_path / "job"
    d.mkdir()
    pd.DataFrame(rows, columns=["rank", "dp_rank", "stage", "step", "optype", "start_ts",
                                "duration"]).to_csv(d / "trace-x.csv", index=False)
    if meta is not None:
        (d / "meta-x.yaml").write_text(meta)
    return d


def _one_step(step, slow=0.0):
    """2 data-parallel x 2 stages, times in seconds from the step's start: stage 0 forwards
    (10 ms), sends; stage 1 receives, computes (20 ms + `slow` on rank 3), sends back; stage 0
    receives and runs backward (10 ms); then each stage's ranks reduce-scatter (2 ms of transfer
    after the last one arrives)."""
    rows = []
    for dp in (0, 1):
        r0, r1 = dp, 2 + dp
        extra = slow if r1 == 3 else 0.0
        rows += [(r0, dp, 0, step, "forward-compute", 0.000, 0.010),
                 (r0, dp, 0, step, "forward-send", 0.010, 0.001),
                 (r1, dp, 1, step, "forward-recv", 0.000, 0.011),
                 (r1, dp, 1, step, "forward-compute", 0.011, 0.010 + extra),
                 (r1, dp, 1, step, "backward-compute", 0.021 + extra, 0.010),
                 (r1, dp, 1, step, "backward-send", 0.031 + extra, 0.001),
                 (r0, dp, 0, step, "backward-recv", 0.011, 0.021 + extra),
                 (r0, dp, 0, step, "backward-compute", 0.032 + extra, 0.010)]
    end0 = 0.042 + slow  # stage 0's ranks both wait for the slow pipeline's backward
    end1 = 0.032 + slow
    for dp in (0, 1):
        r0, r1 = dp, 2 + dp
        mine1 = 0.032 + (slow if r1 == 3 else 0.0)
        rows += [(r0, dp, 0, step, "grads-reduce-scatter", 0.042 + (slow if dp == 1 else 0.0)
                  if dp == 1 else 0.042, end0 - (0.042 + (slow if dp == 1 else 0.0)) + 0.002
                  if dp == 1 else end0 - 0.042 + 0.002),
                 (r1, dp, 1, step, "grads-reduce-scatter", mine1, end1 - mine1 + 0.002),
                 (r0, dp, 0, step, "optimizer", end0 + 0.002, 0.003),
                 (r1, dp, 1, step, "optimizer", end1 + 0.002, 0.003)]
    return rows


def test_a_small_pipeline_reads_into_parts_that_add_up(tmp_path):
    run = _write(tmp_path, [r for s in range(4) for r in _one_step(s)])
    t = read_path(str(run))
    assert t.source == "timeline" and t.world_size == 4 and sorted(t.ranks) == [0, 1, 2, 3]
    f = t.frame.set_index(["rank", "step"])
    r0 = f.loc[(0, 1)]
    # stage 0: forward 10 + backward 10 + optimizer 3 ms of compute; the step ends at 47 ms
    assert r0["compute_ns"] == 23 * MS and r0["forward_ns"] == 10 * MS
    assert r0["step_ns"] == 47 * MS
    # its send (1 ms) and the wait for the backward (21 ms, from 11 to 32): 22 ms exposed,
    # all pipeline (bubble); the reduce-scatter 2 ms more
    assert r0["bubble_ns"] == 22 * MS and r0["comm_exposed_ns"] == 24 * MS
    assert (f["compute_ns"] + f["comm_exposed_ns"] + f["other_ns"] <= f["step_ns"]).all()
    # stage 1 ends at 37 ms: the 10 ms it idles until the step ends is waiting for stage 0,
    # in a synchronization the timeline does not hold (stage 0 idles least: none)
    sync = t.comm[t.comm["key"] == SYNC_KEY].set_index(["rank", "step"])["exposed_ns"]
    assert (sync.loc[[0, 1]] == 0).all() and (sync.loc[[2, 3]] == 10 * MS).all()
    # the layout: a process group per stage, the pipelines from the send / recv peers
    assert t.ranks[0].knobs["process_groups"] == {"dp.stage0": [0, 1], "dp.stage1": [2, 3]}
    keys = set(t.comm[t.comm["rank"] == 0]["key"])
    assert {"sendrecv_next:2", "reduce_scatter:dp.stage0"} <= keys
    rep = gpuscope.analyze(str(run))
    assert rep.to_dict()["layout"]["pipelines"] == [[0, 2], [1, 3]]
    assert rep.verdict.label == "pipeline-bound"


def test_a_slow_rank_is_named_and_idle_ranks_wait_for_it(tmp_path):
    """Rank 3 computes 30 ms longer every step: its pipeline's stage 0 (rank 1) waits for it in
    its receive, the other pipeline's ranks in the reduce-scatters; rank 3 is the straggler."""
    run = _write(tmp_path, [r for s in range(6) for r in _one_step(s, slow=0.030)])
    rep = gpuscope.analyze(str(run))
    assert rep.straggler_ranks == [3], rep.verdict.time_by_label
    top = rep.suggestions[0]
    assert top.knob == "straggler" and "rank 3" in top.current


def test_idle_time_beyond_the_least_idle_rank_is_waiting():
    """A rank that runs none of its ops for 30 ms while the others run theirs waits in a
    synchronization the timeline lacks: that is waiting (an all-ranks key), not other."""
    import tempfile

    rows = []
    for s in range(3):
        rows += [(0, 0, 0, s, "forward-compute", 0.0, 0.040),
                 (1, 1, 0, s, "forward-compute", 0.0, 0.010),
                 (1, 1, 0, s, "optimizer", 0.038, 0.002),
                 (0, 0, 0, s, "optimizer", 0.040, 0.002)]
    with tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path

        run = _write(Path(tmp), rows, meta="world_size: 2\n")
        t = read_path(str(run))
        f = t.frame.set_index(["rank", "step"])
        assert f.loc[(1, 0), "comm_exposed_ns"] == 30 * MS  # idle 10-38 and 40-42, rank 0 none
        assert f.loc[(0, 0), "comm_exposed_ns"] == 0
        rep = gpuscope.analyze(str(run))
        r1 = next(r for r in rep.ranks if r.rank == 1)
        assert r1.wait_pct > 60 and rep.straggler_ranks == [0]


def test_union_lengths_match_a_brute_force_count():
    rng = np.random.default_rng(3)
    n_groups = 40
    start = rng.integers(0, 1000, 600)
    end = start + rng.integers(0, 200, 600)
    group = rng.integers(0, n_groups, 600)
    got = union_ns(start, end, group, n_groups)
    for g in range(n_groups):
        covered = np.zeros(1300, dtype=bool)
        for a, b in zip(start[group == g], end[group == g]):
            covered[a:b] = True
        assert got[g] == covered.sum(), g


def test_bad_tables_get_one_clear_error_or_a_warning(tmp_path):
    d = tmp_path / "nocol"
    d.mkdir()
    pd.DataFrame({"rank": [0], "step": [0], "duration": [1.0]}).to_csv(d / "t.csv", index=False)
    with pytest.raises(InputError, match="no column optype, start_ts"):
        read_path(str(d))
    rows = [r for s in range(3) for r in _one_step(s)]
    rows.append((0, 0, 0, 1, "forward-compute", float("nan"), 0.01))
    rows.append((0, 0, 0, 1, "checkpoint-save", 0.0, 0.001))
    t = read_path(str(_write(tmp_path, rows)))
    assert any("1 row(s) with no usable" in w for w in t.warnings)
    assert any("checkpoint-save not known: counted as other" in w for w in t.warnings)
    bad_meta = tmp_path / "badmeta"
    bad_meta.mkdir()
    pd.DataFrame(rows[:5], columns=["rank", "dp_rank", "stage", "step", "optype", "start_ts",
                                    "duration"]).to_csv(bad_meta / "trace-y.csv", index=False)
    (bad_meta / "meta-y.yaml").write_text("time_unit: fortnights\n")
    with pytest.raises(InputError, match="time_unit"):
        read_path(str(bad_meta))


def test_a_table_given_as_a_file_finds_its_layout_and_the_cli_reads_it():
    path = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "external",
                        "bytedance_whatif_ST", "trace-ST.parquet")
    t = read_path(path)
    assert t.world_size == 8 and t.ranks[0].knobs["pp_size"] == 4
    from gpuscope.cli import main

    assert main(["analyze", path, "-q"]) == 0


def test_ranks_the_timeline_leaves_out_are_said(tmp_path):
    rows = [r for s in range(3) for r in _one_step(s)]
    t = read_path(str(_write(tmp_path, rows, meta="dp_size: 2\npp_size: 2\ntp_size: 2\n"
                                                  "world_size: 8\n")))
    assert any("holds 4 of the 8 ranks (one per tensor-parallel group of 2" in w
               for w in t.warnings)
