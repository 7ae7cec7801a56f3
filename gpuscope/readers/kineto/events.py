"""Sorts the decoded events of one trace into typed columns (integer ns) by what they mean.

Host ranges: ProfilerStep#N, DataLoader waits, CPU collectives (gloo:*, nccl:*, c10d::*), host ops.
Device events (anything with a stream, as HTA counts them): compute kernels, communication kernels
(ncclKernel* / ncclDevKernel*), memcpy / memset. Launches (runtime events with a correlation id)
tie device events to the host time that launched them. Names are classified during the one pass
and then dropped, so nothing per-event outlives the function but numbers.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from .decode import MEMORY_EVENT, Event, Instant
from .kernels import family_of, kind_of, looks_like_comm

#: timestamps (µs) accepted: up to year 2096 in unix µs, so ns fit int64; durations up to ~11 days
MAX_TS_US = 4e15
MAX_DUR_US = 1e12
class HostKind(IntEnum):
    """What a host range is (`host_kind`)."""
    STEP = 0
    DATA = 1
    COMM_HOST = 2  # the collective itself, on a CPU backend (gloo:, nccl:, ...)
    OP = 3


class Sub(IntEnum):
    """What an OP range is part of (`host_sub`)."""
    NONE = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    MICROBATCH = 4  # a pipeline schedule's forward of one micro-batch ("Forward 3"): forward too


class Waits(IntEnum):
    """What an OP range may hold of waiting (`host_wait`)."""
    NO_WAIT = 0
    WAITS = 1       # only waits on collectives
    ANNOTATION = 2  # a record_function range
    #: a collective call of the c10d API (c10d::allreduce_, c10d::_reduce_scatter_base_, ...):
    #: all of it is the collective's, the ops it runs too (gloo's reduce-scatter copies its
    #: input first), as the recorder times a call from its start to its end
    CALL = 3
    #: FSDP's ranges (FSDP::*, FullyShardedDataParallel.*): they wait on collectives and also
    #: work (copy in and out, Python); a stretch with no op running is waiting while a
    #: collective is pending, not after (the same RESUME_NS rule as for a thread idle after a
    #: collective)
    WRAPS = 4
    #: a functional collective's launch (_c10d_functional::all_gather_into_tensor, ...): host
    #: work, the c10d call inside it too, as the recorder counts a functional collective's
    #: launch call; its wait_tensor is the waiting
    LAUNCH = 5
    #: DDP's reducer writing a synchronized bucket back into the gradients once its all-reduce
    #: is done (copy_bucket_to_grad, the ops it runs too): work that only a synchronizing step
    #: does, so part of the synchronization, as the recorder's DDP tail (which ends when
    #: backward returns, after it) counts it. A busy core can stretch it to tens of ms
    FINISH = 6


class DeviceKind(IntEnum):
    """What a device event is (`dev_kind`)."""
    COMPUTE = 0
    COMM = 1
    MEMORY = 2


class OpKind(IntEnum):
    """What kind of op an OP range is (`host_op`): a torch op (cpu_op / Operator), a
    record_function range (user_annotation: the user's, a module's, "## forward ##"), a Python
    function (with_stack); 0: not an op."""
    CPU_OP = 1
    ANNOTATION_OP = 2
    PYTHON_OP = 3


# the kinds by name, as the modules that read the columns compare them (HTA's types.py keeps
# its kinds as IntEnums too): a member is an int, so a column compares to it as to its value
STEP, DATA, COMM_HOST, OP = HostKind
NONE, FORWARD, BACKWARD, OPTIMIZER, MICROBATCH = Sub
NO_WAIT, WAITS, ANNOTATION, CALL, WRAPS, LAUNCH, FINISH = Waits
COMPUTE, COMM, MEMORY = DeviceKind
CPU_OP, ANNOTATION_OP, PYTHON_OP = OpKind
WRAP_RANGE_PREFIXES = ("FSDP::", "FullyShardedDataParallel.")
FUNCOL_PREFIXES = ("_c10d_functional::", "c10d_functional::", "_c10d_functional_autograd::")
FINISH_PREFIXES = ("torch.distributed.ddp.reducer::copy_bucket_to_grad",)

_DEVICE_SKIP_CATS = {"gpu_user_annotation", "gpu_annotation"}
_COMM_HOST_PREFIX = ("gloo:", "nccl:", "mpi:", "ucc:")  # the collective itself (CPU backends)
# c10d::allreduce_ / record_param_comms only launch a collective: host work, not communication
_OP_CATS = {"cpu_op", "Operator", "user_annotation", "python_function"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "mtia_runtime", "hip_runtime",
                "xpu_runtime", "privateuse1_runtime"}
#: ranges on the training thread that wait on collectives (FSDP2, FSDP1, c10d's launch ops, the
#: functional collectives of DTensor / TP / SP / CP and their wait_tensor)
WAIT_RANGE_PREFIXES = ("FSDP::", "FullyShardedDataParallel.", "c10d::", "record_param_comms",
                       "_c10d_functional::", "c10d_functional::", "_c10d_functional_autograd::")


@dataclass
class RankEvents:
    """Columns of one trace file. Times are absolute integer ns (µs in the file x 1000)."""

    host_kind: np.ndarray       # STEP / DATA / COMM_HOST / OP
    host_start: np.ndarray
    host_end: np.ndarray
    host_tid: np.ndarray        # thread id as in the trace (names get negative ids)
    step_id: np.ndarray         # N of ProfilerStep#N for STEP rows, else -1
    host_sub: np.ndarray        # FORWARD / BACKWARD / OPTIMIZER for OP rows, else NONE
    host_wait: np.ndarray       # OP rows: WAITS that only wait on collectives (FSDP::*, c10d::*,
    #                             ...), ANNOTATION record_function ranges, else NO_WAIT
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
    #: kernels counted as communication for their name alone (no family in kernels.py claims
    #: them): the reader names them in a warning
    odd_comm: tuple = ()
    #: the allocator's "[memory]" instants (profile_memory=True): time (ns), total allocated and
    #: reserved bytes after the event, device type (0 CPU, 1 CUDA, ...)
    mem_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mem_alloc: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mem_reserved: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mem_dev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    #: one-off host work: runtime / driver calls of STALL_NS or more that are not waits on the
    #: device (a library's first load inside its first launch, cudaFree / cudaMalloc, context
    #: and stream creation): startup, never per-step launch overhead
    stall_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stall_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: runtime calls that wait on the device or copy (_is_wait_call: syncs, copies, memsets;
    #: a copy to pageable host memory returns only once it is done), and which of them are
    #: syncs (_is_sync_call: what .item(), .cpu() and torch.cuda.synchronize() end in)
    sync_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sync_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sync_point: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    sync_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # their thread
    sync_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # into names
    #: runtime calls of any kind (kernel launches, copies, ...): a trace with launches but no
    #: device event did not record the GPU's activity
    n_runtime: int = 0
    #: the events' names: host_name / dev_name index this list (the op and kernel views, ops.py)
    names: list = field(default_factory=list)
    host_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    dev_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    host_op: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # CPU_OP, ...
    launch_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: per device event: (in elements, out elements, group size, dtype) of a communication
    #: kernel whose args say (any of them may be None), else None
    dev_msg: list = field(default_factory=list)

    @classmethod
    def concat(cls, parts: list["RankEvents"]) -> "RankEvents":
        """One rank's events from several files (repeated profiler cycles)."""
        if len(parts) == 1:
            return parts[0]
        arrays = {}
        for name in ("host_kind", "host_start", "host_end", "host_tid", "step_id", "host_sub",
                     "host_wait",
                     "dev_kind", "dev_start", "dev_end", "dev_corr", "dev_stream", "launch_corr",
                     "launch_ts", "mem_ts", "mem_alloc", "mem_reserved", "mem_dev",
                     "stall_start", "stall_end", "sync_start", "sync_end", "sync_point",
                     "sync_tid", "host_op", "launch_tid"):
            arrays[name] = np.concatenate([getattr(p, name) for p in parts])
        names: dict = {}  # each part's name ids mapped onto one list
        for col in ("host_name", "dev_name", "sync_name"):
            arrays[col] = np.concatenate([
                np.array([names.setdefault(x, len(names)) for x in p.names], np.int32)[
                    getattr(p, col)] if p.names else getattr(p, col) for p in parts])
        return cls(**arrays, host_coll=[x for p in parts for x in p.host_coll],
                   dev_coll=[x for p in parts for x in p.dev_coll], names=list(names),
                   dev_msg=[x for p in parts for x in p.dev_msg],
                   step_thread=_step_thread(parts), float_ts=any(p.float_ts for p in parts),
                   loader=next((p.loader for p in parts if p.loader), ""),
                   odd_comm=tuple(dict.fromkeys(n for p in parts for n in p.odd_comm)),
                   n_runtime=sum(p.n_runtime for p in parts),
                   counts={k: sum(p.counts.get(k, 0) for p in parts)
                           for k in ("events", "bad_time", "bad_id", "bad_json")})


