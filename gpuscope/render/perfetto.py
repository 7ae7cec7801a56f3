"""`gpuscope export PATH --perfetto FILE`: every rank on one timeline, as Chrome trace JSON
(ui.perfetto.dev, chrome://tracing).

Recorded runs: one process per rank, one track each for its steps (a slice per step, named by
the step's label), data, compute (forward, backward, optimizer), communication by kind, wait and
other. A recorded row holds how long each part of the step took, not where in the step it ran, so
the parts are laid out in the order a training step runs them: the loop's own work before the
step, data, forward, backward, exposed communication (its wait for slower ranks first), optimizer,
the rest. Communication hidden behind compute is drawn ending where backward ends. Every step
slice says so in its args ("layout"). Ranks on other hosts are moved by their host's clock offset
(clocks.py: from the ends of the steps' synchronous collectives). What to draw (rows, waits,
labels, offsets) comes worked out from analyze/timeline.py.

Profiler traces: the ranks' own events, merged (one process per rank and original process, flow
ids kept apart per rank, other hosts' clocks shifted the same way), with a "gpuscope" process per
rank above them whose slices are the steps as analysed: label and parts in the args. Where a
DeviceMesh names the process groups, each collective gets its dimension in its args and a copy
on a "mesh <dim>" track of its rank's gpuscope process; recorded runs get a communication track
per kind and dimension ("comm: all_reduce [tp]").
"""

from __future__ import annotations

import gzip
import os
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from ..errors import GpuscopeError
from ..runtable import ns_column as _col
from ..vocab import MS

if TYPE_CHECKING:
    import pandas as pd

    from ..analyze.timeline import Timeline
    from ..results import ReportData
    from ..runtable import RunTable

LAYOUT = ("parts laid out in the order a step runs them (between, data, forward, backward, "
          "exposed comm with wait first, optimizer, other): a record holds their durations, "
          "not their positions")
#: tracks of a recorded rank: (thread id, name); communication kinds get ids from COMM_TID
TRACKS = {"step": 1, "data": 2, "compute": 3, "wait": 4, "other": 5}
COMM_TID = 10
#: per-dimension tracks of a trace's rank (its gpuscope process): ids from MESH_TID
MESH_TID = 100
PARTS = ("data", "forward", "backward", "compute", "comm", "comm_exposed", "wait", "optimizer",
         "other", "between")
FLOW_PHASES = {"s", "t", "f"}
#: flow ids of rank r are moved into their own range (r << FLOW_BITS): ids repeat across ranks
FLOW_BITS = 40


def _us(ns) -> float:
    return round(float(ns) / 1000.0, 3)



def _meta(pid: int, name: str, sort: int, tid: int | None = None) -> list[dict]:
    if tid is None:
        return [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
                {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
                 "args": {"sort_index": sort}}]
    return [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
             "args": {"sort_index": sort}}]


def _step_args(row: dict, result, micro: int | None = None) -> dict:
    args = {f"{p}_ms": round(row[f"{p}_ns"] / MS, 3) for p in PARTS if f"{p}_ns" in row}
    args["step_ms"] = round(row["step_ns"] / MS, 3)
    if result is None:
        args["label"] = "not analysed (warm-up or a step not on every rank)"
    else:
        args["label"] = result.label
        if result.secondary:
            args["secondary"] = list(result.secondary)
        if result.micro_steps > 1:
            args["optimizer_step"] = result.step
    if micro is not None:
        args["layout"] = LAYOUT
    return args


