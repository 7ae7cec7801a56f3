"""gpuscope on training loops shaped like other people's (tests/workloads/cases.py: 2 ranks,
gloo, CPU), each checked against perf_counter timing of the same code in the same run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gpuscope
from helpers import about_recording

pytestmark = pytest.mark.slow
CASES = os.path.join(os.path.dirname(__file__), "workloads", "cases.py")


@pytest.fixture(scope="session")
def run_case(tmp_path_factory):
    cache: dict = {}

    def run(case: str, profile: bool = False) -> str:
        if case not in cache:
            out = tmp_path_factory.mktemp(case)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", CASES, "--case", case, "--out", str(out)]
            if profile:
                cmd.append("--profile")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[case] = str(out)
        return cache[case]

    return run


def independent(out: str, rank: int, k: int) -> dict:
    """The case's own timing of rank `rank`, summed per optimizer step of k micro-steps, the
    warm-up one left out: micro-step, forward, backward, optimizer sums (ms)."""
    t = json.load(open(os.path.join(out, f"timings-rank{rank}.json")))
    per_micro = len(t["parts_s"]["backward"]) // len(t["micro_s"])

    def cycles(values, per=1):
        v = np.array(values) * 1e3
        n = len(v) // (k * per) * (k * per)
        return v[:n].reshape(-1, k * per).sum(axis=1)[1:]

    return {"step": cycles(t["micro_s"]).mean(),
            "forward": cycles(t["parts_s"]["forward"], per_micro).mean(),
            "backward": cycles(t["parts_s"]["backward"], per_micro).mean()}


def same_steps(report, out: str, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(gpuscope's, the case's own) ms of each step the report analysed, one micro-step each."""
    micro = np.array(json.load(open(os.path.join(out, f"timings-rank{rank}.json")))["micro_s"])
    f = report.table.frame
    f = f[(f["rank"] == rank) & f["step"].isin([s.step for s in report.steps])
          & (f["step"] < len(micro))]
    return f["step_ns"].to_numpy() / 1e6, micro[f["step"].to_numpy()] * 1e3


def mean_ms(report, rank: int, what: str) -> float:
    r = next(x for x in report.ranks if x.rank == rank)
    if what == "step":
        return r.step_ns / 1e6
    if what in ("forward", "backward", "optimizer"):
        return r.step_ns * r.phases_pct.get(what, 0.0) / 100 / 1e6
    return r.mean_ms(what)


def agree(ours: float, theirs: float, rel: float = 0.10, abs_ms: float = 1.0) -> bool:
    return abs(ours - theirs) <= max(rel * theirs, abs_ms)


def test_nanogpt_style_accumulation_backward_in_compute_and_cycles(run_case):
    """nanoGPT's loop: require_backward_grad_sync on the last of 4 micro-steps, rec.start()/stop()
    around a top-level loop, loss scaled, grads clipped, the next batch fetched mid-step."""
    out = run_case("nanogpt")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert rep.knobs["sync_interval"] == 4
    assert {s.micro_steps for s in rep.steps} == {4} and len(rep.steps) == 11
    frame = rep.table.frame
    assert (frame["backward_ns"] > 0).all() and (frame["micro_steps"] == 4).all()
    for r in rep.ranks:
        # backward is compute, not "other": other is the grad clipping and the loop's own work.
        # Backward takes ~1.5-1.7x the forward here (50-57% of the step); a share bound alone
        # fails when the other rank straggles and waiting takes the step (38% seen in CI)
        assert r.phases_pct["backward"] > r.phases_pct["forward"] and r.other_pct < 10
        ind = independent(out, r.rank, 4)
        assert agree(mean_ms(rep, r.rank, "step"), ind["step"], 0.05)
        assert agree(mean_ms(rep, r.rank, "forward"), ind["forward"])
        # the independent backward() call includes DDP's wait for the last buckets
        ours = mean_ms(rep, r.rank, "backward") + r.mean_ms("comm_exposed")
        assert agree(ours, ind["backward"])
    # the verdict depends on the host (two ranks sharing two cores can make one a straggler);
    # what must hold is that it is reached over whole optimizer steps, with a suggestion
    assert rep.verdict.label == "compute-bound" or rep.suggestions
    assert about_recording(rep.warnings) == []


def test_ddp_no_sync_accumulation(run_case):
    out = run_case("no_sync")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert rep.knobs["sync_interval"] == 8 and {s.micro_steps for s in rep.steps} == {8}
    synced = rep.table.frame["synced"]
    assert (synced == 1).all()  # each optimizer step ended with its one synchronized micro-step
    for r in rep.ranks:
        ind = independent(out, r.rank, 8)
        assert agree(mean_ms(rep, r.rank, "step"), ind["step"], 0.05)
        ours = mean_ms(rep, r.rank, "backward") + r.mean_ms("comm_exposed")
        assert agree(ours, ind["backward"])
        assert set(r.comm_by_kind) == {"all_reduce"}
    if rep.verdict.label == "comm-bound":
        sync = next(s for s in rep.suggestions if s.knob == "sync_frequency")
        assert sync.current.startswith("accumulation 8") and "x 8 x 2" in sync.why