def _step_thread(parts: list) -> int:
    """The training thread of joined parts (pieces of one file, profiler cycles): the one of
    the part with the most ProfilerSteps (a piece without any guessed the busiest thread)."""
    steps = [int((p.host_kind == STEP).sum()) for p in parts]
    return parts[steps.index(max(steps))].step_thread


def device_kind(name: str, cat: str) -> int:
    """COMM for a kernel of a known communication family (kernels.py) or one that looks like
    communication (reported by the reader), MEMORY for copies and sets, else COMPUTE."""
    if family_of(name) is not None or looks_like_comm(name):
        return COMM
    if cat in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset") or "Memcpy" in name or \
            "Memset" in name:
        return MEMORY
    return COMPUTE


def collective_key(name: str, group, coll) -> tuple:
    """(process group, collective) of a communication kernel: the kernel's "Collective name"
    arg where it has one, else the kind its name says (ncclKernel_AllReduce_RING_LL_Sum_float,
    ncclDevKernel_SendRecv, multimem_all_reduce_kernel: kernels.kind_of)."""
    group = group if group is not None else ""
    if coll is None:
        coll = kind_of(name)
    return (str(group), str(coll).lower())


def _coll_name(key) -> str:
    return str(key[1]).rsplit(":", 1)[-1].lower().lstrip("_")