def record_events(table: "RunTable", report: "ReportData", tl: "Timeline") -> tuple[list[dict], dict]:
    """Trace events of a recorded run (micro-steps as recorded, all of them) and the metadata."""
    frame, results, offsets = tl.frame, tl.results, tl.offsets
    hosts = {r: info.host for r, info in table.ranks.items()}
    shift = frame["rank"].map(lambda r: offsets.get(r, 0)).to_numpy(dtype=np.int64)
    start = frame["start_ns"].to_numpy(dtype=np.int64) + shift
    t0 = int(start.min())
    kinds = _comm_kinds(table)
    kind_tid = {k: COMM_TID + i for i, k in enumerate(sorted({k for per in kinds.values() for k in per}))}
    stragglers = set(report.straggler_ranks)
    ev: list[dict] = []
    for rank in sorted(table.ranks):
        pid = rank + 1
        name = f"rank {rank}" + (f" ({hosts[rank]})" if hosts.get(rank) else "")
        if rank in stragglers:
            name += " straggler"
        ev += _meta(pid, name, rank)
        for track, tid in TRACKS.items():
            ev += _meta(pid, track, tid, tid)
        for kind, tid in kind_tid.items():
            ev += _meta(pid, f"comm: {kind}", tid, tid)
    cols = {c: _col(frame, c) for c in ("step_ns", "between_ns", "data_ns", "forward_ns",
                                        "backward_ns", "optimizer_ns", "compute_ns", "comm_ns",
                                        "comm_exposed_ns", "wait_ns", "other_ns")}
    records = frame.to_dict("records")
    for i, row in enumerate(records):
        rank, step = int(row["rank"]), int(row["step"])
        pid = rank + 1
        t = int(start[i]) - t0
        c = {k: int(v[i]) for k, v in cols.items()}

        def sl(tid, name, at, dur, args=None):
            if dur > 0:
                e = {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": _us(at),
                     "dur": _us(dur), "args": args or {"step": step}}
                ev.append(e)

        sl(TRACKS["step"], f"step {step}", t, c["step_ns"],
           {"step": step, **_step_args(row, results[i], micro=1)})
        sl(TRACKS["other"], "between steps", t, c["between_ns"])
        at = t + c["between_ns"]
        sl(TRACKS["data"], "data", at, c["data_ns"])
        at += c["data_ns"]
        named = c["forward_ns"] + c["backward_ns"] + c["optimizer_ns"]
        for part in ("forward", "backward"):
            sl(TRACKS["compute"], part, at, c[f"{part}_ns"])
            at += c[f"{part}_ns"]
        rest = c["compute_ns"] - named
        sl(TRACKS["compute"], "compute (not split)", at, rest)
        at += max(rest, 0)
        exposed = min(c["comm_exposed_ns"], max(c["step_ns"] - (at - t), 0))
        sl(TRACKS["wait"], "wait", at, min(c["wait_ns"], exposed))
        mine = kinds.get((rank, step)) if kinds else None
        if mine:
            for kind, (comm_ns, exp_ns) in sorted(mine.items()):
                hidden = max(comm_ns - exp_ns, 0)
                sl(kind_tid[kind], f"{kind} (overlapped)", max(at - hidden, t), hidden)
                sl(kind_tid[kind], kind, at, min(exp_ns, exposed))
        elif c["comm_ns"]:
            tid = kind_tid.setdefault("all", COMM_TID + len(kind_tid))
            hidden = max(c["comm_ns"] - c["comm_exposed_ns"], 0)
            sl(tid, "comm (overlapped)", max(at - hidden, t), hidden)
            sl(tid, "comm", at, exposed)
        at += exposed
        sl(TRACKS["compute"], "optimizer", at, c["optimizer_ns"])
        at += c["optimizer_ns"]
        sl(TRACKS["other"], "other", at, c["other_ns"] - c["between_ns"])
    if "all" in kind_tid:
        for rank in sorted(table.ranks):
            ev += _meta(rank + 1, "comm", kind_tid["all"], kind_tid["all"])
    meta = {"t0_unix_ns": t0, "layout": LAYOUT,
            "clock_offsets_ns": {str(r): v for r, v in sorted(offsets.items())}}
    return ev, meta


def _comm_kinds(table: "RunTable") -> dict:
    """{(rank, step): {track: (comm_ns, exposed_ns)}} from the collectives by kind, if timed;
    a kind whose group a DeviceMesh names gets a track per dimension ("all_reduce [tp]")."""
    comm = table.comm
    if comm is None or comm.empty:
        return {}
    dims = table.mesh_dims()
    out: dict = {}
    for r, s, key, c, e in zip(comm["rank"].tolist(), comm["step"].tolist(), comm["key"].tolist(),
                               comm["comm_ns"].tolist(), comm["exposed_ns"].tolist()):
        per = out.setdefault((r, s), {})
        kind, _, group = str(key).partition(":")
        if dims.get(group):
            kind = f"{kind} [{dims[group]}]"
        old = per.get(kind, (0, 0))
        per[kind] = (old[0] + int(c), old[1] + int(e))
    return out


