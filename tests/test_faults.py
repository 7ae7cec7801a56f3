"""The fault benchmark's CI subset (benchmarks/faults/): one row per kind of fault, 2 ranks (4 for
two slowed at once), DDP on gloo, a rank slowed by a step's worth in a known place, recorded and
profiled in the same run. Each source must name the slowed rank first (or say it is not sure:
low confidence, named probably), with the cause, and name no one in the control and the
rotating rows. The whole table, with random ranks and 5% to 100% faults, estimates against
re-runs, is `make bench-faults` (docs/accuracy.md).

Known gaps of a source (KNOWN_GAPS, issue 53) are marked xfail when that source misses, so the
summary shows them; the test fails if the other source misses. A control that names a rank
the loop's own clock does not show computing longer is run again (conftest.run_with_reruns,
said in the summary): on a loaded 2-core machine a rank can be preempted for a whole run."""

import os
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "faults")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import run as faults  # noqa: E402
from conftest import BALANCED_RERUNS, run_with_reruns  # noqa: E402
from score import score, truth  # noqa: E402

#: (source, kind) a source does not yet get right, with why
KNOWN_GAPS = {
    ("record", "intermittent"): "a rank late in one step of five is told as moving lateness "
                                "(jitter) or named only probably, not as one rank's few bad steps",
    # scored as a straggler since its workers leave 10% of the step or more (score.MATERIAL)
    ("record", "data_workers"): "a loader its workers hide in most steps leaves its rank late in "
                                "some steps only: told as jitter, or the rank named",
}
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
    world = 4 if kind == "two" else 2
    # a whole step's worth: a margin over what a shared, busy machine does to one rank
    row = {"parallel": "ddp", "kind": kind, "ranks": [0, 2] if kind == "two" else [1],
           "fraction": 1.0}
    fault, ranks, ms, workers = faults.fault_args(row, _base_ms(tmp_path_factory, world))

    def one(attempt):
        out = str(tmp_path / f"try{attempt}")
        faults.train(out, "ddp", world, fault, ranks, ms, workers, timeout=300)
        t = truth(out)
        got = faults.reports(out)
        return t, got, {src: ({"right": False, "error": rep["error"]} if "error" in rep
                              else score(kind, t, rep, None)) for src, rep in got.items()}

    def trouble(result):
        _, _, scores = result
        wrong = [s for s in scores.values() if s.get("named") and not s["right"]]
        if kind == "control" and wrong:
            return f"control: ranks {wrong[0]['named']} named, not longer by the loop's clock"
        return None

    tries = BALANCED_RERUNS + 1 if kind == "control" else 1
    t, got, scores = run_with_reruns(tries, one, trouble)
    said = {src: {k: rep.get(k) for k in ("verdict", "confidence", "stragglers",
                                           "probable_stragglers", "error")}
            for src, rep in got.items()}
    gaps = []
    for src, s in scores.items():
        if kind == "two" and not s["right"] and s["named"] and set(s["named"]) < set(ranks):
            # one of the two named, no other rank: in 8 profiled steps the two equally slowed
            # ranks take turns arriving last (the table counts this row wrong; CI accepts it)
            continue
        if not s["right"] and (src, kind) in KNOWN_GAPS:
            gaps.append(f"{src}: {KNOWN_GAPS[src, kind]}")
            continue
        assert s["right"], f"{src}: {s}; {said}"
        if s.get("straggler") and s.get("cause") is not None:
            assert s["cause"], f"{src}: cause {s.get('cause_got')}; {said}"
    if gaps:
        pytest.xfail("; ".join(gaps))