def is_p2p(key, sendrecv_kernels: bool = True) -> bool:
    """A collective key (group, name) of point-to-point communication: gloo:send / gloo:recv
    and nccl:send / nccl:recv ranges, record_param_comms' send / recv, and NCCL SendRecv
    kernels when `sendrecv_kernels` (NCCL runs all_to_all on the same kernels)."""
    if key is None:
        return False
    name = _coll_name(key)
    if name in ("sendrecv", "send_recv"):  # a SendRecv kernel
        return sendrecv_kernels
    return name.startswith(("send", "recv", "isend", "irecv", "batch_isend"))


def p2p_masks(ev: "RankEvents") -> tuple[np.ndarray, np.ndarray]:
    """(host, device) masks of point-to-point communication. SendRecv kernels count only when
    the host shows point-to-point calls and no all_to_all (which NCCL runs on them too)."""
    names = {_coll_name(k) for k in set(ev.host_coll) if k is not None}
    host_p2p = any(is_p2p(("", n), False) for n in names)
    kernels = host_p2p and not any("all_to_all" in n or "alltoall" in n for n in names)
    return p2p_mask(ev.host_coll), p2p_mask(ev.dev_coll, kernels)


def p2p_mask(keys: list, sendrecv_kernels: bool = True) -> np.ndarray:
    """is_p2p per key (keys repeat: each distinct one is judged once)."""
    memo: dict = {None: False}
    for k in set(keys):
        if k is not None:
            memo[k] = is_p2p(k, sendrecv_kernels)
    if not any(memo.values()):  # the usual case: no point-to-point key at all
        return np.zeros(len(keys), dtype=bool)
    return np.fromiter(map(memo.__getitem__, keys), dtype=bool, count=len(keys))


def op_part(name: str) -> int:
    if name.startswith("autograd::engine::evaluate_function") or name == "## backward ##":
        return BACKWARD
    if name.startswith("Optimizer.step#") or name == "## optimizer ##":
        return OPTIMIZER
    if name.endswith(".forward") or name == "## forward ##":
        return FORWARD
    if name.startswith("Forward ") and name[8:].isdigit():  # torch.distributed.pipelining
        return MICROBATCH
    return NONE


#: a runtime / driver call this long (ns) is one-off host work, not a launch's overhead (kernel
#: launches take microseconds; a library's first load inside its first launch, cudaFree,
#: cudaMalloc, context and stream creation take tens to thousands of ms); calls that wait for
#: the device queue (syncs, copies: _is_wait_call) are not
STALL_NS = 10_000_000


#: at most this many one-off calls are widened to the host work around them (widen_stalls):
#: one-off work is rare, and each costs a pass over the ops
WIDEN_MAX = 64


