"""Shared test helpers: run demo scenarios under torchrun, build RunTables by hand."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import threading
import time

import pandas as pd

from gpuscope.runtable import RankInfo, RunTable

MS = 1_000_000


def table_from_rows(rows: list[dict], knobs: dict | None = None, world: int | None = None) -> RunTable:
    """RunTable from dicts with rank, step and *_ms values (missing parts are 0)."""
    cols = ("step", "data", "compute", "comm", "comm_exposed", "other", "forward", "backward",
            "optimizer")
    recs = []
    for r in rows:
        rec = {"rank": r["rank"], "step": r["step"], "start_ns": r["step"] * 100 * MS}
        for c in cols[1:]:
            rec[f"{c}_ns"] = int(r.get(c, 0) * MS)
        rec["step_ns"] = int(r.get("step_ms", sum(r.get(c, 0) for c in
                                                   ("data", "compute", "comm_exposed", "other"))) * MS)
        rec["n_comm"] = 1 if r.get("comm", 0) else 0
        rec["data_cpu_ns"] = int(r.get("data_cpu", r.get("data", 0)) * MS)
        rec["wait_ns"] = 0
        if "synced" in r:
            rec["synced"] = int(r["synced"])
        if "between" in r:  # the loop's own work after rec.step(), a part of other
            rec["between_ns"] = int(r["between"] * MS)
        recs.append(rec)
    frame = pd.DataFrame(recs).sort_values(["rank", "step"]).reset_index(drop=True)
    ranks = {r: RankInfo(r, f"host{r}", dict(knobs or {})) for r in frame["rank"].unique()}
    return RunTable(frame, "record", "<hand-built>", ranks, world or len(ranks), [])


def about_recording(warnings: list[str]) -> list[str]:
    """The warnings that are not about suggestions or the verdict. Which bottleneck a short run
    on a shared machine shows depends on its load, and with it whether a fix could be estimated
    ("no suggestion for ...") or had to be held to what it can recover ("suggestion ..."), and
    whether a step the machine stalled made the verdict unexplained ("unexplained: ...", once in
    a fresh-clone suite at load 4.7): tests of the recording assert on the rest."""
    return [w for w in warnings
            if not w.startswith(("no suggestion for ", "suggestion ", "unexplained: "))]


def balanced(n_steps: int, n_ranks: int, **parts) -> list[dict]:
    return [{"rank": r, "step": s, **parts} for r in range(n_ranks) for s in range(n_steps)]


def live_children() -> list[int]:
    """Child processes of this process still running (zombies left out), from /proc."""
    import glob
    import os

    pids = []
    for task in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(task) as fh:
                pids += [int(p) for p in fh.read().split()]
        except OSError:
            continue
    live = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    live.append(pid)
        except OSError:
            continue
    return live


def add_side_files(run_dir: str) -> list[str]:
    """Write beside each record file of `run_dir` the column side file the recorder writes now,
    made from its lines by the writer's own Chunk (chunks of Chunk.MAX_ROWS rows); a file whose
    rows the columns cannot hold gets none, as from the recorder. Returns the side files."""
    from gpuscope.record.columns import Chunk
    from gpuscope.run_format import columns_path

    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "rank-*.gpuscope.jsonl"))):
        blob = open(path, "rb").read()
        if json.loads(blob[:blob.index(b"\n")]).get("columns") is None:
            continue
        cut = blob.index(b"\n") + 1
        chunks, chunk = [], Chunk(cut)
        for line in blob[cut:].splitlines(keepends=True):
            obj = json.loads(line)
            if isinstance(obj, list):
                if not chunk.add_rows([obj], line):
                    break
            else:
                chunk.add_side(line)
            if chunk.full:
                chunks.append(chunk.to_bytes())
                chunk = Chunk(chunk.offset + chunk.length)
        else:
            with open(columns_path(path), "wb") as fh:
                fh.write(b"".join(chunks + ([chunk.to_bytes()] if chunk.lines else [])))
            out.append(columns_path(path))
    return out


def spy_taken(monkeypatch, module, name: str) -> list[bool]:
    """Wraps module.name (a reader's path that returns None when it declines the input): the
    returned list gets, per call, whether it took it."""
    seen = []
    real = getattr(module, name)

    def spy(*a):
        got = real(*a)
        seen.append(got is not None)
        return got

    monkeypatch.setattr(module, name, spy)
    return seen


def unconfirmed_stragglers(record_dir: str, report: dict) -> list[tuple]:
    """The ranks a demo run's report names as stragglers that the loop's own clock does not
    show computing longer: (rank, excess ms, its own ms, the others' ms) for each. The demo's
    `--timings` (beside the record dir) holds each rank's perf_counter around its forward and
    its optimizer step, work with no communication inside. On a busy 2-core host one rank can
    really compute longer for a whole run (the ranks, the test runner and another process share
    the cores unevenly): the tool is right to name it. A rank named with no such difference is
    one the tool made up."""
    path = os.path.join(os.path.dirname(record_dir.rstrip("/")), "timings.jsonl")
    own = {}
    for line in open(path):
        d = json.loads(line)
        own[d["rank"]] = (median_after_warmup(d["forward_s"])
                          + median_after_warmup(d.get("optimizer_s") or [0.0]))
    return not_computing_longer(report, own)


def median_after_warmup(xs: list) -> float:
    import statistics

    return statistics.median(xs[1:] or xs)  # the first (warm-up) step left out


def not_computing_longer(report: dict, own_s: dict) -> list[tuple]:
    """The stragglers of `report` whose own local work (seconds per step, by rank: the loop's
    clock) is not at least 10% longer than the median of the other ranks' - of the other ranks
    of its group where the report names one (a hybrid run's data-parallel peers: another
    pipeline stage does other work): (rank, excess ms, its own ms, the others' ms) for each."""
    import statistics

    out = []
    for s in report["straggler_details"]:
        group = [r for r in s.get("group") or [] if r != s["rank"] and r in own_s]
        others = [v for r, v in own_s.items() if r != s["rank"] and (not group or r in group)]
        mine = own_s.get(s["rank"])
        if mine is None or not others or mine < 1.10 * statistics.median(others):
            out.append((s["rank"], s["excess_ms"], None if mine is None else round(mine * 1e3, 2),
                        round(statistics.median(others) * 1e3, 2) if others else None))
    return out


def trace_of_rank(folder: str, rank: int) -> list[str]:
    """The trace files of one rank in a folder of traces (by its distributedInfo), sorted: a
    sample's file names hold its processes' ids, which change whenever it is made again."""
    import gzip

    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt") as fh:
            if json.load(fh).get("distributedInfo", {}).get("rank") == rank:
                out.append(name)
    return out


def script(name: str):
    """scripts/<name>.py loaded as a module (the scripts are not a package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeCuda:
    """Fake CUDA events (no GPU here): each record() takes the next time from a scripted GPU
    timeline; an event counts as complete once the fake GPU clock has passed it. The real CUDA
    path runs on a GPU machine (scripts/gpu_check.sh)."""

    def __init__(self, timeline):
        self.timeline = list(timeline)
        self.now = 0
        self.created = 0

    def new_event(self):
        self.created += 1
        return {"t": None}

    def record(self, ev):
        ev["t"] = self.timeline.pop(0)

    def done(self, ev):
        return ev["t"] is not None and ev["t"] <= self.now

    def elapsed_ns(self, a, b):
        return b["t"] - a["t"]

    def synchronize(self):
        self.now = float("inf")


# torch.profiler (Kineto) events by hand, times in µs as a trace writes them
def X(name, ts, dur, cat="cpu_op", tid=1, **args):
    """A complete event."""
    e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def launch(ts, corr):
    """A kernel launch on the training thread (its correlation id ties it to the kernel)."""
    return X("cudaLaunchKernel", ts, 5, cat="cuda_runtime", correlation=corr)


def kernel(name, ts, dur, corr, stream=7, **args):
    """A kernel on a stream."""
    return X(name, ts, dur, cat="kernel", tid=stream, correlation=corr, stream=stream, **args)


def rerun_band(rep) -> float:
    """The share every suggestion's range of report `rep` was widened by for a re-run's noise
    (gpuscope/analyze/rerun_noise.py)."""
    from gpuscope.analyze.rerun_noise import band

    return band([s.step_ns for s in rep.steps], rep.knobs)[0]


class FakeTime:
    """A clock (integer ns, as RecordOptions.clock) that only a sleep moves: time.sleep patched
    to advance it by exactly what it is asked, at once (fake_time()).

    A thread that waits on it (`wait(due, stop)`: the NVML sampler's) runs as in a discrete-event
    simulation: a sleep that moves the clock past a waiter's due time stops the clock there,
    wakes it, and goes on only once it waits again (its work done at exactly that time) or has
    left; so what it reads of the clock is exact."""

    def __init__(self, start_ns: int = 10**9):
        self.ns = int(start_ns)
        self._cv = threading.Condition()
        self._due: dict = {}  # a waiting thread's stop Event -> its due time; kept while it works

    def __call__(self) -> int:
        return self.ns

    def sleep(self, seconds: float) -> None:
        target = self.ns + int(round(seconds * 1e9))
        with self._cv:
            while True:
                due = min(self._due.values(), default=None)
                if due is None or due > target:
                    break
                self.ns = max(self.ns, due)
                self._cv.notify_all()
                # until every waiter woken has done its work and waits again (or left)
                if not self._cv.wait_for(lambda: all(d > self.ns for d in self._due.values()),
                                         timeout=10):
                    raise TimeoutError("a thread waiting on the fake clock never came back")
            self.ns = max(self.ns, target)

    def join(self, stop) -> None:
        """A thread that will wait on the clock, counted in before it starts (keyed by its stop
        Event): the clock does not move until it waits."""
        with self._cv:
            self._due[stop] = -1

    def wait(self, due: int, stop) -> bool:
        """Block until the clock reaches `due`; True (and counted out) once `stop`, an Event,
        is set."""
        with self._cv:
            self._due[stop] = due
            self._cv.notify_all()
            while self.ns < due and not stop.is_set():
                self._cv.wait(timeout=0.02)  # stop is an Event: looked at every 20 ms
            if stop.is_set():
                del self._due[stop]
                self._cv.notify_all()
                return True
            return False  # its entry stays (due <= now) until it waits again: the sleeper waits


@contextlib.contextmanager
def fake_time(start_ns: int = 10**9):
    """`with fake_time() as clock: gpuscope.record(..., clock=clock)`: every time.sleep in the
    block (any thread's) advances `clock` and returns at once, so timings are exact."""
    clock = FakeTime(start_ns)
    real = time.sleep
    time.sleep = clock.sleep
    try:
        yield clock
    finally:
        time.sleep = real
