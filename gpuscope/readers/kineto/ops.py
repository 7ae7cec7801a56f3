"""One rank's events -> the op and kernel views (no pandas: numbers and names only).

1. Per analysed step (the host window of its ProfilerStep; the same steps rank_rows keeps):
   - "op": each top-level torch op (cpu_op / Operator ranges with no torch op around them on
     their thread: record_function ranges and Python functions do not count as "around"), its
     count, host time, and the device time of the kernels launched inside it (on its thread);
   - "range": each record_function range (user_annotation: the user's, a module's, an
     optimizer's), its count, host time and device time likewise (ranges nest: a kernel counts
     for every range around its launch);
   - "kernel": each device event (kernels, copies, sets) the step launched, its count and
     device time.
2. HTA's kernel breakdown (get_gpu_kernel_breakdown): per kernel name its count, sum, min and
   max duration and its type, over the events HTA keeps (kernel_breakdown).
3. Each communication kernel whose args carry its message (PyTorch >= 2.1 writes "In msg
   nelems", "Out msg nelems", "Group size", "dtype"): its kind (all_reduce, all_gather, ...),
   size in bytes, group, duration and its order among the rank's same collectives (to match
   them across ranks).
"""

from __future__ import annotations

import numpy as np

from . import spans
from .events import ANNOTATION_OP, COMM, CPU_OP, MEMORY, OP, RankEvents
from .hta import launched_before_last_step
from .kernels import kind_of
from .steps import step_windows

#: device event types, as HTA names them (COMPUTATION, COMMUNICATION, MEMORY)
TYPES = {0: "compute", COMM: "communication", MEMORY: "memory"}

#: bytes per element of the dtypes record_param_comms writes (c10::ScalarType names)
DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1, "UInt8": 1, "Int8": 1, "QInt8": 1, "QUInt8": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "ComplexHalf": 4,
    "Int": 4, "Float": 4, "UInt32": 4, "QInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8, "ComplexDouble": 16,
}


def _launches(ev: RankEvents) -> np.ndarray:
    """Index into the launches of each device event's launch, -1 where none is correlated."""
    out = np.full(ev.dev_corr.size, -1, np.int64)
    if not ev.launch_corr.size or not ev.dev_corr.size:
        return out
    order = np.argsort(ev.launch_corr, kind="stable")
    corr = ev.launch_corr[order]
    pos = np.clip(np.searchsorted(corr, ev.dev_corr), 0, corr.size - 1)
    found = (corr[pos] == ev.dev_corr) & (ev.dev_corr >= 0)
    out[found] = order[pos[found]]
    return out