@pytest.mark.alone
def test_fsdp2_all_gathers_and_reduce_scatters_timed_from_record_and_traces(run_case):
    out = run_case("fsdp2", profile=True)
    rec = gpuscope.analyze(os.path.join(out, "record"))
    assert rec.verdict.label == "comm-bound", rec.verdict.time_by_label
    for r in rec.ranks:
        assert {"all_gather", "reduce_scatter"} <= set(r.comm_by_kind)
        assert r.comm_exposed_pct > 30
        ind = independent(out, r.rank, 1)
        # the step over the steps the report analysed, against the case's clock over the same
        # steps (its own mean also has the steps the profiler wrote its trace in, which the
        # report leaves out: 1-2 s of writing on a busy machine)
        ours, theirs = same_steps(rec, out, r.rank)
        assert len(ours) >= 5 and agree(ours.mean(), theirs.mean(), 0.05), \
            (ours.round(1), theirs.round(1))
        # forward and backward calls include the all-gather waits, which gpuscope splits off
        ours = (mean_ms(rec, r.rank, "forward") + mean_ms(rec, r.rank, "backward")
                + r.mean_ms("comm_exposed"))
        assert agree(ours, ind["forward"] + ind["backward"])
    knobs = {s.knob for s in rec.suggestions}
    assert "reshard_after_forward" in knobs
    traces = gpuscope.analyze(os.path.join(out, "kineto"))
    assert traces.verdict.label == "comm-bound", traces.verdict.time_by_label
    assert all(r.comm_exposed_pct > 30 for r in traces.ranks)


def test_a_bare_all_reduce_in_user_code_is_timed(run_case):
    out = run_case("allreduce")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert "collectives" in rep.table.ranks[0].meta["comm_timing"]
    for r in rep.ranks:
        assert set(r.comm_by_kind) == {"all_reduce"} and r.comm_exposed_pct > 20
        ind = independent(out, r.rank, 1)["backward"]
        ours = mean_ms(rep, r.rank, "backward") + r.mean_ms("comm_exposed")
        # the case's window holds backward(), the all_reduce calls and, between them, the
        # loop's own division of each gradient, which is neither (gpuscope counts it in
        # "other"; ~1 ms here quiet, more under load): no more than the window, and the window
        # within what was timed plus the other work
        tol = max(0.10 * ind, 1.0)
        assert ours <= ind + tol and ours + r.mean_ms("other") >= ind - tol, (ours, ind)
    assert rep.verdict.label == "comm-bound"


def test_no_model_on_two_ranks_warns_instead_of_a_confident_verdict(run_case):
    out = run_case("nomodel")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert rep.verdict.confidence == "low"
    assert any("no communication was timed" in w and "record(model=...)" in w
               for w in rep.warnings)


def test_a_closure_optimizer_keeps_forward_and_backward_out_of_optimizer(run_case):
    out = run_case("closure")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    for r in rep.ranks:
        t = json.load(open(os.path.join(out, f"timings-rank{r.rank}.json")))
        inside = (sum(t["parts_s"]["optimizer"]) - sum(t["parts_s"]["forward"])
                  - sum(t["parts_s"]["backward"])) / len(t["parts_s"]["optimizer"]) * 1e3
        assert agree(mean_ms(rep, r.rank, "optimizer"), inside, 0.25, 1.0)
        parts = sum(mean_ms(rep, r.rank, p) for p in ("forward", "backward", "optimizer"))
        assert parts <= mean_ms(rep, r.rank, "step") * 1.02


def test_autocast_bf16_on_cpu_records_normally(run_case):
    out = run_case("autocast")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    # nothing about the recording (an estimate held to what it can recover is the analysis
    # guarding its own arithmetic: seen once on a quiet machine, sync_frequency 1.04 -> 1.05 ms)
    assert about_recording(rep.warnings) == []
    for r in rep.ranks:
        ind = independent(out, r.rank, 1)
        assert agree(mean_ms(rep, r.rank, "step"), ind["step"], 0.05)
        assert agree(mean_ms(rep, r.rank, "forward"), ind["forward"])


def test_the_ddp_tutorial_gets_no_worker_suggestion_that_would_slow_it(run_case):
    """Followed, 0 -> 1 worker made this loop's step 2.3x slower: loading a batch costs less
    than handing it over from a worker process."""
    out = run_case("tutorial")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert rep.knobs["dataloader"] is True and rep.knobs["batch_size"] == 32
    assert not any(s.knob == "num_workers" for s in rep.suggestions)
    if rep.verdict.label == "data-bound":
        assert any(w.startswith("no suggestion for data-bound") for w in rep.warnings)
