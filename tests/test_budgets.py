"""The analysis's budgets, held from change to change (issue 68): a generated run dir of 2,000
ranks x 500 steps (benchmarks/bench_scale.make_run: the recorder's own writer, rank 17 slow),
read once, analysed, measured by what a busy machine does not move:

- memory: the analysis's peak of traced allocations (tracemalloc: numpy's and Python's, the
  same on any machine and load) over the table it analyses, against a budget in units of that
  table's own size;
- time: the analysis's CPU time as a ratio to a reference in the same process, on the same
  table: plain pandas and numpy passes over it (medians per step, means per rank, each part
  sorted). CPU, not wall: a second process on the core stretches wall time, not the work done;
  and the two are the same kind of work, so a slower or busier machine moves both.

32a8a46's analysis (the paired tests and floors on DataFrames) peaked at 1.24x its table here,
and took 3.2-3.8x the reference (quiet), 3.6-4.2x (load 4); 7c68f51's peaked at 0.86x, c8bddab's
at 0.42x, 94d11df's at 0.37x; this code's at 0.24x (its row-wise statistics some rows at a time),
and takes 1.8-2.3x. The budgets: 0.32x and 3.1x. The figures at 10,000 ranks are
benchmarks/bench_scale.py's.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import tracemalloc

import numpy as np
import pytest

from gpuscope.analyze import run
from gpuscope.readers import read_path
from gpuscope.runtable import TIME_COLUMNS
from gpuscope.thresholds import Thresholds

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

RANKS, STEPS = 2000, 500
MEMORY_BUDGET = 0.32  # x the analysed table's bytes (frame + collectives)
TIME_BUDGET = 3.1  # x the CPU time of reading the run dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from bench_scale import make_run

    path = str(tmp_path_factory.mktemp("budget") / "run")
    make_run(path, RANKS, STEPS)
    return path


def _table_bytes(table) -> int:
    held = int(table.frame.memory_usage(deep=True).sum())
    if table.comm is not None:
        held += int(table.comm.memory_usage(deep=True).sum())
    return held


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def test_the_analysis_peaks_within_its_table_s_size(run_dir):
    table = read_path(run_dir)
    held = _table_bytes(table)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        report = run.analyze_table(table, Thresholds(), own=True)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert report.verdict.label == "imbalanced" and [s.rank for s in report.stragglers] == [17]
    assert peak <= MEMORY_BUDGET * held, \
        f"the analysis peaked at {peak / held:.2f}x its table ({peak / 2**20:.0f} MB over " \
        f"{held / 2**20:.0f} MB); the budget is {MEMORY_BUDGET}x"


def _reference(frame) -> None:
    """The same kind of work as the analysis's, by pandas and numpy alone: the step parts'
    medians per step and means per rank, and each part sorted."""
    cols = [c for c in TIME_COLUMNS if c in frame]
    frame.groupby("step")[cols].median()
    frame.groupby("rank")[cols].mean()
    for c in cols:
        np.sort(frame[c].to_numpy())


def test_the_analysis_costs_a_few_passes_of_plain_pandas_over_its_table(run_dir):
    table = read_path(run_dir)
    gc.collect()
    c = _cpu()
    _reference(table.frame)
    reference_s = _cpu() - c
    c = _cpu()
    report = run.analyze_table(table, Thresholds(), own=True)
    ratio = (_cpu() - c) / reference_s
    assert report.verdict.label == "imbalanced"
    assert ratio <= TIME_BUDGET, \
        f"the analysis took {ratio:.2f}x the CPU time of the reference passes; the budget is " \
        f"{TIME_BUDGET}x"
