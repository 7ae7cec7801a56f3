"""The GPU path's gate: what the recorder asks of CUDA per micro-step, counted through a fake of
its CUDA seams (benchmarks/cuda_seam.py: it counts, it runs nothing on a device), since a GPU is
rarely at hand. benchmarks/results/cuda_calls.json holds the counts of the committed recorder
(benchmarks/bench_cuda_calls.py writes it); a change that asks CUDA for more per step fails here
until the file is written again with the reason in the commit. The real calls' cost is measured
on a GPU (scripts/gpu_check.sh, docs/gpu.md).
"""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

from cuda_seam import calls_per_step  # noqa: E402

RESULTS = os.path.join(HERE, "..", "benchmarks", "results", "cuda_calls.json")


@pytest.fixture(scope="module")
def counted():
    return calls_per_step(192)


def test_no_more_cuda_calls_per_step_than_the_committed_recorder(counted):
    with open(RESULTS) as fh:
        gate = json.load(fh)
    for phase in ("young_per_step", "steady_per_step"):
        for call, n in counted[phase].items():
            assert n <= gate[phase].get(call, 0) + 1e-9, (phase, call, n, gate[phase])


def test_what_a_step_asks_of_cuda(counted):
    """Five events a step, each on the stream looked up once, at the first event (after the
    loop picked its device); no event made, no stream built, no synchronization, no flattened
    allocator statistics while training."""
    young = counted["young_steps"]
    looked_up = counted["at_start"].get("current_stream", 0) + round(
        counted["young_per_step"].get("current_stream", 0) * young)
    assert looked_up == 1 and counted["steady_per_step"].get("current_stream", 0) == 0
    for phase in ("young_per_step", "steady_per_step"):
        got = counted[phase]
        assert got.get("Event.record", 0) <= 5.05
        assert got.get("Event.record(no stream)", 0) == 0
        assert got.get("Event", 0) == 0
        assert got.get("synchronize", 0) == 0 and got.get("memory_stats", 0) == 0
        assert got.get("Event.elapsed_time", 0) <= 4.0 and got.get("Event.query", 0) <= 1.0
    # the allocator: one read in four young steps (then one a flush), each with its reset
    assert counted["young_per_step"]["_cuda_memoryStats"] == pytest.approx(0.25, abs=0.02)
    assert counted["steady_per_step"]["_cuda_memoryStats"] <= 1 / 32
