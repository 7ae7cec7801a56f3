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

from .decode import TraceDoc

# host range kinds
STEP, DATA, COMM_HOST, OP = 0, 1, 2, 3
# device event kinds
COMPUTE, COMM, MEMORY = 0, 1, 2

_DEVICE_SKIP_CATS = {"gpu_user_annotation", "gpu_annotation"}
_COMM_HOST_PREFIX = ("gloo:", "nccl:", "c10d::", "mpi:", "ucc:")
_OP_CATS = {"cpu_op", "Operator", "user_annotation", "python_function"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "mtia_runtime", "hip_runtime",
                "xpu_runtime", "privateuse1_runtime"}


@dataclass
class RankEvents:
    """Columns of one trace file. Times are absolute integer ns (µs in the file x 1000)."""

    host_kind: np.ndarray       # STEP / DATA / COMM_HOST / OP
    host_start: np.ndarray
    host_end: np.ndarray
    host_tid: np.ndarray        # thread index (dense, per file)
    step_id: np.ndarray         # N of ProfilerStep#N for STEP rows, else -1
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
    counts: dict = field(default_factory=dict)


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


def sort_events(doc: TraceDoc) -> RankEvents:
    """One pass over the events: classify, convert µs floats to ns ints, keep numbers only."""
    hk, hs, hd, ht, hstep = [], [], [], [], []
    dk, ds, dd, dc, dst, dcoll = [], [], [], [], [], []
    lc, lt = [], []
    tids: dict = {}
    float_ts = False
    for e in doc.traceEvents:
        if e.ph != "X":
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
        if name.startswith("ProfilerStep#"):
            kind, sid = STEP, _int(name[13:])
        elif "DataLoader" in name and "__next__" in name:
            kind, sid = DATA, -1
        elif name.startswith(_COMM_HOST_PREFIX) or name == "record_param_comms":
            kind, sid = COMM_HOST, -1
        elif cat in _OP_CATS:
            kind, sid = OP, -1
        else:
            continue
        hk.append(kind)
        hs.append(ts)
        hd.append(dur)
        ht.append(tids.setdefault(e.tid, len(tids)))
        hstep.append(sid)
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
    host_tid = np.asarray(ht, dtype=np.int32)
    step_rows = host_kind == STEP
    step_thread = int(np.bincount(host_tid[step_rows]).argmax()) if step_rows.any() else -1
    return RankEvents(
        host_kind, host_start, host_end, host_tid, np.asarray(hstep, dtype=np.int64),
        np.asarray(dk, dtype=np.int8), dev_start, dev_end, np.asarray(dc, dtype=np.int64),
        np.asarray(dst, dtype=np.int64), dcoll, np.asarray(lc, dtype=np.int64), ns(lt),
        step_thread, float_ts, {"events": len(doc.traceEvents)})
