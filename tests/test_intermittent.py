"""A rank late in one step of five, in a generated 128-rank DDP run (the fault benchmark's
writer, benchmarks/faults/many.py): said as intermittent lateness, with its rank, spacing and
excess, in the note, the JSON and the advice alike; and scored right by the benchmark's scorer."""

import json
import os
import random
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                    "faults")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import many  # noqa: E402
from score import score  # noqa: E402

import gpuscope  # noqa: E402
from gpuscope.results import Jitter  # noqa: E402
from helpers import rerun_band


@pytest.mark.parametrize("ms", [20.0, 40.0])
def test_a_rank_late_every_fifth_step_among_128_is_said_so(tmp_path, ms):
    rng = random.Random(1)
    (slowed,) = rng.sample(range(128), 1)
    t = many.timings(128, 48, 1)
    job = many.synchronous(t, many.added("intermittent", 128, 48, [slowed], int(ms * 1e6)),
                           "fwd")
    many.write(str(tmp_path / "run"), job, 128, 48)
    rep = gpuscope.analyze(str(tmp_path / "run"))
    late = rep.jitter.intermittent
    assert late["rank"] == slowed and late["every"] == 5
    assert late["late_steps"] == list(range(2, 48, 5))  # step 0 is warm-up
    assert late["excess_ms"] == pytest.approx(ms, rel=0.15)
    assert not rep.straggler_ranks
    note = rep.jitter.note(rep.straggler_ranks)
    assert f"rank {slowed} arrived last in 10" in note and "every 5 steps" in note
    jit = [s for s in rep.suggestions if s.knob == "rank_jitter"]
    assert jit and f"rank {slowed}" in jit[0].current and f"rank {slowed}" in jit[0].why
    # its lateness per step on average goes: the step less 10 late steps' excess over 47
    step_ms = rep.step_ns / 1e6
    assert jit[0].estimated_step_ms == pytest.approx(step_ms - late["excess_ms"] * 10 / 47,
                                                     abs=0.05)
    lo, hi = jit[0].estimated_step_ms_range
    # the range's top: the step as it is, widened by a re-run's noise (rerun_noise.py)
    assert lo < jit[0].estimated_step_ms < hi
    assert hi / (1 + rerun_band(rep)) == pytest.approx(step_ms, abs=0.05)
    d = rep.to_dict()
    assert d["jitter"]["intermittent"]["rank"] == slowed
    assert Jitter.from_dict(json.loads(json.dumps(d["jitter"]))).intermittent == late
    truth = {"fault": "intermittent", "slowed": [slowed], "ms": ms, "world": 128,
             "added_ms": {slowed: ms / 5}, "local_ms": {}, "data_ms": {}}
    clean = many.synchronous(t, many.added("control", 128, 48, [], 0), None)
    got = score("intermittent", truth, d, float(clean["step"][0, 1:].mean()) / 1e6)
    assert got["right"] and got["straggler"] and got["excess"] and got["estimate"]


def test_steady_jitter_among_128_names_no_intermittent_rank(tmp_path):
    job = many.synchronous(many.timings(128, 48, 2), many.added("control", 128, 48, [], 0), None)
    many.write(str(tmp_path / "run"), job, 128, 48)
    assert gpuscope.analyze(str(tmp_path / "run")).jitter.intermittent is None


def test_the_jitter_line_names_its_basis():
    """Issue 71, 8.: "19.1% of step time is spent waiting" sat beside a wait column of 8% and
    13%: the line's figure is the rank that waits longest in each step, the column each rank's
    own; the line says so."""
    from gpuscope.results import Jitter

    for line in (Jitter(0.5, 0.191).note(), Jitter(0.5, 0.191).note([3]),
                 Jitter(0.5, 0.191, {"rank": 1, "late_steps": [2, 5], "of_steps": 3, "steps": 20,
                                     "every": None, "excess_ms": 4.0}).note()):
        assert "19.1% of step time is spent waiting by the rank that waits longest" in line