def test_a_small_fault_named_a_minor_straggler_is_right_without_an_estimate():
    """A rank slowed 2 ms a step in forward (5% of it): a report that names no straggler and
    rank 1 first among its minor ones, in forward, 2.1 ms busier, scores right (cause and excess
    checked), and its top suggestion is not taken for an estimate of the fault's fix; another
    rank named minor is wrong."""
    t = {"slowed": [1], "added_ms": {"1": 2.0}, "ms": 2.0, "kind": "forward"}
    report = {"verdict": "compute-bound", "confidence": "high", "stragglers": [],
              "probable_stragglers": [], "straggler_details": [],
              "minor_stragglers": [{"rank": 1, "late_ms": 2.0, "late_pct": 5.0, "excess_ms": 2.1,
                                    "cause": "compute", "cause_detail": "forward"}],
              "suggestions": [{"knob": "sync_frequency", "estimated_step_ms": 30.0}]}
    got = score("forward", t, report, 40.0)
    assert got["right"] and got["minor"] and got["cause"] and got["excess"]
    assert got["estimate"] is None
    other = dict(report, minor_stragglers=[dict(report["minor_stragglers"][0], rank=0)])
    assert not score("forward", t, other, 40.0)["right"]


def test_a_rank_named_probably_late_is_unsure_said_whatever_the_verdict_s_confidence():
    """A 3 ms fault in a data-bound run with gradient accumulation: the report is rightly sure
    the run is data-bound, and names the slowed rank probably a straggler (late in most steps,
    too few to confirm): it says the evidence cannot settle the rank, which counts as right,
    apart as unsure. Another rank named probably is wrong; so is no one named at medium
    confidence (the report claims more than it knows)."""
    t = {"slowed": [0], "added_ms": {"0": 3.0}, "ms": 0.75, "kind": "forward"}
    report = {"verdict": "data-bound", "confidence": "medium", "stragglers": [],
              "probable_stragglers": [0], "straggler_details": [], "minor_stragglers": [],
              "suggestions": []}
    got = score("forward", t, report, 35.0)
    assert got["right"] and got["unsure_said"] and not got["straggler"]
    assert not score("forward", t, dict(report, probable_stragglers=[1]), 35.0)["right"]
    assert not score("forward", t, dict(report, probable_stragglers=[]), 35.0)["right"]
    assert score("forward", t, dict(report, probable_stragglers=[], confidence="low"),
                 35.0)["unsure_said"]


def test_a_fault_the_steps_could_not_see_or_rule_out_is_unsure_when_said():
    """A 0.4 ms fault a step (1% of it) in a data-bound run: nobody named. The report that says
    its steps cannot tell a rank late by up to 2.5 ms from chance (straggler_floor) said it could
    not see it: unsure, right; one whose floor is under the fault claimed to see it and missed.
    A rank not ruled out as a straggler is unsure if it is the slowed one, wrong if another."""
    t = {"slowed": [1], "added_ms": {"1": 0.4}, "ms": 0.4, "kind": "forward"}
    report = {"verdict": "data-bound", "confidence": "high", "stragglers": [],
              "probable_stragglers": [], "straggler_details": [], "minor_stragglers": [],
              "suggestions": [], "straggler_floor": {"up_to_ms": 2.5, "pct": 6.0, "steps": 21}}
    got = score("forward", t, report, 35.0)
    assert got["right"] and got["unsure_said"] and got["below_floor"]
    assert not score("forward", t, dict(report, straggler_floor={"up_to_ms": 0.3, "pct": 1,
                                                                 "steps": 21}), 35.0)["right"]
    bare = {k: v for k, v in report.items() if k != "straggler_floor"}
    big = dict(t, added_ms={"1": 4.0})
    said = dict(bare, straggler_not_ruled_out={"rank": 1, "late_ms": 2.0, "up_to_ms": 6.0,
                                               "material_ms": 3.5, "steps": 21})
    assert score("forward", big, said, 35.0)["unsure_said"]
    other = dict(said, straggler_not_ruled_out=dict(said["straggler_not_ruled_out"], rank=0))
    assert not score("forward", big, other, 35.0)["right"]


