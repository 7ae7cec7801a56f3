"""One line in a Trainer: transformers' and Lightning's Trainers with GpuscopeCallback, 2 ranks on
gloo (tests/workloads/trainers.py), with and without gradient accumulation, against a plain
callback's perf_counter at every micro-step end."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gpuscope
from conftest import RERUNS

pytestmark = pytest.mark.slow
SCRIPT = os.path.join(os.path.dirname(__file__), "workloads", "trainers.py")


def _aborted_at_exit(stderr: str, out) -> bool:
    done = all(os.path.exists(os.path.join(out, f"timings-rank{r}.json")) for r in (0, 1))
    return done and "terminate called without an active exception" in stderr


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory):
    cache: dict = {}

    def run(trainer: str, accum: int) -> str:
        key = (trainer, accum)
        if key not in cache:
            pytest.importorskip("transformers" if trainer == "hf" else "lightning")
            out = tmp_path_factory.mktemp(f"{trainer}{accum}")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", SCRIPT, "--trainer", trainer, "--accum", str(accum),
                   "--out", str(out)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            if proc.returncode != 0 and _aborted_at_exit(proc.stderr, out):
                # a gloo process group's threads torn down at interpreter exit, after training
                # finished and every rank wrote its timings (PyTorch's, with gpuscope off too):
                # run once more rather than fail on the framework's teardown, listed in the
                # test summary like every rerun
                RERUNS.append(f"{trainer} accum {accum}: a rank aborted at exit (terminate "
                              "called without an active exception); ran it again")
                shutil.rmtree(out)
                os.makedirs(out)
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[key] = str(out)
        return cache[key]

    return run


@pytest.mark.parametrize("trainer", ["hf", "lightning"])
@pytest.mark.parametrize("accum", [1, 4])
def test_one_line_in_a_trainer_records_the_run(trainer_run, trainer, accum):
    out = trainer_run(trainer, accum)
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert len(rep.ranks) == 2 and not any("no communication" in w for w in rep.warnings)
    assert rep.knobs.get("sync_interval", 1) == accum
    assert {s.micro_steps for s in rep.steps} == {accum}
    frame = rep.table.frame
    assert (frame["data_ns"] > 0).all()  # the Trainer's own batch fetches, timed
    for phase in ("forward", "backward", "optimizer"):
        assert (frame[f"{phase}_ns"] > 0).all(), phase
    knobs = rep.knobs
    assert knobs["batch_size"] == (8 if trainer == "hf" else 16) and knobs["num_workers"] == 0
    assert knobs.get("gradient_accumulation_steps", knobs.get("accumulate_grad_batches")) == accum
    for r in rep.ranks:
        assert "all_reduce" in r.comm_by_kind and r.other_pct < 35
        marks = np.array(json.load(open(os.path.join(out, f"timings-rank{r.rank}.json")))
                         ["micro_end_s"]) * 1e3
        micro = np.diff(marks)  # micro-steps after the first
        n = (len(micro) + 1) // accum * accum - 1
        cycles = np.r_[np.nan, micro[:n]].reshape(-1, accum)[1:].sum(axis=1)  # warm-up left out
        ours = frame.loc[frame["rank"] == r.rank, "step_ns"].to_numpy() / 1e6
        assert len(ours) == len(cycles), (len(ours), len(cycles))
        # the cycles but the last, from both: the framework calls gpuscope's hook before the
        # loop's own mark, so a step's end work in the recorder (a flush) goes into the next
        # step on both clocks, but after the last step into the loop's last mark alone (a
        # busy-core clone: 48.9 ms there against 26.6, the others within 0.1 ms)
        assert abs(ours[:-1].mean() - cycles[:-1].mean()) <= 0.10 * cycles[:-1].mean(), \
            (ours.round(1), cycles.round(1))


@pytest.mark.parametrize("accum", [1, 4])
def test_fabric_module_records_without_recursion(trainer_run, accum):
    """record(model=) on the module fabric.setup returns (a _FabricModule, which forwards
    attribute writes to the module inside it: putting the forward wrapper there made the two
    forwards call each other, RecursionError on every rank at the first forward). Training
    finishes, forward is timed once per micro-step, DDP's all-reduce is timed through the DDP
    the wrapper holds (its accumulation seen), and the steps agree with the loop's clock."""
    out = trainer_run("fabric", accum)
    rep = gpuscope.analyze(os.path.join(out, "record"))
    assert len(rep.ranks) == 2 and not any("no communication" in w for w in rep.warnings)
    assert rep.knobs.get("sync_interval", 1) == accum
    assert rep.knobs["wrapper"] == "_FabricModule"
    assert rep.knobs["model"] == "DistributedDataParallel"
    frame = rep.table.frame
    assert (frame["forward_ns"] > 0).all() and (frame["backward_ns"] > 0).all()
    for r in rep.ranks:
        assert "all_reduce" in r.comm_by_kind
        marks = np.array(json.load(open(os.path.join(out, f"timings-rank{r.rank}.json")))
                         ["micro_end_s"]) * 1e3
        cycles = np.diff(marks)[accum - 1:].reshape(-1, accum).sum(axis=1)
        ours = frame.loc[frame["rank"] == r.rank, "step_ns"].to_numpy() / 1e6
        assert len(ours) == len(cycles), (len(ours), len(cycles))
        # step by step: a rank descheduled between gpuscope's step boundary and the loop's mark
        # moves a few ms from one step to the next in one source (3.6 ms in a 4 ms step, once,
        # with 2 busy cores), which a mean over 7 steps does not absorb
        assert np.median(np.abs(ours - cycles)) <= 0.10 * np.median(cycles), \
            (ours.round(1), cycles.round(1))


