"""`gpuscope export --perfetto`: structure, counts and durations against the run itself, clock
alignment across hosts, and the Kineto merge keeping every event of every rank."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections import Counter, defaultdict

import pytest

import gpuscope
from gpuscope.analyze.wait import estimate_wait
from gpuscope.cli import main
from gpuscope.readers import read_path
from gpuscope.render.perfetto import COMM_TID, TRACKS
from gpuscope.trace_files import find_trace_files

ROOT = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
REC = os.path.join(ROOT, "imbalanced", "record")
KIN = os.path.join(ROOT, "imbalanced", "kineto")


def _export(src, out) -> dict:
    assert main(["export", src, "--perfetto", out]) == 0
    opener = gzip.open if out.endswith(".gz") else open
    with opener(out, "rt") as f:
        return json.load(f)


def _names(doc, what="process_name") -> dict:
    return {(e["pid"], e["tid"]) if what == "thread_name" else e["pid"]: e["args"]["name"]
            for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == what}


def _slices(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _nested_or_disjoint(slices) -> bool:
    """Slices on one track: each either inside the one open before it or after it (what the
    trace viewers need to draw a track)."""
    stack: list[float] = []
    for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        while stack and stack[-1] <= e["ts"] + 1e-3:
            stack.pop()
        if stack and end > stack[-1] + 1e-3:
            return False
        stack.append(end)
    return True


def test_record_timeline_matches_the_run(tmp_path):
    doc = _export(REC, str(tmp_path / "t.json"))
    table = read_path(REC)
    report = gpuscope.analyze(REC)
    frame = estimate_wait(table.frame, [], table.comm)
    procs = _names(doc)
    assert sorted(procs) == [r + 1 for r in table.ranks]  # one process per rank
    assert procs[2].startswith("rank 1") and "straggler" in procs[2]  # the imbalanced run's
    assert "straggler" not in procs[1]
    threads = _names(doc, "thread_name")
    assert {threads[(1, tid)] for tid in TRACKS.values()} == set(TRACKS)
    assert threads[(1, COMM_TID)] == "comm: all_reduce"
    sl = _slices(doc)
    by_track = defaultdict(list)
    for e in sl:
        by_track[(e["pid"], e["tid"])].append(e)
    for track, items in by_track.items():
        assert _nested_or_disjoint(items), track
    labels = {s.step: s.label for s in report.steps}
    for rank in table.ranks:
        rows = frame[frame["rank"] == rank]
        steps = sorted(by_track[(rank + 1, TRACKS["step"])], key=lambda e: e["ts"])
        assert [e["args"]["step"] for e in steps] == rows["step"].tolist()  # every step, in order
        for e, (_, row) in zip(steps, rows.iterrows()):
            assert e["dur"] == pytest.approx(row["step_ns"] / 1e3, abs=1e-3)
            assert e["args"]["label"] == labels.get(row["step"], e["args"]["label"])
            assert "layout" in e["args"]
        assert sum(e["args"]["step"] in labels for e in steps) == len(labels)  # warm-up: not

        def total(tid, name=None):
            return sum(e["dur"] for e in by_track[(rank + 1, tid)] if name in (None, e["name"]))

        us = lambda col: rows[col].sum() / 1e3  # noqa: E731
        assert total(TRACKS["data"]) == pytest.approx(us("data_ns"), rel=1e-6)
        assert total(TRACKS["wait"]) == pytest.approx(us("wait_ns"), rel=1e-6)
        assert total(TRACKS["wait"]) > 0 if rank == 0 else True  # rank 0 waits for rank 1
        assert total(TRACKS["compute"]) == pytest.approx(us("compute_ns"), rel=1e-6)
        assert total(TRACKS["compute"], "backward") == pytest.approx(us("backward_ns"), rel=1e-6)
        assert total(TRACKS["other"]) == pytest.approx(us("other_ns"), rel=1e-6)
        comm = table.comm[table.comm["rank"] == rank]
        assert total(COMM_TID) == pytest.approx(comm["comm_ns"].sum() / 1e3, rel=1e-6)
        assert total(COMM_TID, "all_reduce") == pytest.approx(
            comm["exposed_ns"].sum() / 1e3, rel=1e-6)
        # the parts fill the step: each step's slices on the exclusive tracks add up to it
        for e in steps:
            inside = [x for tid in (TRACKS["data"], TRACKS["compute"], TRACKS["other"])
                      for x in by_track[(rank + 1, tid)] if x["args"]["step"] == e["args"]["step"]]
            exposed = [x for x in by_track[(rank + 1, COMM_TID)]
                       if x["args"]["step"] == e["args"]["step"] and x["name"] == "all_reduce"]
            assert sum(x["dur"] for x in inside + exposed) == pytest.approx(e["dur"], abs=0.01)
            for x in inside + exposed:
                assert e["ts"] - 1e-3 <= x["ts"] and x["ts"] + x["dur"] <= e["ts"] + e["dur"] + 0.01
            # waiting is the first part of the exposed communication
            for w in by_track[(rank + 1, TRACKS["wait"])]:
                if w["args"]["step"] == e["args"]["step"]:
                    assert len(exposed) == 1 and w["ts"] == pytest.approx(exposed[0]["ts"], abs=1e-3)
                    assert w["dur"] <= exposed[0]["dur"] + 1e-3
    assert doc["otherData"]["verdict"] == report.verdict.label
    assert doc["otherData"]["clock_offsets_ns"] == {}  # one host: one clock, nothing moved


def _move_rank_to_host(src, dst, rank, host, shift_ns):
    """A copy of a run dir whose `rank` ran on `host`, whose clock reads `shift_ns` ahead."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, f"rank-{rank:05d}.gpuscope.jsonl")
    lines = open(path).read().splitlines()
    head = json.loads(lines[0])
    head["host"] = host
    out = [json.dumps(head)]
    for line in lines[1:]:
        row = json.loads(line)
        if isinstance(row, list):
            row[head["columns"].index("start_ns")] += shift_ns
        out.append(json.dumps(row))
    open(path, "w").write("\n".join(out) + "\n")