def test_a_control_rank_slower_in_the_profiled_steps_alone_is_confirmed_there():
    """A control run on a busy machine: rank 0's own work is 20% longer in optimizer steps 2-5
    alone (its loader starved there), the same elsewhere. The traces (steps 2-5) name it: the
    loop's clock over those steps confirms it; a record over all 12 steps naming it is not
    confirmed (its median over them is its peers'). A record's step of 4 micro-steps is named
    by its last micro-step (11: optimizer step 2)."""
    from score import analysed_steps, clock_confirms

    per = {0: [30.0] * 12, 1: [30.0] * 12}
    for i in range(2, 6):
        per[0][i] = 36.0
    t = {"local_ms": {0: 30.0, 1: 30.0}, "local_steps_ms": per}
    traces = {"steps": [{"step": i} for i in range(2, 6)]}
    record = {"steps": [{"step": 4 * i + 3, "micro_steps": 4} for i in range(12)]}
    assert analysed_steps(traces) == [2, 3, 4, 5]
    assert analysed_steps(record) == list(range(12))
    assert clock_confirms([0], t, analysed_steps(traces))
    assert not clock_confirms([0], t, analysed_steps(record)) and not clock_confirms([0], t)
    control = {"verdict": "data-bound", "confidence": "medium", "stragglers": [0]}
    assert score("control", dict(t, slowed=[]), dict(control, **traces), None)["right"]
    assert not score("control", dict(t, slowed=[]), dict(control, **record), None)["right"]


def test_another_rank_the_loop_s_clock_shows_slower_where_the_fault_hid_is_right():
    """A data_workers row: rank 1's loader slowed, its 2 workers hiding most of it; in the 8
    profiled steps (2-9) rank 0's own work was 25% longer (the shared cores), rank 1's not. The
    traces call rank 0 probably a straggler: right about the run, by the loop's clock. Were rank
    1 slower there too, or rank 0 not, naming rank 0 is wrong."""
    per = {0: [30.0] * 24, 1: [30.0] * 24, 2: [30.0] * 24}
    for i in range(2, 10):
        per[0][i] = 37.5
    t = {"slowed": [1], "added_ms": {1: 3.0}, "local_ms": {0: 30.0, 1: 30.0, 2: 30.0},
         "local_steps_ms": per, "data_ms": {0: 1.0, 1: 1.2, 2: 1.0}, "step_ms": 40.0}
    traces = {"verdict": "imbalanced", "confidence": "low", "stragglers": [],
              "probable_stragglers": [0], "steps": [{"step": i} for i in range(2, 10)]}
    got = score("forward", t, traces, None)
    assert got["right"] and got.get("real_straggler")
    # the fault's cause is rank 1's: not checked against rank 0's (CI at dc92a1c failed a
    # data_workers row so: "kineto: cause [None, None]", the right rank 0 named probably)
    assert got["cause"] is None and got["excess"] is None
    assert score("data_workers", dict(t, kind="data_workers"), traces, None)["cause"] is None
    calm = dict(t, local_steps_ms={k: [30.0] * 24 for k in per})
    assert not score("forward", calm, traces, None)["right"]
    both = dict(t, local_steps_ms={**per, 1: per[0]})
    assert not score("forward", both, traces, None)["right"]


def test_two_small_faults_named_the_first_two_minor_stragglers_are_right():
    """Two ranks slowed 4 ms a step (5%) of 128: no straggler, both first among the minor ones
    (the generated row the table counted wrong); one of them and another rank is wrong."""
    t = {"slowed": [35, 72], "added_ms": {"35": 4.0, "72": 4.0}, "ms": 4.0, "kind": "two"}
    minor = [{"rank": 72, "excess_ms": 4.1, "cause": "compute", "cause_detail": "forward"},
             {"rank": 35, "excess_ms": 3.9, "cause": "compute", "cause_detail": "forward"}]
    report = {"verdict": "comm-bound", "confidence": "medium", "stragglers": [],
              "probable_stragglers": [], "straggler_details": [], "minor_stragglers": minor,
              "suggestions": []}
    got = score("two", t, report, 80.0)
    assert got["right"] and got["minor"] and got["estimate"] is None
    wrong = dict(report, minor_stragglers=[minor[0], dict(minor[1], rank=9)])
    assert not score("two", t, wrong, 80.0)["right"]


