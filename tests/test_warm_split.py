"""The warm-up set apart as a big run dir is read (readers/warm_split.py, analyze/warm_split.py):
the report is the one the whole table gives, whether the split is used or put back.

Run dirs are written with the recorder's own writer; the reader's two-process path (the one
that places rows in a shared block, where the split happens) is taken from 4 files here
instead of 64."""

import os

import numpy as np
import pytest

from gpuscope.analyze.run import analyze_table
from gpuscope.readers import read_path
from gpuscope.readers.rundir import parallel_load
from gpuscope.readers.speed import forks
from gpuscope.record.writer import RecordWriter
from gpuscope.run_format import SCHEMA, STEP_COLUMNS
from gpuscope.thresholds import Thresholds

RANKS, STEPS = 8, 40


@pytest.fixture(autouse=True)
def _two_processes(monkeypatch):
    if not forks():
        pytest.skip("the reader places rows in a shared block only where it forks (2+ cores)")
    monkeypatch.setattr(parallel_load, "PARALLEL_MIN_FILES", 4)


def _write(path, change=None, steps=STEPS, knobs=None, seed=0):
    """RANKS ranks of DDP-like steps, rank 5 slower; change(rank, cols) may alter a rank's
    columns (a dict of arrays) or return None to write fewer rows."""
    rng = np.random.default_rng(seed)
    t0 = 1_790_000_000_000_000_000
    for rank in range(RANKS):
        n = steps
        slow = 1.3 if rank == 5 else 1.0
        fwd = (rng.normal(20e6, 1e6, n) * slow).astype(np.int64)
        bwd = (rng.normal(40e6, 2e6, n) * slow).astype(np.int64)
        opt = rng.integers(2_000_000, 2_500_000, n)
        data = rng.integers(1_000_000, 3_000_000, n)
        other = rng.integers(300_000, 900_000, n)
        compute = fwd + bwd + opt
        step = np.full(n, 100_000_000) + rng.integers(0, 2_000_000, n)
        exposed = np.maximum(step - data - compute - other, 500_000)
        step = data + compute + exposed + other
        comm = np.maximum(rng.integers(15_000_000, 18_000_000, n), exposed)
        cols = {"step": np.arange(n), "start_ns": t0 + np.r_[0, np.cumsum(step)[:-1]],
                "step_ns": step, "data_ns": data, "compute_ns": compute, "comm_ns": comm,
                "comm_exposed_ns": exposed, "other_ns": other, "forward_ns": fwd,
                "backward_ns": bwd, "optimizer_ns": opt, "n_comm": np.ones(n, np.int64),
                "data_cpu_ns": data // 10, "synced": np.ones(n, np.int64),
                "between_ns": np.zeros(n, np.int64)}
        if change is not None:
            cols = change(rank, cols)
        head = {"schema": SCHEMA, "rank": rank, "local_rank": rank, "world_size": RANKS,
                "host": "node0", "pid": 1000 + rank, "placement_source": "env",
                "run_id": "split", "recording": 1, "start_unix_ns": t0,
                "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
                "comm_timing": "ddp_comm_hook+collectives",
                "knobs": {"world_size": RANKS, "backend": "nccl", "device": "cuda",
                          **(knobs(rank) if knobs else {})}}
        writer = RecordWriter(str(path), rank)
        writer.MAX_PENDING = 1000
        writer.write_header(head)
        rows = np.column_stack([cols[c] for c in STEP_COLUMNS]).tolist()
        comm_of = cols["comm_ns"].tolist(), cols["comm_exposed_ns"].tolist()
        rows = [r + [{"_comm": {"all_reduce:ddp": [c, e, 1]}}] for r, c, e in zip(rows, *comm_of)]
        for i in range(0, len(rows), 16):
            writer.add_rows(rows[i:i + 16])
        writer.close({"steps": len(rows), "crashed": False})
        assert writer.error is None
    return str(path)


def _both(path, skip=None, steps=None):
    """(the analysis of a table read with its warm-up set apart, of one read whole; whether
    the split was made)."""
    th = Thresholds()
    warm = skip if skip is not None else 1
    table = read_path(path, warm=warm)
    split = table.warm is not None
    a = analyze_table(table, th, skip=skip, own=True, steps=steps).to_dict()
    b = analyze_table(read_path(path), th, skip=skip, own=False, steps=steps).to_dict()
    return a, b, split


def _differ(a, b):
    return [k for k in a if a[k] != b.get(k)]


def test_a_clean_run_is_split_and_reads_as_the_whole(tmp_path):
    a, b, split = _both(_write(tmp_path / "run"))
    assert split and not _differ(a, b)
    assert a["stragglers"] == [5] or [s["rank"] for s in a["stragglers"]] == [5], a["stragglers"]


@pytest.mark.parametrize("case", ["thin", "empty", "accumulation", "profiler", "counted",
                                  "short_rank",
                                  "unsorted", "skip", "window"])
def test_where_the_split_would_change_the_analysis_the_rows_are_put_back(tmp_path, case):
    """Each of prepare's steps that acts before the warm-up is left out, given something to
    act on in the set-apart rows or across both parts: the report is still the whole one."""
    change, knobs, skip, window = None, None, None, None
    if case == "thin":  # rank 2 alone records 3 more steps: thin over both parts
        def change(rank, cols):
            if rank != 2:
                return {k: v[:-3] for k, v in cols.items()}
            return cols
    elif case == "empty":  # a warm-up row of no length
        def change(rank, cols):
            if rank == 3:
                cols["step_ns"][0] = 0
            return cols
    elif case == "accumulation":  # no_sync micro-steps: optimizer every other step
        def change(rank, cols):
            cols["optimizer_ns"][::2] = 0
            cols["synced"][::2] = 0
            return cols
    elif case == "profiler":
        def knobs(rank):
            return {"profiler_trace_steps": [0]}  # in the warm-up: it moves
    elif case == "counted":
        def knobs(rank):
            return {"flops_counted_step": 0}
    elif case == "short_rank":  # one row: nothing of it is kept, it is not split
        def change(rank, cols):
            return {k: v[:1] for k, v in cols.items()} if rank == 6 else cols
    elif case == "unsorted":  # steps out of order in one file
        def change(rank, cols):
            if rank == 1:
                cols["step"] = cols["step"][::-1].copy()
            return cols
    elif case == "skip":
        skip = 3
    else:
        window = [(5, 30)]
    path = _write(tmp_path / "run", change, knobs=knobs)
    th = Thresholds()
    table = read_path(path, warm=1)
    assert (table.warm is not None) == (case not in ("short_rank", "unsorted"))
    a = analyze_table(table, th, skip=skip, own=True, steps=window).to_dict()
    b = analyze_table(read_path(path), th, skip=skip, own=False, steps=window).to_dict()
    assert not _differ(a, b), _differ(a, b)


def test_the_rows_put_back_are_the_table_as_read_whole(tmp_path):
    """WarmRows.merge gives the frame the reader gives without the split, value for value and
    column for column, its int columns one block again."""
    from gpuscope.analyze.warm_split import whole

    path = _write(tmp_path / "run")
    table = read_path(path, warm=2)
    assert table.warm is not None and len(table.warm.frame) == 2 * RANKS
    back, plain = whole(table), read_path(path)
    assert list(back.frame.columns) == list(plain.frame.columns)
    for c in plain.frame.columns:
        assert np.array_equal(back.frame[c].to_numpy(), plain.frame[c].to_numpy()), c
        assert back.frame[c].dtype == plain.frame[c].dtype, c
    block, names = back.int_block
    assert all(np.shares_memory(back.frame[n].to_numpy(), block) for n in names)