@pytest.mark.parametrize("trainer", ["hf", "lightning"])
def test_live_diagnosis_through_a_trainer(tmp_path, trainer):
    """record options pass through the callback: live_every and on_diagnosis on a Trainer that
    accumulates 2 micro-steps, rank 1 made 60 ms late in the framework's step hooks: the live
    lines name it while training (from its second late window) with about the time it slept per
    micro-step (HF calls its hooks 3 times per 2 micro-steps, Lightning once per micro-step), as
    the analysis does afterwards. 60 ms keeps the waiting share (~0.65) well clear of the 0.30
    that names a straggler after 2 windows on 2 ranks, also when this VM runs 2x slower (at 30
    ms it was 0.36-0.59, and once in a suite run a window fell under 0.30)."""
    pytest.importorskip("transformers" if trainer == "hf" else "lightning")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           SCRIPT, "--trainer", trainer, "--accum", "2", "--steps", "12", "--live-every", "6",
           "--slow-rank-ms", "60", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        assert _aborted_at_exit(proc.stderr, tmp_path), proc.stderr[-3000:]
    summaries = [json.loads(x) for x in open(tmp_path / "live.jsonl")]
    slow = json.load(open(tmp_path / "timings-rank1.json"))
    slept_ms = 1000 * slow["slept_s"] / len(slow["micro_end_s"])  # per micro-step
    assert len(summaries) >= 2  # 24 micro-steps, windows of 6; the last may be dropped at exit
    assert [s["steps"][0] for s in summaries] == list(range(0, 6 * len(summaries), 6))
    for i, s in enumerate(summaries):
        assert s["verdict"] == "imbalanced" and s["late_rank"] == 1
        if i:
            assert s["straggler"]["rank"] == 1
            # per micro-step (per optimizer step would be 2x); a window on this 2-core VM can
            # show half as much again (CI: 46.7 ms for 30 slept)
            assert 0.5 * slept_ms < s["straggler"]["excess_ms"] < 1.8 * slept_ms, slept_ms
    lines = [x for x in proc.stderr.splitlines() if x.startswith("gpuscope live [")]
    assert len(lines) == len(summaries)
    rep = gpuscope.analyze(str(tmp_path / "record"))
    assert [s.rank for s in rep.stragglers] == [1]