def test_record_ranks_on_another_host_are_aligned(tmp_path):
    run = str(tmp_path / "run")
    _move_rank_to_host(REC, run, 1, "node-b", 7_000_000_000)
    doc = _export(run, str(tmp_path / "t.json"))
    offset = doc["otherData"]["clock_offsets_ns"]["1"]
    assert offset == pytest.approx(-7e9, abs=5e6)  # 7 s found back within 5 ms
    steps = defaultdict(dict)
    for e in _slices(doc):
        if e["tid"] == TRACKS["step"]:
            steps[e["args"]["step"]][e["pid"] - 1] = e["ts"]
    # the same step starts within a step's length on both ranks again (7 s apart on the files)
    assert all(abs(v[0] - v[1]) < 200e3 for v in steps.values() if len(v) == 2)


def test_kineto_merge_keeps_every_event_and_adds_the_steps(tmp_path):
    doc = _export(KIN, str(tmp_path / "t.json.gz"))
    table = read_path(KIN)
    report = gpuscope.analyze(KIN)
    raw = []
    for f in find_trace_files(KIN):
        raw += json.load(gzip.open(f))["traceEvents"]
    kept = Counter(e["ph"] for e in raw if not (e["ph"] == "M" and e["name"] in (
        "process_name", "process_sort_index")))
    out = Counter(e["ph"] for e in doc["traceEvents"])
    steps = [e for e in _slices(doc) if e["name"].startswith("step ")]
    assert out["X"] == kept["X"] + len(steps)
    assert out["s"] == kept["s"] and out["f"] == kept["f"]
    assert len(steps) == len(report.table.frame)
    procs = _names(doc)
    for rank in table.ranks:
        mine = {pid for pid, name in procs.items() if name.startswith(f"rank {rank} ")}
        assert len(mine) >= 3  # gpuscope + the rank's own processes (CPU process, ...)
        gp = next(pid for pid in mine if "gpuscope" in procs[pid])
        ours = sorted((e for e in steps if e["pid"] == gp), key=lambda e: e["ts"])
        rows = report.table.frame[report.table.frame["rank"] == rank]
        assert [e["args"]["step"] for e in ours] == rows["step"].tolist()
        assert [e["dur"] for e in ours] == pytest.approx((rows["step_ns"] / 1e3).tolist(), abs=1e-3)
        labels = {s.step: s.label for s in report.steps}
        assert all(e["name"] == f"step {e['args']['step']}: {labels[e['args']['step']]}"
                   for e in ours)
        # the profiler's own ProfilerStep slices sit where gpuscope's step slices are
        prof = sorted((e for e in _slices(doc) if e["pid"] in mine and e["pid"] != gp
                       and e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        starts = {int(e["name"].split("#")[1]): e["ts"] for e in prof}
        for e in ours:
            assert e["ts"] == pytest.approx(starts[e["args"]["step"]], abs=1.0)
    assert "straggler" in procs[next(p for p, n in procs.items() if n.startswith("rank 1 gpuscope"))]
    # flows stay within one rank: the ids of different ranks no longer collide
    flow_pids = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flow_pids[e["id"]].add(procs[e["pid"]].split()[1])
    assert flow_pids and all(len(ranks) == 1 for ranks in flow_pids.values())


def test_kineto_ranks_on_another_host_are_aligned(tmp_path):
    src = tmp_path / "traces"
    src.mkdir()
    shift_us = 5_000_000.0
    from helpers import trace_of_rank

    rank1 = set(trace_of_rank(KIN, 1))
    for f in find_trace_files(KIN):
        name = os.path.basename(f)
        doc = json.load(gzip.open(f))
        if name in rank1:  # rank 1's process: another host, a clock 5 s ahead
            name = name.replace("vm_", "nodeb_", 1)
            for e in doc["traceEvents"]:
                if "ts" in e:
                    e["ts"] += shift_us
        with gzip.open(src / name, "wt") as out:
            json.dump(doc, out)
    table = read_path(str(src))
    assert table.ranks[1].host == "nodeb"
    assert table.ranks[1].meta["clock_offset_ns"] == pytest.approx(-5e9, abs=5e6)
    assert "clock_offset_ns" not in table.ranks[0].meta
    doc = _export(str(src), str(tmp_path / "t.json"))
    procs = _names(doc)
    first = {}
    for e in _slices(doc):
        if e["name"].startswith("ProfilerStep#"):
            rank = int(procs[e["pid"]].split()[1])
            first[rank] = min(first.get(rank, float("inf")), e["ts"])
    assert abs(first[0] - first[1]) < 100e3  # back within 0.1 s, not 5 s apart
    # the analysis itself is the same with or without the shift (it matches by durations)
    assert gpuscope.analyze(str(src)).to_dict()["steps"] == gpuscope.analyze(KIN).to_dict()["steps"]


def test_export_asks_for_an_output(capsys):
    assert main(["export", REC]) == 2
    assert "--perfetto" in capsys.readouterr().err
