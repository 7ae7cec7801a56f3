"""Pipeline and hybrid (data x pipeline) parallel training, for real: tests/workloads/parallel.py
under torchrun on gloo, recorded by gpuscope and profiled by torch.profiler in the same run, each
checked against the workload's own perf_counter timing.

The stages' layers also sleep for a set "device time" (DeviceLinear): two CPU cores shared by
2-4 ranks blur which stage is slower (one rank's compute slows the others'), while stages on
separate GPUs run side by side; sleeping is how the host sees a GPU working."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gpuscope
from conftest import BALANCED_RERUNS, run_with_reruns
from helpers import median_after_warmup, not_computing_longer

pytestmark = pytest.mark.slow
WORKLOAD = os.path.join(os.path.dirname(__file__), "workloads", "parallel.py")


@pytest.fixture(scope="session")
def parallel_run(tmp_path_factory):
    cache: dict = {}

    def run(case: str, nproc: int, *args: str, profile: bool = True, again: bool = False) -> str:
        """`again`: run it anew, even if this session already did."""
        key = (case, nproc, profile) + args
        if key not in cache or again:
            out = tmp_path_factory.mktemp(case)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(nproc), WORKLOAD, "--case", case, "--out", str(out),
                   "--steps", "12", "--device-ms", "1", *args]
            if profile:  # torch.profiler beside the recorder, for the traces' verdicts
                cmd.append("--profile")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[key] = str(out)
        return cache[key]

    return run


def perf_counter_ms(out: str, rank: int) -> float:
    """The workload's own mean step time of `rank`, warm-up step left out."""
    steps = json.load(open(os.path.join(out, f"timings-rank{rank}.json")))["step_s"]
    return float(np.mean(steps[1:])) * 1e3


def check_step_times(rep, out: str) -> None:
    for r in rep.ranks:
        ours, theirs = r.step_ns / 1e6, perf_counter_ms(out, r.rank)
        assert abs(ours - theirs) <= 0.05 * theirs, (r.rank, ours, theirs)


def test_pipelining_heavy_stage_is_named_and_repartitioned(parallel_run):
    """torch.distributed.pipelining, ScheduleGPipe, 4 micro-batches; stage 1 holds 6 layers
    and stage 0 two: stage 1 is the slowest, stage 0 waits on it, the run is pipeline-bound,
    and the fix moves stage 1's first layers to stage 0."""
    out = parallel_run("pipeline", 2, "--layers", "2,6")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    check_step_times(rep, out)
    assert rep.verdict.label == "pipeline-bound"
    p = rep.pipeline
    assert p is not None and p.n_stages == 2 and p.microbatches == 4
    assert p.ideal_bubble_share == pytest.approx(0.2)
    assert p.slowest_rank == 1 and p.imbalance > 1.3
    s0, s1 = p.stages
    assert (s0.rank, s0.stage, s1.rank, s1.stage) == (0, 0, 1, 1)
    assert s0.wait_next_ns > 3 * s1.wait_prev_ns  # stage 0 waits for stage 1's gradients
    assert rep.layout.pipelines == [[0, 1]]
    assert rep.knobs["pipeline_stage"] == 0 and rep.knobs["pipeline_stages"] == 2
    assert not rep.stragglers  # a heavy stage is not a straggler: every replica has it
    top = rep.suggestions[0]
    assert top.knob == "pipeline_partition" and top.addresses == "pipeline-bound"
    assert "first 2 layer(s)" in top.proposed and "from stage 1 (rank 1) to stage 0" in top.proposed
    median_ms = float(np.median([s.step_ns for s in rep.steps])) / 1e6  # what the estimate improves
    assert 0.6 * median_ms < top.estimated_step_ms < median_ms, (top.estimated_step_ms, median_ms)

    # the same run as torch.profiler saw it: the same verdict and slowest stage
    k = gpuscope.analyze(os.path.join(out, "kineto"))
    assert k.verdict.label == "pipeline-bound"
    assert k.pipeline is not None and k.pipeline.slowest_rank == 1
    assert k.suggestions and k.suggestions[0].knob == "pipeline_partition"
    assert "from rank 1 to rank 0" in k.suggestions[0].proposed


def test_repartition_estimate_matches_the_repartitioned_run(parallel_run):
    """The estimate for moving 2 layers from stage 1 to stage 0, against running 4 + 4 (both
    without the profiler, whose trace writing lengthens some steps)."""
    # two separate 12-step runs: this shared VM's speed can drift between them. On a quiet
    # machine the estimate is 1-4% under the measured step (4 pairs); a slow spell during the
    # 4 + 4 run alone made it 15.5% (84.1 against 99.5 ms), in CI runs 57%, and once 34% then
    # 26% the other way (1ec4730). So the measured step is taken at the first run's speed: times
    # the ratio of the two runs' compute per layer (the same 8 layers, split 2 + 6 then 4 + 4:
    # a VM slower during one run is slower in its layers too). The bound is 25%; when they
    # disagree the pair is run once more, listed in the test summary; a wrong estimate
    # disagrees both times
    def per_layer(rep) -> float:
        return sum(s.compute_ns for s in rep.pipeline.stages) / 8

    def pair(attempt):
        before = gpuscope.analyze(os.path.join(parallel_run(
            "pipeline", 2, "--layers", "2,6", profile=False, again=attempt > 0), "record"))
        out = parallel_run("pipeline", 2, "--layers", "4,4", profile=False, again=attempt > 0)
        after = gpuscope.analyze(os.path.join(out, "record"))
        est = before.suggestions[0].estimated_step_ms
        measured = float(np.median([s.step_ns for s in after.steps])) / 1e6
        return est, measured * per_layer(before) / per_layer(after), after, measured

    est, measured, after, raw = run_with_reruns(
        2, pair, lambda r: None if abs(r[0] - r[1]) <= 0.25 * r[1] else
        f"repartition pair: {r[0]:.1f} ms predicted, {r[1]:.1f} ms measured at the first "
        f"run's speed ({r[3]:.1f} ms as run)")
    assert abs(est - measured) <= 0.25 * measured, (est, measured, raw)
    # balanced now: no repartition, and the bubble is the schedule's own
    assert not any(s.knob == "pipeline_partition" for s in after.suggestions)
    assert after.pipeline.imbalance < 1.15
    assert abs(after.pipeline.bubble_share - after.pipeline.ideal_bubble_share) < 0.08