def _top_level(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Mask of the ranges that no other range of the same thread contains (ranges on a thread
    nest: sorted by start, the longer first, a range is top-level when it starts at or after
    the end of every earlier one)."""
    out = np.zeros(start.size, bool)
    for t in np.unique(tid):
        idx = np.flatnonzero(tid == t)
        order = idx[np.lexsort((-end[idx], start[idx]))]
        e = end[order]
        reach = np.maximum.accumulate(e)
        out[order] = np.r_[True, start[order][1:] >= reach[:-1]]
    return out


def _device_time_in(ev: RankEvents, launch: np.ndarray, start, end, tid) -> np.ndarray:
    """Per host range [start, end) on thread tid: the device time of the events launched in it
    from that thread."""
    got = np.zeros(start.size, np.int64)
    has = launch >= 0
    if not has.any() or not start.size:
        return got
    k_ts = ev.launch_ts[launch[has]]
    k_tid = ev.launch_tid[launch[has]] if ev.launch_tid.size == ev.launch_ts.size else \
        np.zeros(k_ts.size, np.int64)
    k_dur = (ev.dev_end - ev.dev_start)[has]
    for t in np.unique(tid):
        mine = k_tid == t
        if not mine.any():
            continue
        order = np.argsort(k_ts[mine], kind="stable")
        ts = k_ts[mine][order]
        csum = np.r_[0, np.cumsum(k_dur[mine][order])]
        rows = np.flatnonzero(tid == t)
        a = np.searchsorted(ts, start[rows], "left")
        b = np.searchsorted(ts, end[rows], "left")
        got[rows] = csum[b] - csum[a]
    return got


def _by_step_name(step, name, *values) -> tuple:
    """(step, name id, count, sums of each of `values`) per distinct (step, name)."""
    if not step.size:
        z = np.zeros(0, np.int64)
        return (z, z, z) + tuple(z for _ in values)
    n = int(name.max()) + 1
    key = step.astype(np.int64) * n + name
    uniq, inv, count = np.unique(key, return_inverse=True, return_counts=True)
    sums = tuple(np.bincount(inv, weights=v, minlength=uniq.size).round().astype(np.int64)
                 for v in values)
    return (uniq // n, uniq % n, count) + sums


def op_views(ev: RankEvents, drop: frozenset = frozenset()) -> dict:
    """{"ops": columns step, kind, name, count, ns, gpu_ns (kind "op" / "range" / "kernel"),
    "messages": columns step, group, collective, bytes, group_size, dtype, dur_ns, seq}.
    Names are strings. Empty columns where the trace has no names (events made by hand)."""
    names = ev.names
    out = {"ops": _empty_ops(), "messages": _empty_messages()}
    if not names or ev.host_name.size != ev.host_kind.size:
        return out
    windows, _ = step_windows(ev)
    windows = sorted(windows, key=lambda w: w[1])
    lo = np.array([w[1] for w in windows], np.int64)
    hi = np.array([w[2] for w in windows], np.int64)
    sid = np.array([w[0] for w in windows], np.int64)
    kept = np.array([w[0] not in drop for w in windows], bool)

    def step_of(t: np.ndarray) -> np.ndarray:
        """The step whose host window holds each time, -1 outside the analysed ones."""
        at = np.searchsorted(lo, t, "right") - 1
        ok = at >= 0
        ok[ok] &= (t[ok] < hi[at[ok]]) & kept[at[ok]]
        return np.where(ok, sid[at.clip(min=0)], -1)

    launch = _launches(ev)
    cols: dict = {k: [] for k in ("step", "kind", "name", "count", "ns", "gpu_ns")}

    def add(kind: str, step, name, count, ns, gpu):
        cols["step"].append(step)
        cols["kind"] += [kind] * step.size
        cols["name"] += [names[i] for i in name.tolist()]
        cols["count"].append(count)
        cols["ns"].append(ns)
        cols["gpu_ns"].append(gpu)

    is_op = ev.host_kind == OP
    for kind, sel in (("op", is_op & (ev.host_op == CPU_OP)),
                      ("range", is_op & (ev.host_op == ANNOTATION_OP))):
        idx = np.flatnonzero(sel)
        s, e, t = ev.host_start[idx], ev.host_end[idx], ev.host_tid[idx]
        if kind == "op" and idx.size:
            top = _top_level(s, e, t)
            idx, s, e, t = idx[top], s[top], e[top], t[top]
        step = step_of(s)
        ok = step >= 0
        gpu = _device_time_in(ev, launch, s[ok], e[ok], t[ok])
        add(kind, *_by_step_name(step[ok], ev.host_name[idx][ok], (e - s)[ok], gpu))
    if ev.dev_kind.size:
        launched = ev.dev_start.copy()
        found = launch >= 0
        launched[found] = ev.launch_ts[launch[found]]
        step = step_of(launched)
        ok = step >= 0
        dur = (ev.dev_end - ev.dev_start)[ok]
        st, nm, cnt, ns = _by_step_name(step[ok], ev.dev_name[ok], dur)
        add("kernel", st, nm, cnt, ns, ns)
        out["messages"] = _messages(ev, step)
    out["ops"] = {k: np.array(v, dtype=object) if k in ("kind", "name") else
                  np.concatenate(v).astype(np.int64) for k, v in cols.items()}
    return out


def kernel_breakdown(files: list[tuple[RankEvents, bool]]) -> dict:
    """HTA's get_gpu_kernel_breakdown of one rank, per kernel name: count, sum, min and max
    duration (ns) and type, over the device events HTA keeps: with two or more ProfilerSteps in
    a file (its bool), those launched before its last step starts (hta.py); durations of a
    trace with float timestamps rounded inward to whole µs as HTA does. Several files of one
    rank add up."""
    parts = []
    for ev, drop_last in files:
        if not ev.names or ev.dev_name.size != ev.dev_kind.size or not ev.dev_kind.size:
            continue
        keep = launched_before_last_step(ev) if drop_last else np.ones(ev.dev_kind.size, bool)
        start, end = ev.dev_start[keep], ev.dev_end[keep]
        if ev.float_ts:
            start, end = _hta_rounded(start, end)
        parts.append(_kernel_stats(ev.dev_name[keep], ev.names, _hta_kinds(ev)[keep],
                                   np.maximum(end - start, 0)))
    if not parts:
        return _empty_kernels()
    if len(parts) == 1:
        return parts[0]
    names = np.concatenate([p["name"] for p in parts])
    kinds = np.concatenate([[_KIND_OF[t] for t in p["type"]] for p in parts]).astype(np.int8)
    # each part's per-name rows stand for their events: merged by name again
    uniq, inv = np.unique(names.astype(str), return_inverse=True)
    out = {"name": uniq.astype(object), "type": np.empty(uniq.size, object)}
    out["type"][inv] = [TYPES[int(k)] for k in kinds]
    for col, how in (("count", np.add), ("sum_ns", np.add), ("min_ns", np.minimum),
                     ("max_ns", np.maximum)):
        v = np.full(uniq.size, np.iinfo(np.int64).max if how is np.minimum else 0, np.int64)
        how.at(v, inv, np.concatenate([p[col] for p in parts]))
        out[col] = v
    return out


_KIND_OF = {v: k for k, v in TYPES.items()}


def _hta_kinds(ev: RankEvents) -> np.ndarray:
    """The device events' kinds as HTA's kernel breakdown types them: gpuscope's (kernels.py
    knows more communication families than HTA's `^nccl.*Kernel`), and a DMA transfer (MTIA's
    "dma_request") is memory, as HTA's `^dma` says."""
    kinds = ev.dev_kind.copy()
    if ev.names and ev.dev_name.size == kinds.size:
        dma = np.array([n.startswith("dma") for n in ev.names], bool)
        kinds[dma[ev.dev_name]] = MEMORY
    return kinds


