"""Real 2-process gloo DDP runs with a bottleneck injected on purpose get the right diagnosis."""

import gpuscope
from helpers import unconfirmed_stragglers


def _report(scenario_run, scenario, **kw):
    path = scenario_run(scenario, **kw)
    d = gpuscope.analyze(path).to_dict()
    # no straggler injected: a rank named must be one the loop's own clock shows computing
    # longer (a busy host's uneven cores make such a rank now and then: conftest.py)
    assert unconfirmed_stragglers(path, d) == [], d["straggler_details"]
    return d


def _verdicts(d, *expected):
    """The verdicts a balanced run may get: `expected`, or imbalanced when a rank the loop's
    clock confirms was named (the run then really was imbalanced)."""
    return expected + (("imbalanced",) if d["stragglers"] else ())


def test_slow_dataset_is_data_bound_and_more_workers_are_suggested(scenario_run):
    d = _report(scenario_run, "data")
    assert d["verdict"] == "data-bound", d["time_by_label"]
    assert d["world_size"] == 2 and d["ranks_analysed"] == 2
    top = d["suggestions"][0]
    assert top["knob"] == "num_workers"
    assert top["current"] == 0 and top["proposed"] >= 1
    step_ms = sorted(s["step_ms"] for s in d["steps"])[len(d["steps"]) // 2]
    assert top["estimated_step_ms"] < step_ms
    assert d["knobs"]["batch_size"] == 16


def test_big_model_tiny_batch_is_comm_bound_and_sync_less_often(scenario_run):
    d = _report(scenario_run, "comm")
    assert d["verdict"] in _verdicts(d, "comm-bound"), d["time_by_label"]
    knobs = [s["knob"] for s in d["suggestions"]]
    assert "sync_frequency" in knobs and "batch_size" in knobs
    sync = next(s for s in d["suggestions"] if s["knob"] == "sync_frequency")
    assert sync["current"] == "every 1 step(s)"
    assert all(r["comm_exposed_pct"] >= 15 for r in d["ranks"])


def test_one_rank_with_extra_work_is_imbalanced_and_named(scenario_run):
    d = _report(scenario_run, "imbalanced")
    assert d["verdict"] == "imbalanced", d["time_by_label"]
    assert d["stragglers"] == [1]
    detail = d["straggler_details"][0]
    assert detail["cause"] == "compute"
    # the waiting shows up on rank 0 inside the all-reduce, not as comm-bound
    r0, r1 = sorted(d["ranks"], key=lambda r: r["rank"])
    # (rank 0 over the imbalance threshold; the straggler itself waits now and then on a busy
    # machine, when the OS holds rank 0 back: 5.2% in a CI run beside a second test process)
    assert r0["wait_pct"] >= 10 and r1["wait_pct"] < min(10, r0["wait_pct"] / 3), (r0, r1)
    assert d["suggestions"][0]["knob"] == "straggler"
    assert "rank 1" in d["suggestions"][0]["current"]


def test_balanced_compute_heavy_run_is_compute_bound(scenario_run):
    # robust by design: at the demo's batch of 4096 comm's share (9-13% here) sits near the 15%
    # threshold and swings per step on 2 shared cores, so a fifth of the steps could come out
    # comm-bound; a batch of 8192 doubles the compute for the same all-reduce (comm 6-7%), and
    # 40 steps make the verdict a majority over more of them. On a busy machine the two ranks'
    # steps wobble and each waits for the other now and then: that waiting is lost time, so the
    # verdict may be jitter-bound, never comm- or data-bound, and no one is named but a rank the
    # loop's own clock shows computing longer (then the run was imbalanced, and may say so)
    d = _report(scenario_run, "compute", steps=40, extra=("--batch-size", "8192"))
    assert d["verdict"] in _verdicts(d, "compute-bound", "jitter-bound"), \
        (d["time_by_label"], d["jitter"])
    assert all(r["compute_pct"] > 50 for r in d["ranks"])
    shares = d["time_by_label"]
    assert sum(shares.get(v, 0) for v in _verdicts(d, "compute-bound", "jitter-bound")) >= 0.7
    assert not any(s["knob"] in ("sync_frequency", "num_workers") for s in d["suggestions"])
    if d["verdict"] == "jitter-bound":
        assert d["suggestions"][0]["knob"] == "rank_jitter"
