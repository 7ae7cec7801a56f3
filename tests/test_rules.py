"""The classification rules, stragglers and suggestions on hand-built tables."""

import pytest

from gpuscope.analyze.run import analyze_table
from gpuscope.thresholds import Thresholds
from helpers import balanced, rerun_band, table_from_rows

TH0 = Thresholds(warmup_steps=0)


def verdict(rows, th=TH0, **kw):
    return analyze_table(table_from_rows(rows, **kw), th)


def test_pure_compute_is_compute_bound():
    rep = verdict(balanced(10, 2, compute=90, other=10))
    assert rep.verdict.label == "compute-bound"
    assert rep.verdict.share == pytest.approx(1.0)
    assert rep.suggestions == []


def test_a_step_mostly_of_time_nobody_can_attribute_is_unexplained_not_compute_bound():
    """The demo's steps where the profiler writes its trace (~220 ms, ~3 ms of compute), a
    truncated trace with 84% "other": no bottleneck label holds, and the step is mostly time
    gpuscope cannot place. Not the healthy state: unexplained, with what would explain it; a
    step where compute still leads what is left stays compute-bound."""
    rows = balanced(6, 2, compute=3, other=217)
    for r in rows:
        r["between"] = 200.0  # the loop's own work after rec.step(): a profiler writing traces
    rep = verdict(rows)
    assert rep.verdict.label == "unexplained" and rep.suggestions == []
    (why,) = [w for w in rep.warnings if w.startswith("unexplained:")]
    assert "between rec.step() and the next step" in why and "rec.phase" in why
    assert {s.label for s in rep.steps} == {"unexplained"}
    assert verdict(balanced(6, 2, compute=60, other=40)).verdict.label == "compute-bound"
    # compute under half, but ahead of other: compute-bound, at low confidence
    low = verdict(balanced(6, 2, compute=45, other=40, data=15))
    assert low.verdict.label == "compute-bound" and low.verdict.confidence == "low"


@pytest.mark.parametrize("data_ms,label", [(19.9, "compute-bound"), (20.0, "data-bound"),
                                           (30, "data-bound")])
def test_data_threshold_is_inclusive_at_20_percent(data_ms, label):
    rep = verdict(balanced(5, 2, data=data_ms, compute=100 - data_ms))
    assert rep.verdict.label == label


def test_moderate_data_wait_is_secondary_and_gets_a_suggestion():
    rep = verdict(balanced(5, 2, data=10, compute=90), knobs={"num_workers": 0, "cpu_count": 8,
                                                                "local_world_size": 2})
    assert rep.verdict.label == "compute-bound"
    assert "moderately data-bound" in rep.steps[0].secondary
    assert rep.suggestions and rep.suggestions[0].knob == "num_workers"


def test_comm_threshold_on_exposed_transfer():
    below = verdict(balanced(5, 2, comm=40, comm_exposed=14.9, compute=85.1))
    above = verdict(balanced(5, 2, comm=40, comm_exposed=15, compute=85))
    assert below.verdict.label == "compute-bound"
    assert above.verdict.label == "comm-bound"


def test_hidden_communication_is_not_comm_bound():
    rep = verdict(balanced(5, 2, comm=80, comm_exposed=2, compute=98))
    assert rep.verdict.label == "compute-bound"


def _straggler_rows(n_steps=10, slow_rank=1, n_ranks=2, extra=40, cause="compute"):
    """The slow rank computes `extra` ms longer; the others wait for it inside the all-reduce."""
    rows = []
    for s in range(n_steps):
        for r in range(n_ranks):
            slow = r == slow_rank
            part = {"compute": 50 + (extra if slow and cause == "compute" else 0),
                    "data": 5 + (extra if slow and cause == "data" else 0)}
            exposed = 5 + (0 if slow else extra)
            rows.append({"rank": r, "step": s, **part, "comm": exposed + 10,
                         "comm_exposed": exposed, "other": 0})
    return rows