def test_hand_written_send_recv_heavy_first_stage(parallel_run):
    """dist.send / dist.recv between stages, the first stage heavy: its last layers move on."""
    out = parallel_run("sendrecv", 2, "--layers", "6,2")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    check_step_times(rep, out)
    assert rep.verdict.label == "pipeline-bound"
    assert rep.pipeline.slowest_rank == 0 and rep.pipeline.microbatches == 4
    kinds = {k for r in rep.ranks for k in r.comm_by_kind}
    assert kinds == {"send_next", "recv_next", "send_prev", "recv_prev"}
    top = rep.suggestions[0]
    assert top.knob == "pipeline_partition"
    assert "last 2 layer(s)" in top.proposed and "from stage 0 (rank 0) to stage 1" in top.proposed
    k = gpuscope.analyze(os.path.join(out, "kineto"))
    assert k.verdict.label == "pipeline-bound" and k.pipeline.slowest_rank == 0


def test_hybrid_slow_rank_named_in_its_data_parallel_group(parallel_run):
    """4 ranks as 2 replicas x 2 stages; rank 3 (replica 1's stage 1) is slow. Its pipeline peer,
    rank 2, waits on it point to point and reaches its all-reduce late: it is not blamed. Rank 3
    is named, in its data-parallel group (1, 3). 25 ms per forward: at 10 a busy-core clone's
    record read pipeline-bound at low confidence, a near tie (bubbles 42%, imbalance 40% of the
    steps; the ranks waited ~40 ms a step beside ~26-42 ms of bubble), rank 3 named all the same"""
    out = parallel_run("hybrid", 4, "--slow-rank", "3", "--slow-ms", "25")
    for src in ("record", "kineto"):
        rep = gpuscope.analyze(os.path.join(out, src))
        assert rep.verdict.label == "imbalanced", src
        assert rep.straggler_ranks == [3], src
        assert rep.stragglers[0].group == [1, 3], src
        groups = {tuple(g.ranks) for g in rep.layout.groups}
        assert {(0, 2), (1, 3)} <= groups, src
        ranks = {r.rank: r for r in rep.ranks}
        # rank 2's waiting on rank 3 is imbalance; what stays bubble is no more than the
        # schedule gives the same stage of the other replica (rank 0)
        assert ranks[2].wait_ns > 2 * ranks[3].wait_ns, src
        assert ranks[2].bubble_ns <= ranks[0].bubble_ns + 1e6, src
    rec = gpuscope.analyze(os.path.join(out, "record"))
    check_step_times(rec, out)
    assert rec.layout.pipelines == [[0, 1], [2, 3]]
    assert rec.suggestions[0].knob == "straggler" and "rank 3" in rec.suggestions[0].current
    # no repartition: stage 1 is slow in one replica only
    assert not any(s.knob == "pipeline_partition" for s in rec.suggestions)


def test_hybrid_balanced_names_no_one(parallel_run):
    # 4 ranks on this VM's 2 cores: one rank can be consistently slower for a whole run (seen in
    # CI: rank 0, 10 ms per step in the profiled steps, its backward); the tool is right to name
    # it. The workload's own clock around each rank's local work (forward, backward, optimizer)
    # tells such a rank from one made up: a named rank must be computing 10% longer than the
    # others by that clock. A run naming one that it does not confirm is run again, up to twice,
    # each rerun listed in the test summary; a tool that invents stragglers does so all three times
    def own(out):
        return {r: median_after_warmup(json.load(open(
            os.path.join(out, f"timings-rank{r}.json")))["compute_s"]) for r in range(4)}

    def made_up(out):
        found = [(src, bad) for src in ("record", "kineto")
                 if (bad := not_computing_longer(
                     gpuscope.analyze(os.path.join(out, src)).to_dict(), own(out)))]
        return f"hybrid 4 ranks: named, not computing longer by its own clock: {found}" \
            if found else None

    out = run_with_reruns(BALANCED_RERUNS + 1,
                          lambda attempt: parallel_run("hybrid", 4, again=attempt > 0), made_up)
    for src in ("record", "kineto"):
        rep = gpuscope.analyze(os.path.join(out, src))
        d = rep.to_dict()
        assert not_computing_longer(d, own(out)) == [], (src, d["straggler_details"], own(out))
        # not a confident imbalance unless a rank the clock confirms was named: with 4 ranks and
        # a spinner on 2 cores the waiting can follow the scheduler's pattern for a whole run (a
        # busy-core clone's traces: imbalanced at low confidence, a near tie with
        # pipeline-bound, no one named)
        assert rep.verdict.label != "imbalanced" or rep.verdict.confidence == "low" \
            or rep.stragglers, (src, rep.verdict)