def test_a_hidden_loader_s_workers_lengthening_the_rank_s_compute_is_the_cause_by_the_clock():
    """A data_workers row on a loaded machine: rank 1's 2 workers hid most of its slowed loader,
    and their processes on its cores made its backward 6 ms longer (loop's clock). The traces
    name rank 1 a minor straggler in backward, 5.5 ms: the cause is right by the clock, and the
    excess is scored against the backward's growth. Were the rank's backward not longer by the
    clock, the compute cause is wrong; a plain data row never takes a compute cause."""
    phase = {0: {"data": 1.0, "forward": 10.0, "backward_compute": 20.0},
             1: {"data": 2.0, "forward": 10.2, "backward_compute": 26.0},
             2: {"data": 1.0, "forward": 10.0, "backward_compute": 20.0}}
    t = {"slowed": [1], "added_ms": {1: 12.0}, "ms": 12.0, "kind": "data", "step_ms": 40.0,
         "local_ms": {0: 31.0, 1: 38.2, 2: 31.0}, "data_ms": {0: 1.0, 1: 8.0, 2: 1.0},
         "phase_ms": phase}
    report = {"verdict": "comm-bound", "confidence": "medium", "stragglers": [],
              "probable_stragglers": [], "straggler_details": [],
              "minor_stragglers": [{"rank": 1, "excess_ms": 5.5, "cause": "compute",
                                    "cause_detail": "backward"}], "suggestions": []}
    got = score("data_workers", t, report, None)
    assert got["right"] and got["cause"] and got.get("cause_by_clock")
    assert got["excess_ms"] == [5.5, 6.0] and got["excess"]
    calm = dict(t, phase_ms={**phase, 1: dict(phase[1], backward_compute=20.5)})
    assert score("data_workers", calm, report, None)["cause"] is False
    assert score("data", t, report, None)["cause"] is False


def test_a_hidden_loader_below_the_floor_or_another_rank_not_ruled_out_is_scored_by_the_clock():
    """The loaded CI row: rank 1's loader slowed 18.6 ms, its workers hid all but ~5 ms of it (the
    loop's clock: local work 13.6 against 8.5 ms). The traces' 8 steps cannot see a straggler
    under 11.2 ms (straggler_floor), and said so: unsure, right, as what was left of the fault is
    under it; were 12 ms left, it claimed to see it and missed. The same report not ruling out rank
    0, which the clock shows 60% busier in those 8 steps while rank 1 was not, is right about the
    run; were rank 1 busier there too, it is wrong."""
    steps = list(range(2, 10))
    per = {0: [10.0] * 24, 1: [10.0] * 24}
    for i in steps:
        per[0][i] = 16.0
    t = {"slowed": [1], "added_ms": {"1": 18.6, "0": 0.0}, "ms": 18.6, "kind": "data",
         "step_ms": 26.0, "local_ms": {"0": 8.5, "1": 13.6}, "data_ms": {"0": 2.3, "1": 5.8},
         "local_steps_ms": per}
    report = {"verdict": "jitter-bound", "confidence": "low", "stragglers": [],
              "probable_stragglers": [], "straggler_details": [], "minor_stragglers": [],
              "suggestions": [], "steps": [{"step": i} for i in steps]}
    floor = dict(report, straggler_floor={"up_to_ms": 11.2, "pct": 35.0, "steps": 8})
    got = score("data_workers", t, floor, None)
    assert got["right"] and got["below_floor"]
    assert not score("data_workers", dict(t, local_ms={"0": 8.5, "1": 20.5}), floor,
                     None)["below_floor"]
    unruled = dict(report, straggler_not_ruled_out={"rank": 0, "late_ms": 0.3, "up_to_ms": 11.2})
    got = score("data_workers", t, unruled, None)
    assert got["right"] and got.get("real_straggler")
    assert not score("data_workers", dict(t, local_steps_ms={0: per[0], 1: per[0]}), unruled,
                     None)["right"]
    # a forward fault is what was injected, whatever the clock: the floor does not cover it
    assert not score("forward", t, floor, None)["below_floor"]