def test_waiting_inside_allreduce_is_imbalanced_not_comm_bound():
    rep = verdict(_straggler_rows())
    assert rep.verdict.label == "imbalanced"
    assert [s.rank for s in rep.stragglers] == [1]
    assert rep.stragglers[0].cause == "compute"
    d = rep.to_dict()
    waits = {r["rank"]: r["wait_ms"] for r in d["ranks"]}
    assert waits[0] == pytest.approx(40) and waits[1] == 0
    assert rep.suggestions[0].knob == "straggler"
    assert rep.suggestions[0].estimated_step_ms == pytest.approx(60, abs=1)


def test_straggler_caused_by_data_names_data():
    rep = verdict(_straggler_rows(cause="data", n_ranks=4, slow_rank=2))
    assert [s.rank for s in rep.stragglers] == [2]
    assert rep.stragglers[0].cause == "data"
    assert "data loading" in rep.suggestions[0].why


def test_a_stragglers_cause_is_the_phase_its_table_shows_longer():
    """Rank 1 spends 20 ms more in forward and 10 more in its optimizer step; rank 0 waits 40 ms
    for it in DDP's all-reduce. The phases are recorded without their exposed communication
    already: the cause is forward, as the rank table shows (taking the exposed time out of
    backward again made rank 0's backward look 40 ms short and named backward)."""
    rows = []
    for s in range(8):
        for r in range(2):
            late = r == 1
            fwd, opt, bwd = (30 if late else 10), (12 if late else 2), 60
            exposed = 5 if late else 45
            rows.append({"rank": r, "step": s, "forward": fwd, "backward": bwd,
                         "optimizer": opt, "compute": fwd + bwd + opt, "comm": exposed,
                         "comm_exposed": exposed, "other": 1,
                         "step_ms": fwd + bwd + opt + exposed + 1})
    rep = verdict(rows)
    (st,) = rep.stragglers
    assert st.rank == 1 and st.cause == "compute" and st.cause_detail == "forward", st
    table = {r.rank: r.phases_ns for r in rep.ranks}
    assert table[1]["forward"] - table[0]["forward"] == pytest.approx(20e6)
    assert table[1]["backward"] == pytest.approx(table[0]["backward"])


def test_a_straggler_beside_a_larger_label_is_still_named():
    """Steps data-bound first (40% waiting for batches) whose ranks also wait 15% for rank 1
    every step: imbalance is their secondary label, and rank 1 is the straggler; the report
    said 'rank(s) 0 wait for the rest every step' and named no one."""
    rows = []
    for s in range(10):
        for r in range(2):
            w = 0.5 if r == 1 else 15
            rows.append({"rank": r, "step": s, "data": 40, "compute": 44.5 + (15 if r else 0),
                         "comm": w, "comm_exposed": w, "other": 0.5 if r else 0.5,
                         "step_ms": 100.5 if r else 100.0})
    rep = verdict(rows)
    assert rep.verdict.label == "data-bound"
    assert rep.straggler_ranks == [1], (rep.stragglers, [s.secondary for s in rep.steps][:3])
    said = " ".join([*rep.warnings, *(s.why for s in rep.suggestions)])
    assert "wait for the rest" not in said


def test_random_jitter_is_not_imbalance_but_its_cost_is_reported():
    rows = []
    for s in range(12):
        slow = s % 4  # a different rank is late each step
        for r in range(4):
            exposed = 5 if r == slow else 25
            rows.append({"rank": r, "step": s, "compute": 70 if r == slow else 50, "comm": exposed,
                         "comm_exposed": exposed, "other": 0})
    rep = verdict(rows)
    # lost time, not compute: a label of its own, and no one named
    assert rep.verdict.label == "jitter-bound"
    assert rep.stragglers == []
    assert all(s.jitter and s.label == "jitter-bound" for s in rep.steps)
    d = rep.to_dict()
    assert d["jitter"]["steps_time_pct"] == pytest.approx(100)
    assert d["jitter"]["wait_pct"] == pytest.approx(100 * 20 / 75, abs=0.1)  # 20 of 75 ms waited
    top = rep.suggestions[0]
    assert top.knob == "rank_jitter"
    assert top.estimated_step_ms == pytest.approx(55, abs=0.5)


