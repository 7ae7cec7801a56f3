"""Live diagnosis (record(live_every=N)): real 2-rank runs name the bottleneck and the straggler
while they train; a rank that leaves or stalls never holds the others; the maths of a window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpuscope.record.live import WIDTH, Live, diagnose, windows_needed
from gpuscope.run_format import STEP_COLUMNS
from gpuscope.thresholds import Thresholds

WORKLOAD = os.path.join(os.path.dirname(__file__), "workloads", "live_train.py")


def _run(tmp_path, mode, *extra, timeout=120):
    out = tmp_path / "live.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           WORKLOAD, "--run-dir", str(tmp_path / "run"), "--out", str(out), "--mode", mode, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    summaries = [json.loads(x) for x in open(out)] if out.exists() else []
    ends = {r: json.load(open(f"{out}.rank-{r}")) for r in (0, 1) if os.path.exists(f"{out}.rank-{r}")}
    return proc, summaries, ends, wall


def _lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("gpuscope live [")]


@pytest.mark.slow
def test_live_names_the_straggler_while_training(tmp_path):
    proc, summaries, ends, _ = _run(tmp_path, "imbalanced", "--steps", "60", "--every", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(summaries) >= 4  # windows 0-9 ... 40-49 at least; the last may be dropped at exit
    for i, s in enumerate(summaries):
        assert s["verdict"] == "imbalanced" and s["late_rank"] == 1
        if i == 0:  # late in one window: not named yet
            assert s["straggler"] is None
            continue
        assert s["straggler"]["rank"] == 1 and s["straggler"]["windows"] == i + 1
        assert 20 < s["straggler"]["excess_ms"] < 45  # rank 1 sleeps 30 ms more per step
        assert s["ranks_reporting"] == 2
        assert s["at_unix_s"] < ends[0]["end_unix_s"]  # said while the run was still training
    assert summaries[0]["steps"] == [0, 9] and summaries[1]["steps"] == [10, 19]
    lines = _lines(proc.stderr)
    assert len(lines) == len(summaries)  # rank 0 only, one line per window
    assert "last to arrive: rank 1" in lines[0] and "straggler: rank" not in lines[0]
    assert "straggler: rank 1" in lines[1] and "imbalanced" in lines[1]
    assert ends[1]["summaries"] == 0  # the other ranks send, rank 0 diagnoses
    closing = [x for x in proc.stderr.splitlines() if x.startswith("gpuscope live: ended")]
    assert len(closing) == 1 and "straggler: rank 1" in closing[0], proc.stderr[-2000:]


@pytest.mark.slow
def test_live_names_a_data_bound_run(tmp_path):
    proc, summaries, _, _ = _run(tmp_path, "data", "--steps", "40", "--every", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(summaries) >= 3
    for s in summaries:
        # the label of the most time in each window (on a loaded machine other labels take
        # more of it: 39% data-bound seen at load 7, still the largest)
        assert s["verdict"] == "data-bound"
        assert s["shares"]["data-bound"] == max(s["shares"].values())
        assert s["straggler"] is None
        assert "DataLoader workers" in s["suggestion"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["leaves", "stalls"])
def test_a_rank_that_stops_early_never_holds_the_others(tmp_path, mode):
    """Rank 1 exits at step 25 (leaves) or stops and stays silent (stalls); rank 0 trains its
    120 steps at full speed: its loop is as long as its own steps, never a time-out."""
    proc, summaries, ends, _ = _run(tmp_path, mode, "--steps", "120", "--every", "5",
                                    "--stop-at", "25", "--timeout", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ends[0]["loop_s"] < 120 * 0.005 + 2.5  # 0.6 s of sleeps; no wait on the exchange
    assert 4 <= len(summaries) <= 6  # the windows both ranks finished, then nothing
    assert "live diagnosis stopped" in proc.stderr
    assert proc.stderr.count("live diagnosis stopped") == 1  # one warning, from rank 0


@pytest.mark.slow
def test_a_failing_callback_never_reaches_training(tmp_path):
    proc, summaries, ends, _ = _run(tmp_path, "raises", "--steps", "30", "--every", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(summaries) == 1  # called once, then no more
    assert "on_diagnosis raised" in proc.stderr
    assert len(_lines(proc.stderr)) >= 2  # the lines go on


def _row(step, step_ns, data=0, compute=0, comm=0, exposed=0):
    row = [0] * len(STEP_COLUMNS)
    for name, v in (("step", step), ("step_ns", step_ns), ("data_ns", data),
                    ("compute_ns", compute), ("comm_ns", comm), ("comm_exposed_ns", exposed),
                    ("other_ns", step_ns - data - compute - exposed)):
        row[STEP_COLUMNS.index(name)] = v
    return row


def _window(rows):
    live = Live(10)
    live.feed(rows)
    return live._window


def test_window_maths_by_hand():
    ms = 1_000_000
    # rank 0 computes 60 ms and waits 40 in the all-reduce; rank 1 computes 100, 0 wait;
    # the transfer itself is 5 ms on both
    r0 = _window([_row(s, 110 * ms, data=5 * ms, compute=60 * ms, comm=50 * ms, exposed=45 * ms)
                  for s in range(10)])
    r1 = _window([_row(s, 110 * ms, data=5 * ms, compute=100 * ms, comm=5 * ms, exposed=5 * ms)
                  for s in range(10)])
    assert len(r0) == WIDTH and r0[0] == 10 and r0[1:3] == [0, 9]
    s = diagnose([r0, r1], Thresholds())
    assert s["verdict"] == "imbalanced" and s["late_rank"] == 1
    assert s["straggler"] is None  # the first window rank 1 is late in
    assert s["shares"]["imbalanced"] == pytest.approx(40 / 110, abs=1e-4)
    assert s["shares"]["comm-bound"] == pytest.approx(5 / 110, abs=1e-4)
    s = diagnose([r0, r1], Thresholds(), before=s["late"])  # late the window before too
    assert s["straggler"] == {"rank": 1, "excess_ms": 40.0, "cause": "compute", "windows": 2}
    assert s["per_rank"][0]["wait_ms"] == 40.0 and s["per_rank"][1]["wait_ms"] == 0.0
    assert s["steps"] == [0, 9] and s["step_ms"] == 110.0
    # balanced, transfer-heavy: comm-bound, no straggler
    c = _window([_row(s, 100 * ms, compute=70 * ms, comm=40 * ms, exposed=25 * ms)
                 for s in range(10)])
    s = diagnose([c, c], Thresholds())
    assert s["verdict"] == "comm-bound" and s["straggler"] is None
    assert s["share"] == pytest.approx(0.25)
    assert "DDP buckets" in s["suggestion"]
    fsdp = diagnose([c, c], Thresholds(), {"model": "FSDPSequential"})
    assert "all-gathers" in fsdp["suggestion"] and "DDP" not in fsdp["suggestion"]
    # nothing over a threshold: compute-bound; a rank with no steps in the window is left out
    d = _window([_row(s, 100 * ms, data=3 * ms, compute=95 * ms) for s in range(10)])
    s = diagnose([d, [0.0] * WIDTH], Thresholds())
    assert s["verdict"] == "compute-bound" and s["ranks_reporting"] == 1
    assert diagnose([[0.0] * WIDTH], Thresholds()) is None


def _waits(ranks: int, late: int | None, wait_ms: float) -> list:
    """One window of `ranks` ranks: all compute 100 ms, and all but `late` then wait `wait_ms`
    for it in the all-reduce (5 ms transfer)."""
    ms = 1_000_000
    out = []
    for r in range(ranks):
        w = 0 if r == late or late is None else wait_ms
        out.append(_window([_row(s, int((105 + wait_ms) * ms), compute=int((100 + wait_ms - w) * ms),
                                 comm=int((5 + w) * ms), exposed=int((5 + w) * ms))
                            for s in range(10)]))
    return out


@pytest.mark.parametrize("ranks, wait_ms, needed", [
    (2, 60, 2),    # clear: 36% of the step waiting (3x the threshold) in both windows
    (2, 14, 5),    # small: 12%; the same one of 2 ranks last 5 times in a row by chance: 6%
    (4, 14, 3),    # 1 in 16
    (16, 14, 2),   # 1 in 16 already
])
def test_a_straggler_is_named_only_when_late_in_enough_windows_in_a_row(ranks, wait_ms, needed):
    """Lateness that moves between ranks (jitter) never names anyone; the same rank last in
    enough windows in a row is named (fewer when the waiting is large or the ranks many), and
    loses the name when another rank is last or a window is balanced."""
    live = Live(10, log=False)
    late = [1, 0, 1, 0] + [1] * (needed + 1) + [None] + [1] * needed + [0]
    for who in late:
        live._report(_waits(ranks, who, wait_ms))
    got = [s["late_rank"] for s in live.summaries]
    named = [s["straggler"]["rank"] if s["straggler"] else None for s in live.summaries]
    assert got == late
    first = 4 + needed - 1  # the window that completes the run of `needed`
    want = [None] * len(late)
    want[first] = want[first + 1] = 1
    want[4 + needed + 1 + needed] = 1
    assert named == want, (named, want)
    assert [s["straggler"]["windows"] for s in live.summaries if s["straggler"]] == [
        needed, needed + 1, needed]
    assert "changes from window to window" in live.summaries[1]["suggestion"]
    assert "changes from window to window" in live.summaries[-1]["suggestion"]
    assert live.summaries[4 + needed + 1]["verdict"] == "compute-bound"
    assert f"named a straggler once last in {needed} in a row" in live.summaries[0]["line"]
    assert needed == windows_needed(ranks) or wait_ms > 50


def test_one_process_without_torch_distributed_diagnoses_itself(tmp_path, capsys):
    """world size 1: no exchange, the rank's own window is the diagnosis."""
    import gpuscope

    got = []
    with gpuscope.record(tmp_path, live_every=5, on_diagnosis=got.append) as rec:
        for _ in rec.data(iter(range(12))):
            time.sleep(0.004)  # a slow "loader" would show as data; here the step sleeps
            rec.step()
    assert len(got) == 2 and got[0]["steps"] == [0, 4] and got[1]["steps"] == [5, 9]
    assert got[0]["verdict"] == "compute-bound"
    assert rec.live_summaries == got
    err = capsys.readouterr().err
    assert len(_lines(err)) == 2
    # one closing line: what the windows covered, the steps after them, the whole run's command
    closing = [x for x in err.splitlines() if x.startswith("gpuscope live: ")]
    assert closing == [f"gpuscope live: ended after step 11: 2 window(s) diagnosed, steps 0-9; "
                       "the last: compute-bound, no straggler named; steps 10-11 in no window; "
                       f"the whole run: gpuscope analyze {tmp_path}"]


def test_the_exchange_stays_on_the_cpu_whatever_the_default_device(monkeypatch):
    """A loop that sets torch.set_default_device("cuda") must not move the live exchange (a
    gloo group of gpuscope's own) onto the GPU and the training's stream. "meta" stands in for
    the GPU here; the collective is captured instead of sent (one process)."""
    import torch
    import torch.distributed as dist

    sent = []

    class Pending:
        def is_completed(self):
            return False

    def all_gather(outs, t, group=None, async_op=False):
        sent.append([t.device] + [o.device for o in outs])
        return Pending()

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    live = Live(10, rank=1, world_size=2, log=False)
    monkeypatch.setattr(live, "_new_group", lambda d: object())
    torch.set_default_device("meta")
    try:
        live.launch()
    finally:
        torch.set_default_device(None)
    assert not live.off
    assert sent == [[torch.device("cpu")] * 3]
