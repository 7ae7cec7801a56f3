"""The fault benchmark's CI subset (benchmarks/faults/): one row per kind of fault, 2 or 3 ranks,
DDP on gloo, a rank slowed by a step's worth in a known place, recorded and profiled in the same
run. Each source must name the slowed rank first (or say it is not sure: low confidence, named
probably), with the cause, and name no one in the control and the rotating rows. The whole table,
with random ranks and 5% to 100% faults, estimates against re-runs, is `make bench-faults`."""

import os
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "faults")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import run as faults  # noqa: E402
from score import score, truth  # noqa: E402

_BASE: dict = {}


def _base_ms(tmp_path_factory, world: int) -> float:
    """The step of an unslowed run of this size (the faults are sized on it), once per session."""
    if world not in _BASE:
        out = str(tmp_path_factory.mktemp(f"control{world}"))
        faults.train(out, "ddp", world, "control", [], 0.0, timeout=300)
        _BASE[world] = truth(out)["step_ms"]
    return _BASE[world]


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k in faults.KINDS if k != "control"] + ["control"])
def test_each_kind_of_fault_is_found_from_both_sources(kind, tmp_path, tmp_path_factory):
    world = 3 if kind == "two" else 2
    # a whole step's worth: a margin over what a shared, busy machine does to one rank
    row = {"kind": kind, "ranks": [0, 2] if kind == "two" else [1], "fraction": 1.0}
    fault, ranks, ms, workers = faults.fault_args(row, _base_ms(tmp_path_factory, world))
    faults.train(str(tmp_path), "ddp", world, fault, ranks, ms, workers, timeout=300)
    t = truth(str(tmp_path))
    got = faults.reports(str(tmp_path))
    said = {src: {k: rep.get(k) for k in ("verdict", "confidence", "stragglers",
                                           "probable_stragglers", "error")}
            for src, rep in got.items()}
    for src, rep in got.items():
        assert "error" not in rep, said
        s = score(kind, t, rep, None)
        assert s["right"], f"{src}: {s}; {said}"
        if s["straggler"] and s["cause"] is not None:
            assert s["cause"], f"{src}: cause {s.get('cause_got')}; {said}"