def test_periodic_straggler_is_consistent_and_named():
    # rank 2 checkpoints every third step (+60 ms); the other steps are balanced
    rows = []
    for s in range(30):
        for r in range(4):
            extra = 60 if (r == 2 and s % 3 == 0) else 0
            exposed = 5 + (0 if r == 2 or s % 3 else 60)
            rows.append({"rank": r, "step": s, "compute": 50 + extra, "comm": exposed + 5,
                         "comm_exposed": exposed, "other": 0})
    rep = verdict(rows)
    assert [s.rank for s in rep.stragglers] == [2]
    assert rep.verdict.label == "imbalanced"
    assert {s.step for s in rep.steps if s.label == "imbalanced"} == set(range(0, 30, 3))


def test_too_few_steps_to_tell_jitter_from_a_straggler_warns():
    rep = verdict(_straggler_rows(n_steps=2))
    assert rep.verdict.label == "imbalanced"
    assert any("too few to tell" in w for w in rep.warnings)


def test_one_fast_rank_waiting_for_the_rest_names_no_majority_of_stragglers():
    # rank 0 finishes early every step and waits; ranks 1-3 are the "slow" majority
    rows = []
    for s in range(10):
        for r in range(4):
            exposed = 30 if r == 0 else 2
            rows.append({"rank": r, "step": s, "compute": 50 if r == 0 else 78, "comm": exposed,
                         "comm_exposed": exposed, "other": 0})
    rep = verdict(rows)
    assert rep.verdict.label == "imbalanced"
    assert rep.stragglers == []  # three of four ranks are not stragglers: rank 0 is the odd one
    assert rep.suggestions[0].current == "rank(s) 0 wait for the rest every step"


def test_conflicting_shares_largest_wins_and_other_is_secondary():
    rows = [{"rank": r, "step": s, "data": 25, "comm": 30, "comm_exposed": 30, "compute": 45}
            for r in range(2) for s in range(5)]
    rep = verdict(rows)
    assert rep.verdict.label == "comm-bound"
    assert "data-bound" in rep.steps[0].secondary


def test_thresholds_are_configurable():
    rows = balanced(5, 2, data=10, compute=90)
    assert verdict(rows).verdict.label == "compute-bound"
    assert verdict(rows, th=TH0.with_overrides("data_high=0.08")).verdict.label == "data-bound"


def test_unknown_threshold_is_a_clear_error():
    from gpuscope.errors import InputError

    with pytest.raises(InputError, match="unknown threshold 'dat'"):
        Thresholds().with_overrides("dat=0.1")


def test_verdict_is_the_label_holding_most_time():
    rows = balanced(3, 2, data=50, compute=50, comm=1) + [
        {"rank": r, "step": s, "compute": 100, "comm": 1} for r in range(2) for s in range(3, 10)]
    rep = verdict(rows)
    assert rep.verdict.label == "compute-bound"
    assert rep.verdict.time_by_label["data-bound"] == pytest.approx(0.3)
    assert rep.verdict.confidence == "medium"  # 70% of the time


def test_data_bound_workers_are_held_by_the_cpu_the_rank_has():
    # CPU-bound loading: 80 ms of CPU a batch beside 20 ms of training, 4 cores per rank: 4
    # workers hide the wait (80 / 20), but the rank's cores do 100.5 ms of CPU a step (training,
    # loading, the hand-over) in no less than a quarter of that
    rows = balanced(5, 2, data=80, compute=20, data_cpu=80)
    rep = verdict(rows, knobs={"num_workers": 0, "cpu_count": 8, "cpus_available": 8,
                               "local_world_size": 2})
    nw = next(s for s in rep.suggestions if s.knob == "num_workers")
    assert nw.proposed == 4
    assert nw.estimated_step_ms == pytest.approx((20 + 80 + 0.5) / 4)
    # as many cores as needed, less a re-run's noise (rerun_noise.py)
    assert nw.estimated_step_ms_range[0] == pytest.approx((20 + 0.5) * (1 - rerun_band(rep)))
    assert "holds the step" in nw.why and "4 CPU core(s) per rank" in nw.why