def widen_stalls(stalls: tuple, ops: tuple, calls: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each one-off runtime call (stalls: start, end, thread), widened to the
    host work of the op that made it on either side up to the nearest other runtime call
    (ops, calls: start, end, thread). A library's first use does part of its loading on the
    host between runtime calls (cuBLAS's first matmul: 0.8 s of a 9.1 s trace in no call of
    10 ms); an op's own host work before or after a launch takes microseconds. The innermost
    op of the thread (an aten op, not a Python function or annotation) that holds the call
    bounds it; a call in no op stays as it is."""
    s, e, tid = (np.array(a, dtype=np.int64) for a in stalls)
    op_s, op_e, op_tid = ops
    c_s, c_e, c_tid = calls
    for i in range(min(s.size, WIDEN_MAX)):
        holds = np.flatnonzero((op_tid == tid[i]) & (op_s <= s[i]) & (op_e >= e[i]))
        if not holds.size:
            continue
        inner = holds[np.argmax(op_s[holds])]
        lo, hi = int(op_s[inner]), int(op_e[inner])
        mine = c_tid == tid[i]
        before = c_e[mine & (c_e <= s[i]) & (c_e >= lo) & (c_s != s[i])]
        after = c_s[mine & (c_s >= e[i]) & (c_s <= hi) & (c_e != e[i])]
        s[i] = before.max() if before.size else lo
        e[i] = after.min() if after.size else hi
    return s, e


def _is_wait_call(name: str) -> bool:
    """A runtime call that waits for the device queue (a sync, an event, a copy or memset that
    waits its turn behind queued work): per-step work, never a one-off stall."""
    return any(w in name for w in ("Synchronize", "Wait", "Query", "Memcpy", "memcpy", "Memset",
                                   "memset", "MemCpy"))


#: copies that block the host until they are done (no "Async"): the device-to-host copy of a
#: .item() or .cpu() where the runtime does not split it into an async copy and a sync
_BLOCKING_COPIES = frozenset({"cudaMemcpy", "cudaMemcpy2D", "hipMemcpy", "hipMemcpy2D",
                              "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpy"})


def _is_sync_call(name: str) -> bool:
    """A runtime call that blocks the host until the device has done its queued work: a
    stream, device or event synchronize (.item() and .cpu() of a GPU tensor end in one, as
    torch.cuda.synchronize() is one), or a blocking copy."""
    return "Synchronize" in name or name in _BLOCKING_COPIES


# one code per distinct (name, category, has-stream): what an event is, decided once per name
_SKIP, _DEVICE, _LAUNCH, _HOST = 0, 1, 2, 3


@functools.lru_cache(maxsize=1 << 16)  # names repeat across files, ranks and traces
def _classify(name: str, cat: str, on_stream: bool) -> tuple:
    """(what, kind, sub, step id, collective key, waits on collectives, op kind) for one
    distinct event name."""
    if cat in _DEVICE_SKIP_CATS:  # GPU-side marks (ProfilerStep#N, nccl:all_reduce on the
        return (_SKIP, 0, 0, -1, None, False, 0)  # GPU timeline), with or without a stream
    if on_stream:
        kind = device_kind(name, cat)
        return (_DEVICE, kind, 0, -1, None, False, 0)
    if cat in _LAUNCH_CATS:
        return (_LAUNCH, 0, 0, -1, None, False, 0)
    if name.startswith("ProfilerStep#"):
        digits = name[13:]
        ok = digits.isascii() and digits.isdigit() and len(digits) <= 12
        return (_HOST, STEP, NONE, int(digits) if ok else -1, None, False, 0)
    if "DataLoader" in name and "__next__" in name:
        return (_HOST, DATA, NONE, -1, None, False, 0)
    if name.startswith(_COMM_HOST_PREFIX):
        return (_HOST, COMM_HOST, NONE, -1, ("", name), False, 0)
    if cat in _OP_CATS:
        wait = (CALL if name.startswith("c10d::") else FINISH if name.startswith(
            FINISH_PREFIXES) else WRAPS if name.startswith(WRAP_RANGE_PREFIXES)
                else _funcol_kind(name) if name.startswith(FUNCOL_PREFIXES)
                else WAITS if name.startswith(WAIT_RANGE_PREFIXES)
                else ANNOTATION if cat == "user_annotation" else NO_WAIT)
        op = (ANNOTATION_OP if cat == "user_annotation" else PYTHON_OP
              if cat == "python_function" else CPU_OP)
        return (_HOST, OP, op_part(name), -1, None, wait, op)
    return (_SKIP, 0, 0, -1, None, False, 0)


def _funcol_kind(name: str) -> int:
    """A functional-collective op: its wait_tensor waits; a helper that neither issues nor waits
    on a collective (_wrap_tensor_autograd wraps a result for autograd) is host work; the rest
    launch one."""
    op = name.split("::", 1)[1]
    return WAITS if op.startswith("wait_tensor") else NO_WAIT if op.startswith("_") else LAUNCH


def _next_id(value, ids: dict) -> int:
    return len(ids)


def _thread_id(tid, ids: dict) -> int:
    """Thread ids stay as written; a named one ("stream 7") or one past int64 gets a stable
    negative number."""
    if type(tid) is int and -(1 << 62) < tid < (1 << 62):
        return tid
    return -1 - (zlib.crc32(str(tid).encode("utf-8", "replace")) & 0x3FFFFFFF)


def _id64(v: int) -> int:
    return v if -(1 << 63) <= v < (1 << 63) else -1


def _intern(values: list, ids: dict, new_id=_next_id) -> np.ndarray:
    """Ids of `values` in `ids` (a new value gets new_id(value, ids)): the distinct values found
    and looked up in C (dict.fromkeys, map), one Python step per distinct value. No pandas: the
    parse runs in processes started before pandas is imported (prefetch.py)."""
    local = {x: ids[x] if x in ids else ids.setdefault(x, new_id(x, ids))
             for x in dict.fromkeys(values)}
    return np.fromiter(map(local.__getitem__, values), np.int64, len(values))


def _memory_columns(mem: list, base: int) -> dict:
    """The "[memory]" instants as RankEvents columns (ns on the events' own base); instants with
    a time or a total out of range are left out."""
    if not mem:
        return {}
    a = np.array(mem, dtype=np.float64)
    ok = ((a[:, 0] >= 0) & (a[:, 0] < MAX_TS_US) & (a[:, 1] >= 0) & (a[:, 1] < 2.0**62)
          & (a[:, 2] >= -1) & (a[:, 2] < 2.0**62))
    a = a[ok]
    if base == 0 and len(a):
        base = math.floor(a[:, 0].min())
    return {"mem_ts": np.rint((a[:, 0] - base) * 1000.0).astype(np.int64) + base * 1000,
            "mem_alloc": a[:, 1].astype(np.int64), "mem_reserved": a[:, 2].astype(np.int64),
            "mem_dev": a[:, 3].astype(np.int8)}


class _Collector:
    """Step 1 of sort_events: each batch's complete events as number columns (names, categories
    and threads interned as ids), the batch's objects dropped as it goes."""

    def __init__(self):
        self.name_ids: dict = {}
        self.cat_ids: dict = {}
        self.tid_ids: dict = {}
        self.parts: list = []
        self.coll_args: dict = {}  # row -> (process group, collective, sizes) where args say
        self.n_events = self.n = 0
        self.bad_time = self.bad_id = self.bad_json = 0
        self.mem: list = []  # (ts µs, allocated, reserved, device type) of "[memory]" instants

    def add(self, batch) -> None:
        self.n_events += len(batch)
        self.bad_json += getattr(batch, "damaged", 0)
        keep = [e for e in batch if type(e) is Event and e.ts is not None]
        if len(keep) < len(batch):  # other phases: the allocator's instants among them?
            self.mem += [(e.ts, e.args.allocated, e.args.reserved, e.args.device_type)
                         for e in batch if type(e) is Instant and e.name == MEMORY_EVENT
                         and e.ts is not None and e.args is not None]
        del batch
        if not keep:
            return
        ts = np.array([e.ts for e in keep], dtype=np.float64)
        dur = np.array([e.dur for e in keep], dtype=np.float64)
        ok = (ts >= 0) & (ts < MAX_TS_US) & (dur >= 0) & (dur < MAX_DUR_US)  # NaN fails too
        if not ok.all():  # out of range: dropped (counted, reported by the reader)
            self.bad_time += int((~ok).sum())
            keep = [e for e, k in zip(keep, ok.tolist()) if k]
            ts, dur = ts[ok], dur[ok]
            if not keep:
                return
        nid = _intern([e.name for e in keep], self.name_ids)
        cid = _intern([e.cat for e in keep], self.cat_ids)
        stream, corr = self._args([e.args for e in keep])
        tids = [e.tid for e in keep]
        m = len(keep)
        del keep
        plain = set(map(type, tids)) == {int} and -(1 << 62) < min(tids) and max(tids) < 1 << 62
        tid_arr = np.array(tids, dtype=np.int64) if plain else _intern(tids, self.tid_ids,
                                                                       _thread_id)
        self.parts.append((nid, cid, stream, corr, ts, dur, tid_arr))
        self.n += m

    def _args(self, args: list) -> tuple:
        """The events' stream and correlation columns (-1: none), and the collectives' process
        group, name and sizes kept by row."""
        m = len(args)
        every = None not in args  # the usual case: each event has its args (no mask, no copy)
        has = slice(None) if every else np.array([a is not None for a in args], dtype=bool)
        present = args if every else [a for a in args if a is not None]
        stream = np.full(m, -1, dtype=np.int64)
        corr = np.full(m, -1, dtype=np.int64)
        if not present:
            return stream, corr
        try:
            stream[has] = [a.stream for a in present]
            corr[has] = [a.correlation for a in present]
        except OverflowError:  # an id past int64: unknown
            self.bad_id += 1
            stream[has] = [_id64(a.stream) for a in present]
            corr[has] = [_id64(a.correlation) for a in present]
        named = [i for i, a in enumerate(present)
                 if a.collective is not None or a.pg_name is not None or a.in_nelems is not None]
        for i in (named if every else np.flatnonzero(has)[named].tolist()):
            a = args[i]
            self.coll_args[self.n + i] = (a.pg_name, a.collective,
                                          (a.in_nelems, a.out_nelems, a.group_size, a.dtype))
        return stream, corr

    def columns(self) -> tuple:
        """(name id, category id, stream, correlation, ts µs, dur µs, thread) of all batches."""
        if not self.parts:
            z = np.zeros(0, np.int64)
            return z, z, z, z, np.zeros(0, np.float64), np.zeros(0, np.float64), z
        out = tuple(np.concatenate(c) for c in zip(*self.parts))
        self.parts = []
        return out


def sort_events(batches) -> RankEvents:
    """Turn batches of decoded events into integer-ns columns, keeping numbers only.

    1. per batch: keep complete events with a timestamp, intern names and categories as ids,
       and keep ts, dur, stream, correlation, thread; then the batch's objects are dropped
       (_Collector);
    2. classify each distinct (name, category, on a stream) once and map it back by id;
    3. convert µs floats to absolute ns integers (a whole-µs base is subtracted first, so the
       sub-µs digits of float timestamps survive).
    """
    c = _Collector()
    for batch in batches:
        c.add(batch)
        del batch  # not held while the next one is decoded
    nid, cid, streams, corr, ts, dur, tids = c.columns()
    names = list(c.name_ids)
    ncat = len(c.cat_ids) + 1
    key = (nid * ncat + cid) * 2 + (streams >= 0)
    uniq_key, inv = np.unique(key, return_inverse=True)
    cats = list(c.cat_ids)
    table = [_classify(names[k // 2 // ncat], cats[k // 2 % ncat], bool(k % 2))
             for k in uniq_key.tolist()]
    col = lambda i, dt: np.array([t[i] for t in table], dtype=dt)[inv]  # noqa: E731
    what, kind = col(0, np.int8), col(1, np.int8)
    base = math.floor(ts.min()) if c.n else 0
    start = np.rint((ts - base) * 1000.0).astype(np.int64) + base * 1000
    end = start + np.rint(dur * 1000.0).astype(np.int64)
    table_names = [names[k // 2 // ncat] for k in uniq_key.tolist()]
    dev = np.flatnonzero(what == _DEVICE)
    host = np.flatnonzero(what == _HOST)
    launch = np.flatnonzero((what == _LAUNCH) & (corr >= 0))
    runtime = np.flatnonzero(what == _LAUNCH)
    # what waits on the device (syncs, copies), decided once per distinct name: never a
    # one-off stall however long, and the host's time blocked per step
    waits_of_key = np.array([t[0] == _LAUNCH and _is_wait_call(n)
                             for t, n in zip(table, table_names)], dtype=bool)
    long_ = runtime[(end[runtime] - start[runtime] >= STALL_NS)]
    long_ = long_[~waits_of_key[inv[long_]]]
    ops = host[np.array([t[6] == CPU_OP for t in table], dtype=bool)[inv[host]]]
    stall_start, stall_end = widen_stalls(
        (start[long_], end[long_], tids[long_]), (start[ops], end[ops], tids[ops]),
        (start[runtime], end[runtime], tids[runtime]))
    sync = np.flatnonzero(waits_of_key[inv]) if waits_of_key.any() else runtime[:0]
    syncs_of_key = np.array([_is_sync_call(n) for n in table_names], dtype=bool)
    cols = Columns(start, end, kind, tids, nid, corr, streams)
    return RankEvents(
        **_host_view(host, table, inv[host], cols), **_device_view(dev, names, c.coll_args, cols),
        launch_corr=corr[launch], launch_ts=start[launch], launch_tid=tids[launch],
        float_ts=bool(c.n) and bool(np.any(ts != np.floor(ts))),
        loader=_loader_kind(table, table_names),
        stall_start=stall_start, stall_end=stall_end, n_runtime=int(runtime.size),
        sync_start=start[sync], sync_end=end[sync], sync_point=syncs_of_key[inv[sync]],
        sync_tid=tids[sync], sync_name=nid[sync].astype(np.int32),
        counts={"events": c.n_events, "bad_time": c.bad_time, "bad_id": c.bad_id,
                "bad_json": c.bad_json},
        odd_comm=tuple(dict.fromkeys(
            n for n, t in zip(table_names, table)
            if t[0] == _DEVICE and t[1] == COMM and looks_like_comm(n))),
        **_memory_columns(c.mem, base), names=names)


class Columns(NamedTuple):
    """Every event's columns in the decoder's order (sort_events): times in ns, its kind, thread,
    name id, correlation and stream."""
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    tid: np.ndarray
    nid: np.ndarray
    corr: np.ndarray
    stream: np.ndarray


def _host_view(host, table: list, host_inv, cols: Columns) -> dict:
    """RankEvents' host columns (`host`: the host events' rows, `host_inv`: their classes in
    `table`), and the training thread: the one with the most ProfilerSteps (without any, the
    busiest thread stands in for it)."""
    start, end, nid = cols.start, cols.end, cols.nid
    host_kind, host_tid = cols.kind[host], cols.tid[host]
    step_rows = host_kind == STEP
    values, counts = np.unique(host_tid[step_rows] if step_rows.any() else host_tid,
                               return_counts=True)
    coll_u = [t[4] for t in table]
    return dict(
        host_kind=host_kind, host_start=start[host], host_end=end[host], host_tid=host_tid,
        step_id=np.array([t[3] for t in table], dtype=np.int64)[host_inv],
        host_sub=np.array([t[2] for t in table], dtype=np.int8)[host_inv],
        host_wait=np.array([t[5] for t in table], dtype=np.int8)[host_inv],
        host_coll=[coll_u[i] for i in host_inv.tolist()],
        host_op=np.array([t[6] for t in table], dtype=np.int8)[host_inv],
        host_name=nid[host].astype(np.int32),
        step_thread=int(values[counts.argmax()]) if values.size else -1)


def _device_view(dev, names: list, coll_args: dict, cols: Columns) -> dict:
    """RankEvents' device columns (`dev`: the device events' rows): each communication kernel's
    collective key (its process group and collective from its args where they say) and message
    sizes."""
    kind, nid, start, end, corr, streams = (cols.kind, cols.nid, cols.start, cols.end,
                                            cols.corr, cols.stream)
    dev_coll: list = [None] * dev.size
    dev_msg: list = [None] * dev.size
    for p in np.flatnonzero(kind[dev] == COMM).tolist():
        row = int(dev[p])
        group, coll, msg = coll_args.get(row, (None, None, None))
        dev_coll[p] = collective_key(names[nid[row]], group, coll)
        if msg is not None and any(x is not None for x in msg):
            dev_msg[p] = msg
    return dict(dev_kind=kind[dev], dev_start=start[dev], dev_end=end[dev], dev_corr=corr[dev],
                dev_stream=streams[dev], dev_coll=dev_coll, dev_name=nid[dev].astype(np.int32),
                dev_msg=dev_msg)


def _loader_kind(table: list, table_names: list) -> str:
    """"single-process" or "multi-process" from the DataLoader's own ops; "" without them."""
    data_names = [n for n, t in zip(table_names, table) if t[0] == _HOST and t[1] == DATA]
    if not data_names:
        return ""
    return "single-process" if any("SingleProcess" in x for x in data_names) else "multi-process"

