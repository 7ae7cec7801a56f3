"""Sorts the decoded events of one trace into typed columns (integer ns) by what they mean.

Host ranges: ProfilerStep#N, DataLoader waits, CPU collectives (gloo:*, nccl:*, c10d::*), host ops.
Device events (anything with a stream, as HTA counts them): compute kernels, communication kernels
(ncclKernel* / ncclDevKernel*), memcpy / memset. Launches (runtime events with a correlation id)
tie device events to the host time that launched them. Names are classified during the one pass
and then dropped, so nothing per-event outlives the function but numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .decode import Event

# host range kinds
STEP, DATA, COMM_HOST, OP = 0, 1, 2, 3
# what an OP range is part of (host_sub)
NONE, FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2, 3
# device event kinds
COMPUTE, COMM, MEMORY = 0, 1, 2

_DEVICE_SKIP_CATS = {"gpu_user_annotation", "gpu_annotation"}
_COMM_HOST_PREFIX = ("gloo:", "nccl:", "mpi:", "ucc:")  # the collective itself (CPU backends)
# c10d::allreduce_ / record_param_comms only launch a collective: host work, not communication
_OP_CATS = {"cpu_op", "Operator", "user_annotation", "python_function"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "mtia_runtime", "hip_runtime",
                "xpu_runtime", "privateuse1_runtime"}


@dataclass
class RankEvents:
    """Columns of one trace file. Times are absolute integer ns (µs in the file x 1000)."""

    host_kind: np.ndarray       # STEP / DATA / COMM_HOST / OP
    host_start: np.ndarray
    host_end: np.ndarray
    host_tid: np.ndarray        # thread id as in the trace (names get negative ids)
    step_id: np.ndarray         # N of ProfilerStep#N for STEP rows, else -1
    host_sub: np.ndarray        # FORWARD / BACKWARD / OPTIMIZER for OP rows, else NONE
    host_coll: list             # for COMM_HOST rows: ("", name) used to match across ranks
    dev_kind: np.ndarray        # COMPUTE / COMM / MEMORY
    dev_start: np.ndarray
    dev_end: np.ndarray
    dev_corr: np.ndarray        # correlation id (-1 when absent)
    dev_stream: np.ndarray
    dev_coll: list              # for COMM rows: (group, collective) used to match across ranks
    launch_corr: np.ndarray     # runtime launch correlation ids
    launch_ts: np.ndarray       # and their host start times
    step_thread: int = -1       # thread that carries the ProfilerStep ranges
    float_ts: bool = False      # timestamps written as floats (ns resolution, PyTorch >= 2.3)
    loader: str = ""            # DataLoader iterator seen: "single-process" | "multi-process"
    counts: dict = field(default_factory=dict)

    @classmethod
    def concat(cls, parts: list["RankEvents"]) -> "RankEvents":
        """One rank's events from several files (repeated profiler cycles)."""
        if len(parts) == 1:
            return parts[0]
        arrays = {}
        for name in ("host_kind", "host_start", "host_end", "host_tid", "step_id", "host_sub",
                     "dev_kind", "dev_start", "dev_end", "dev_corr", "dev_stream", "launch_corr",
                     "launch_ts"):
            arrays[name] = np.concatenate([getattr(p, name) for p in parts])
        return cls(**arrays, host_coll=[x for p in parts for x in p.host_coll],
                   dev_coll=[x for p in parts for x in p.dev_coll],
                   step_thread=parts[0].step_thread, float_ts=any(p.float_ts for p in parts),
                   loader=next((p.loader for p in parts if p.loader), ""),
                   counts={"events": sum(p.counts.get("events", 0) for p in parts)})


def _num(x) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def _int(x, default: int = -1) -> int:
    v = _num(x)
    return int(v) if v is not None else default


def device_kind(name: str, cat: str) -> int:
    if name.startswith("nccl") or name.startswith("rccl") or "gloo" in name[:12]:
        return COMM
    if cat in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset") or "Memcpy" in name or \
            "Memset" in name:
        return MEMORY
    return COMPUTE


def collective_key(name: str, args) -> tuple:
    group = args.pg_name if args is not None and args.pg_name is not None else ""
    coll = args.collective if args is not None and args.collective is not None else None
    if coll is None:  # ncclKernel_AllReduce_RING_LL_Sum_float(...) / ncclDevKernel_SendRecv(...)
        base = name.split("(", 1)[0]
        parts = base.split("_")
        coll = parts[1] if len(parts) > 1 else base
    return (str(group), str(coll).lower())