def test_io_like_loading_takes_little_cpu_so_more_workers_than_cores_pay():
    # 80 ms of loading, 1 of it CPU, beside 10 ms of training on 1 core per rank: 8 workers
    # (the next common count above 80 / 10) hide it; the core does 11.5 ms of CPU a step
    rows = balanced(5, 2, data=80, compute=10, data_cpu=1)
    rep = verdict(rows, knobs={"num_workers": 0, "cpu_count": 2, "local_world_size": 2})
    nw = next(s for s in rep.suggestions if s.knob == "num_workers")
    assert nw.proposed == 8 and nw.estimated_step_ms == pytest.approx(10 + 1 + 0.5)


def test_a_trace_without_the_facts_assumes_one_core_and_says_so_and_with_them_agrees():
    """A trace holds neither the rank's cores nor how much of loading used the CPU: without
    the facts gpuscope.record tells a profiler beside it, the estimate takes one core per rank
    (the least a rank has) and the loader's torch ops in the trace (a lower bound), and says
    so (its estimate is then below the record's: the loader's Python is not in a trace); with
    them, the same knob, value and estimate as the record of the run."""
    from dataclasses import replace

    rows = balanced(6, 2, data=35, compute=5, data_cpu=1.75)
    knobs = {"num_workers": 0, "cpu_count": 2, "local_world_size": 2, "dataloader": True,
             "batches_per_epoch": 30}
    record = verdict(rows, knobs=knobs)
    t = table_from_rows(rows, knobs={"num_workers": 0, "dataloader": True})
    t.frame["data_cpu_ns"] = -1  # as a trace reads: unknown
    t.frame["data_ops_ns"] = (t.frame["data_ns"] * 0.01).astype("int64")  # its ops: 1%
    trace = analyze_table(replace(t, source="kineto"), TH0)
    told = table_from_rows(rows, knobs={"num_workers": 0, "dataloader": True, "cpu_count": 2,
                                        "local_world_size": 2, "data_cpu_share": 0.05,
                                        "batches_per_epoch": 30})
    told.frame["data_cpu_ns"] = -1
    told = analyze_table(replace(told, source="kineto"), TH0)
    r, k, f = (next(s for s in x.suggestions if s.knob == "num_workers")
               for x in (record, trace, told))
    assert "not in the trace: one per rank" in k.why and "its torch ops in the trace" in k.why
    assert (f.proposed, round(f.estimated_step_ms, 6)) == (r.proposed, round(r.estimated_step_ms, 6))
    assert "measured by gpuscope.record beside the profiler" in f.why
    assert k.proposed == r.proposed and k.estimated_step_ms < r.estimated_step_ms


def test_sync_frequency_brings_exposed_comm_under_target():
    from gpuscope.analyze.whatif import SYNC_MULTIPLES

    rows = balanced(5, 2, comm=40, comm_exposed=40, compute=60)
    rep = verdict(rows, knobs={"batch_size": 8})
    sync = next(s for s in rep.suggestions if s.knob == "sync_frequency")
    k = int(sync.proposed.split()[1])
    assert 40 / k <= 0.05 * (60 + 40 / k) + 1e-9
    # the smallest such k on the ladder: the rung below it leaves more than 5%
    below = max(m for m in SYNC_MULTIPLES if m < k)
    assert k in SYNC_MULTIPLES and 40 / below > 0.05 * (60 + 40 / below)
    assert sync.estimated_step_ms == pytest.approx(60 + 40 / k)