def _hta_rounded(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float-timestamp trace's events as HTA 0.5 reads them: ts and dur as float64 µs, end =
    ts + dur in float64 (at unix-epoch µs, a grid of 0.25 µs), then ts rounded up and end down
    to whole µs (its round_down_time_stamps); in ns."""
    ts = (start // 1000).astype(np.float64) + (start % 1000) / 1000.0
    dur = (end - start) / 1000.0
    fin = ts + dur
    lo = np.ceil(ts).astype(np.int64) * 1000
    hi = np.floor(fin).astype(np.int64) * 1000
    return lo, hi


def _kernel_stats(ids: np.ndarray, names: list, kinds: np.ndarray, dur: np.ndarray) -> dict:
    """Per distinct name (events by their name's id in `names`, interned one id a name): type,
    count, sum, min, max of `dur`, in the names' order. Grouped by id: the names as a numpy
    string array took each event the longest name's width (a 150 MB trace's kernels: 0.6 GB)."""
    if not ids.size:
        return _empty_kernels()
    uid, inv, count = np.unique(ids, return_inverse=True, return_counts=True)
    total = np.zeros(uid.size, np.int64)
    np.add.at(total, inv, dur)
    lo = np.full(uid.size, np.iinfo(np.int64).max, np.int64)
    hi = np.zeros(uid.size, np.int64)
    np.minimum.at(lo, inv, dur)
    np.maximum.at(hi, inv, dur)
    kind = np.zeros(uid.size, np.int8)
    kind[inv] = kinds
    named = [str(names[int(i)]) for i in uid]
    order = sorted(range(uid.size), key=named.__getitem__)
    return {"name": np.array([named[i] for i in order], dtype=object),
            "type": np.array([TYPES.get(int(kind[i]), "compute") for i in order], dtype=object),
            "count": count[order].astype(np.int64), "sum_ns": total[order], "min_ns": lo[order],
            "max_ns": hi[order]}


def _number(v) -> int | None:
    """An element count or group size as written (an int, a float, or a string of digits)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return int(v) if v >= 0 and v == v and v < 2**62 else None
    try:
        return _number(int(str(v).strip()))
    except ValueError:
        return None


def message_bytes(in_n, out_n, dtype) -> int | None:
    """A collective's size as NCCL's tests count it: the larger of its input and output
    (all-gather's output, reduce-scatter's input: the whole buffer) times the element size;
    None when the counts or the dtype are unknown."""
    counts = [c for c in (_number(in_n), _number(out_n)) if c is not None]
    size = DTYPE_BYTES.get(str(dtype)) if dtype is not None else None
    if not counts or size is None:
        return None
    return max(counts) * size


def _messages(ev: RankEvents, step: np.ndarray) -> dict:
    rows = [i for i, m in enumerate(ev.dev_msg) if m is not None] if ev.dev_msg else []
    if not rows:
        return _empty_messages()
    rows.sort(key=lambda i: int(ev.dev_start[i]))
    seen: dict = {}
    cols: dict = {k: [] for k in ("step", "group", "collective", "bytes", "group_size", "dtype",
                                  "dur_ns", "seq")}
    for i in rows:
        in_n, out_n, gsize, dtype = ev.dev_msg[i]
        group, coll = ev.dev_coll[i] if ev.dev_coll[i] is not None else ("", "")
        coll = kind_of(str(coll) or ev.names[ev.dev_name[i]])
        size = message_bytes(in_n, out_n, dtype)
        key = (group, coll, size)
        seq = seen[key] = seen.get(key, -1) + 1
        for k, v in (("step", int(step[i])), ("group", str(group)), ("collective", str(coll)),
                     ("bytes", -1 if size is None else size),
                     ("group_size", _number(gsize) if _number(gsize) is not None else -1),
                     ("dtype", str(dtype) if dtype is not None else ""),
                     ("dur_ns", int(ev.dev_end[i] - ev.dev_start[i])), ("seq", seq)):
            cols[k].append(v)
    return {k: np.array(v, dtype=object if k in ("group", "collective", "dtype") else np.int64)
            for k, v in cols.items()}


def _empty_ops() -> dict:
    z = np.zeros(0, np.int64)
    return {"step": z, "kind": np.zeros(0, object), "name": np.zeros(0, object), "count": z,
            "ns": z, "gpu_ns": z}


def _empty_kernels() -> dict:
    z = np.zeros(0, np.int64)
    return {"name": np.zeros(0, object), "type": np.zeros(0, object), "count": z, "sum_ns": z,
            "min_ns": z, "max_ns": z}


def _empty_messages() -> dict:
    z = np.zeros(0, np.int64)
    o = np.zeros(0, object)
    return {"step": z, "group": o, "collective": o, "bytes": z, "group_size": z, "dtype": o,
            "dur_ns": z, "seq": z}


#: HTA's kernel types in the order it numbers them (their overlaps are named in this order)
HTA_TYPES = ((0, "COMPUTATION"), (COMM, "COMMUNICATION"), (MEMORY, "MEMORY"))


def kernel_type_time(files: list[tuple[RankEvents, bool]]) -> dict[str, int]:
    """HTA's kernel-type time of one rank (ns): for each set of types running at once
    ("COMPUTATION", "COMPUTATION overlapping COMMUNICATION", ...), how long the union of each
    type's kernels covers exactly that set; over the events kernel_breakdown keeps."""
    out: dict[str, int] = {}
    for ev, drop_last in files:
        if not ev.dev_kind.size:
            continue
        keep = launched_before_last_step(ev) if drop_last else np.ones(ev.dev_kind.size, bool)
        start, end, kind = ev.dev_start[keep], ev.dev_end[keep], _hta_kinds(ev)[keep]
        if ev.float_ts:
            start, end = _hta_rounded(start, end)
        times, steps = [], []
        for bit, (k, _) in enumerate(HTA_TYPES):
            s, e = spans.merge(start[kind == k], end[kind == k])
            times += [s, e]
            steps += [np.full(s.size, 1 << bit), np.full(e.size, -(1 << bit))]
        t = np.concatenate(times)
        if not t.size:
            continue
        order = np.argsort(t, kind="stable")
        t, running = t[order], np.cumsum(np.concatenate(steps)[order])
        seg = np.diff(t)
        for mask in np.unique(running[:-1]):
            if mask <= 0:
                continue
            label = " overlapping ".join(n for bit, (_, n) in enumerate(HTA_TYPES)
                                         if mask & (1 << bit))
            out[label] = out.get(label, 0) + int(seg[running[:-1] == mask].sum())
    return out