def kineto_events(table: "RunTable", report: "ReportData", tl: "Timeline",
                  files: list[str], load) -> tuple[list, dict, list]:
    """The ranks' own events, merged, plus a gpuscope step track per rank; (events, metadata,
    warnings). `load(path)`: a trace file's document, every key kept (the reader's
    readers/kineto/raw.py, handed over by the caller)."""
    by_name: dict[str, list[str]] = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    offsets = tl.offsets
    ev: list[dict] = []
    warnings: list[str] = []
    stragglers = set(report.straggler_ranks)
    next_pid = 1
    gpids: dict[int, int] = {}
    dims = table.mesh_dims()
    mesh_tids: dict = {}
    for rank in sorted(table.ranks):
        info = table.ranks[rank]
        shift_us = offsets.get(rank, 0) / 1000.0
        base_sort = rank * 1000
        gpid = gpids[rank] = next_pid
        next_pid += 1
        name = f"rank {rank} gpuscope" + (" straggler" if rank in stragglers else "")
        ev += _meta(gpid, name, base_sort) + _meta(gpid, "steps", 0, 1)
        pids: dict = {}
        paths = [p for n in info.meta.get("files", []) for p in by_name.get(n, [])[:1]]
        for path in paths:
            try:
                doc = load(path)
            except (OSError, ValueError, msgspec.DecodeError, EOFError) as exc:
                warnings.append(f"{os.path.basename(path)}: its events are left out of the "
                                f"timeline ({exc})")
                continue
            for e in doc["traceEvents"]:
                if not isinstance(e, dict):
                    continue
                old = e.get("pid")
                key = old if isinstance(old, (int, str)) else ""
                if key not in pids:
                    pids[key] = next_pid
                    ev += _meta(next_pid, f"rank {rank} {key}", base_sort + len(pids))
                    next_pid += 1
                e["pid"] = pids[key]
                if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index"):
                    if e["name"] == "process_name":
                        ev.append({"ph": "M", "pid": e["pid"], "tid": 0, "name": "process_labels",
                                   "args": {"labels": str((e.get("args") or {}).get("name", ""))}})
                    continue
                if shift_us and isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + shift_us
                if e.get("ph") in FLOW_PHASES and isinstance(e.get("id"), int):
                    e["id"] = (rank << FLOW_BITS) | (e["id"] & ((1 << FLOW_BITS) - 1))
                ev.append(e)
                if dims:
                    _mesh_copy(e, dims, rank, gpid, mesh_tids, ev)
    # the steps as analysed, on each rank's gpuscope track (in the traces' own clock)
    for row, res in zip(tl.frame.to_dict("records"), tl.results):
        rank, step = int(row["rank"]), int(row["step"])
        start = int(row["start_ns"]) + offsets.get(rank, 0)
        ev.append({"ph": "X", "pid": gpids[rank], "tid": 1,
                   "name": f"step {step}: {res.label if res else 'not analysed'}",
                   "ts": round(start / 1000.0, 3), "dur": _us(row["step_ns"]),
                   "args": {"step": step, **_step_args(row, res)}})
    meta = {"clock_offsets_ns": {str(r): v for r, v in sorted(offsets.items()) if v}}
    return ev, meta, warnings


def _mesh_copy(e: dict, dims: dict, rank: int, pid: int, tids: dict, ev: list) -> None:
    """A collective whose process group a DeviceMesh names: its dimension added to its args,
    and a copy on that rank's gpuscope track for the dimension ("mesh tp"), so that each
    dimension's collectives line up on one track per rank."""
    args = e.get("args")
    if e.get("ph") != "X" or not isinstance(args, dict):
        return
    dim = dims.get(str(args.get("Process Group Name")))
    if dim is None:
        return
    args["mesh dim"] = dim
    if (rank, dim) not in tids:
        tids[(rank, dim)] = MESH_TID + len([k for k in tids if k[0] == rank])
        ev += _meta(pid, f"mesh {dim}", tids[(rank, dim)], tids[(rank, dim)])
    ev.append({"ph": "X", "pid": pid, "tid": tids[(rank, dim)], "name": e.get("name", ""),
               "ts": e.get("ts"), "dur": e.get("dur"), "args": {"mesh dim": dim,
               "Process Group Name": args.get("Process Group Name")}})


def write(report: "ReportData", table: "RunTable", tl: "Timeline", path: str,
          files: list[str] | None = None, load=None) -> dict:
    """Write the timeline of `tl` (analyze/timeline.py) to `path` (.gz: gzip); returns
    {"events", "ranks", "warnings"}. For traces, `files` and `load` (see kineto_events)."""
    if table.source == "record":
        ev, meta = record_events(table, report, tl)
        warnings: list[str] = []
    else:
        ev, meta, warnings = kineto_events(table, report, tl, files or [], load)
    from .. import __version__

    doc = {"traceEvents": ev, "displayTimeUnit": "ms",
           "otherData": {"generator": f"gpuscope {__version__}", "source": table.source,
                         "run": report.path, "verdict": report.verdict.label,
                         "stragglers": report.straggler_ranks, **meta}}
    blob = msgspec.json.encode(doc)
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "wb", compresslevel=5) as f:
                f.write(blob)
        else:
            with open(path, "wb") as f:
                f.write(blob)
    except OSError as exc:
        raise GpuscopeError(f"cannot write {path}: {exc}") from None
    return {"events": sum(1 for e in ev if e.get("ph") != "M"), "ranks": len(table.ranks),
            "warnings": warnings}