def test_sync_frequency_counts_gradient_sync_alone_not_the_loops_own_collectives():
    """timm and minGPT with a 32-64 MB all_reduce of the loop's own: syncing gradients less
    often saves DDP's all-reduce (the recorder's key all_reduce:ddp), never the loop's own
    collective (all_reduce on the default group), which every micro-step still runs."""
    import pandas as pd

    def table(own_ms):
        rows = balanced(8, 2, forward=10, backward=20, compute=30, optimizer=2,
                        comm=10 + own_ms, comm_exposed=10 + own_ms, other=2)
        t = table_from_rows(rows, knobs={"batch_size": 8, "world_size": 2, "device": "cpu",
                                         "model": "DistributedDataParallel"})
        comm = [{"rank": r["rank"], "step": r["step"], "key": k, "comm_ns": int(ms * 1e6),
                 "exposed_ns": int(ms * 1e6), "count": 1}
                for r in rows for k, ms in (("all_reduce:ddp", 10), ("all_reduce:default", own_ms))
                if ms]
        t.comm = pd.DataFrame(comm)
        return analyze_table(t, TH0)

    alone, beside = table(0), table(30)
    a = next(s for s in alone.suggestions if s.knob == "sync_frequency")
    b = next(s for s in beside.suggestions if s.knob == "sync_frequency")
    assert "10.0 ms of each 42.0 ms step is gradient synchronization's transfer" in a.why
    assert "10.0 ms of each 72.0 ms step is gradient synchronization's transfer" in b.why
    assert "the loop's own collectives (30.0 ms of transfer per step) stay" in b.why
    # issue 71, 6.: one word per quantity: the rank table's "exposed" holds the waiting too
    assert "(exposed, less waiting for slower ranks)" in a.why
    # what it saves is the same 10 ms of DDP's either way: the loop's own 30 ms stay
    saved_a, saved_b = 42.0 - a.estimated_step_ms, 72.0 - b.estimated_step_ms
    assert saved_b == pytest.approx(saved_a, abs=2.0) and b.estimated_step_ms > 72.0 - 12.1


def test_warmup_step_is_left_out():
    rows = [{"rank": r, "step": 0, "data": 900, "compute": 100} for r in range(2)]
    rows += balanced(5, 2, compute=100)
    rows = [r if r["step"] == 0 or "data" in r else {**r, "step": r["step"] + 1} for r in rows]
    assert analyze_table(table_from_rows(rows)).verdict.label == "compute-bound"
    assert verdict(rows).verdict.time_by_label.get("data-bound", 0) > 0.5


def test_mismatched_steps_warn_and_still_analyse():
    rows = balanced(6, 2, compute=100) + [{"rank": 0, "step": 6, "compute": 100}]
    rep = verdict(rows)
    # a step only one of the two ranks recorded has nobody to compare its waiting with: out
    assert any("recorded by one rank" in w and "left out" in w for w in rep.warnings)
    assert 6 not in {s.step for s in rep.steps} and len(rep.steps) >= 5
    # with three ranks, a step two of them have is analysed, its wait split between the two
    rows = balanced(6, 3, compute=100) + [{"rank": r, "step": 6, "compute": 100} for r in (0, 1)]
    rep = verdict(rows)
    assert any("missing on some ranks" in w for w in rep.warnings)
    assert 6 in {s.step for s in rep.steps}


def test_jitter_is_shown_in_terminal_and_dashboard():
    from gpuscope.render.html import render as render_html
    from gpuscope.render.terminal import render as render_text

    rows = []
    for s in range(12):
        for r in range(2):
            late = r == s % 2
            exposed = 5 if late else 25
            rows.append({"rank": r, "step": s, "compute": 70 if late else 50, "comm": exposed,
                         "comm_exposed": exposed, "other": 0})
    rep = verdict(rows)
    assert "Rank jitter: 26.7% of step time" in render_text(rep)
    assert '<p id="jitter">Rank jitter: 26.7%' in render_html(rep)