def op_part(name: str) -> int:
    if name.startswith("autograd::engine::evaluate_function") or name == "## backward ##":
        return BACKWARD
    if name.startswith("Optimizer.step#") or name == "## optimizer ##":
        return OPTIMIZER
    if name.endswith(".forward") or name == "## forward ##":
        return FORWARD
    return NONE


def sort_events(evs: list) -> RankEvents:
    """One pass over decoded events (emptied as it goes): classify, convert µs floats to ns
    integers, keep numbers only."""
    hk, hs, hd, ht, hstep, hsub, hcoll = [], [], [], [], [], [], []
    loader = ""
    dk, ds, dd, dc, dst, dcoll = [], [], [], [], [], []
    lc, lt = [], []
    tids: dict = {}
    float_ts = False
    n_events = len(evs)
    for i in range(n_events):
        e = evs[i]
        evs[i] = None  # release each event once read: the peak stays at the decoded size
        if type(e) is not Event:
            continue
        if not float_ts and isinstance(e.ts, float):
            float_ts = True
        ts = _num(e.ts)
        if ts is None:
            continue
        dur = _num(e.dur) or 0.0
        name = e.name if isinstance(e.name, str) else ""
        cat = e.cat if isinstance(e.cat, str) else ""
        args = e.args
        stream = _int(args.stream) if args is not None else -1
        if stream >= 0 and cat not in _DEVICE_SKIP_CATS:
            kind = device_kind(name, cat)
            dk.append(kind)
            ds.append(ts)
            dd.append(dur)
            dc.append(_int(args.correlation))
            dst.append(stream)
            dcoll.append(collective_key(name, args) if kind == COMM else None)
            continue
        if args is not None and cat in _LAUNCH_CATS:
            corr = _int(args.correlation)
            if corr >= 0:
                lc.append(corr)
                lt.append(ts)
            continue
        sub, coll = NONE, None
        if name.startswith("ProfilerStep#"):
            kind, sid = STEP, _int(name[13:])
        elif "DataLoader" in name and "__next__" in name:
            kind, sid = DATA, -1
            if not loader:
                loader = "single-process" if "SingleProcess" in name else "multi-process"
        elif name.startswith(_COMM_HOST_PREFIX):
            kind, sid, coll = COMM_HOST, -1, ("", name)
        elif cat in _OP_CATS:
            kind, sid, sub = OP, -1, op_part(name)
        else:
            continue
        hk.append(kind)
        hs.append(ts)
        hd.append(dur)
        tid = e.tid
        ht.append(tid if isinstance(tid, int) else tids.setdefault(tid, -1 - len(tids)))
        hstep.append(sid)
        hsub.append(sub)
        hcoll.append(coll)
    starts = hs + ds + lt
    base = math.floor(min(starts)) if starts else 0

    def ns(values) -> np.ndarray:
        # subtract a whole-µs base before scaling: keeps sub-µs digits of float timestamps
        arr = np.asarray(values, dtype=np.float64)
        return np.rint((arr - base) * 1000.0).astype(np.int64) + base * 1000

    host_start, dev_start = ns(hs), ns(ds)
    host_end = host_start + np.rint(np.asarray(hd, dtype=np.float64) * 1000.0).astype(np.int64)
    dev_end = dev_start + np.rint(np.asarray(dd, dtype=np.float64) * 1000.0).astype(np.int64)
    host_kind = np.asarray(hk, dtype=np.int8)
    host_tid = np.asarray(ht, dtype=np.int64)
    step_rows = host_kind == STEP
    if step_rows.any():
        values, counts = np.unique(host_tid[step_rows], return_counts=True)
        step_thread = int(values[counts.argmax()])
    else:  # no ProfilerStep: the busiest thread stands in for the training thread
        values, counts = np.unique(host_tid, return_counts=True)
        step_thread = int(values[counts.argmax()]) if values.size else -1
    return RankEvents(
        host_kind, host_start, host_end, host_tid, np.asarray(hstep, dtype=np.int64),
        np.asarray(hsub, dtype=np.int8), hcoll, np.asarray(dk, dtype=np.int8), dev_start, dev_end, np.asarray(dc, dtype=np.int64),
        np.asarray(dst, dtype=np.int64), dcoll, np.asarray(lc, dtype=np.int64), ns(lt),
        step_thread, float_ts, loader, {"events": n_events})