def test_steps_where_another_rank_is_late_are_jitter_beside_a_straggler():
    rows = []
    odd = {4, 11, 17}  # rank 0 is the late one in these steps only
    for s in range(20):
        late = 0 if s in odd else 1
        for r in range(2):
            exposed = 5 if r == late else 35
            rows.append({"rank": r, "step": s, "compute": 80 if r == late else 50,
                         "comm": exposed, "comm_exposed": exposed, "other": 0})
    rep = verdict(rows)
    assert [s.rank for s in rep.stragglers] == [1]
    labels = {s.step: s.label for s in rep.steps}
    assert all(labels[s] == "imbalanced" for s in range(20) if s not in odd)
    assert all(labels[s] != "imbalanced" for s in odd)
    assert all(s.jitter for s in rep.steps if s.step in odd)


def test_no_communication_timed_on_several_ranks_warns_and_lowers_confidence():
    rep = verdict(balanced(6, 2, compute=90, other=10))
    assert rep.verdict.label == "compute-bound" and rep.verdict.confidence == "low"
    assert any("no communication was timed" in w for w in rep.warnings)
    one = verdict(balanced(6, 1, compute=90, other=10))
    assert one.verdict.confidence == "high" and not one.warnings


@pytest.mark.parametrize("knobs,why", [
    # the DDP tutorial: 0.1 ms loads, in-process, CPU-bound, 1 core per rank
    ({"num_workers": 0, "cpu_count": 2, "local_world_size": 2, "dataloader": True}, "1 CPU core"),
    # more cores, but a worker costs more per batch than loading does
    ({"num_workers": 0, "cpu_count": 16, "local_world_size": 2, "dataloader": True},
     "would not make the step faster"),
    # not a DataLoader at all
    ({"dataloader": False, "loader": "generator"}, "not a torch DataLoader"),
])
def test_no_worker_suggestion_where_workers_would_not_help(knobs, why):
    rows = balanced(8, 2, data=0.3, compute=1.0, comm=0.01, data_cpu=0.3)
    rep = verdict(rows, knobs=knobs, th=Thresholds(warmup_steps=0, data_high=0.2))
    assert rep.verdict.label == "data-bound"
    assert not any(s.knob == "num_workers" for s in rep.suggestions)
    assert any(w.startswith("no suggestion for data-bound") and why in w for w in rep.warnings)


def test_accumulation_is_analysed_per_optimizer_step():
    # 4 micro-steps per optimizer step; only the last one synchronizes (40 ms exposed)
    rows = []
    for r in range(2):
        for s in range(24):
            last = s % 4 == 3
            rows.append({"rank": r, "step": s, "forward": 5, "backward": 10, "compute": 15,
                         "optimizer": 2 if last else 0, "comm": 40 if last else 0,
                         "comm_exposed": 40 if last else 0})
    rep = verdict(rows, knobs={"batch_size": 8, "world_size": 2})
    assert len(rep.steps) == 6 and {s.micro_steps for s in rep.steps} == {4}
    assert rep.knobs["sync_interval"] == 4
    assert rep.verdict.label == "comm-bound"  # 40 of 100 ms per optimizer step
    sync = next(s for s in rep.suggestions if s.knob == "sync_frequency")
    assert sync.current.startswith("accumulation 4")
    k = int(sync.proposed.split()[1]) // 4
    assert "8 x 4 x 2 = 64" in sync.why and f"8 x {4 * k} x 2 = {64 * k}" in sync.why
    assert sync.estimated_step_ms == pytest.approx(60 + 40 / k)


def test_host_bound_when_the_gpu_waits_on_launches():
    rows = balanced(6, 2, compute=40, other=60, comm=1)
    table = table_from_rows(rows)
    table.frame["host_ns"] = 50_000_000  # 50 of 100 ms the GPU idled waiting for the host
    rep = analyze_table(table, TH0)
    assert rep.verdict.label == "host-bound"
    top = rep.suggestions[0]
    assert top.knob == "host_overhead" and top.estimated_step_ms == pytest.approx(75)
    w = rerun_band(rep)  # a re-run's noise widens the model's range (rerun_noise.py)
    assert top.estimated_step_ms_range == pytest.approx((50 * (1 - w), 75 * (1 + w)))
    assert rep.ranks[0].host_pct == pytest.approx(50)
