"""One rank's Kineto events -> RunTable rows, one per ProfilerStep.

Each host step window [start, end) is a ProfilerStep#N range on the training thread.
1. GPU traces: the host runs ahead of the GPU (by tens of ms when the GPU is the bottleneck), so
   a step is measured on the device timeline, in its device window [b, e):
     b = min(first start of the kernels the step launched, max(host step start, end of the
         previous step's device work)),
     e = the next step's b (or, after the last step or before a gap between host steps, the
         later of the host step's end and the end of its device work).
   So the windows tile the device timeline without overlap, and every part below is measured
   inside one window: nothing can exceed the step. step_ns = e - b.
   compute = |union of compute kernels in the window|, comm = |union of communication kernels
   (kernels.py's families) and of host-side collectives that no kernel stands for (gloo on CUDA
   tensors copies to the host and reduces there while the GPU idles)|, exposed = comm not
   overlapped by compute; data = the part of the DataLoader wait during which the device was
   idle (the stall the GPU actually sees); host = the GPU idle in the window with no kernel
   queued (the next one was launched only after the GPU had gone idle, as HTA's idle-time
   breakdown counts "host wait"; the window's edges too), outside data waits and host
   collectives: a part of other.
   GPU-side marks (gpu_user_annotation ranges such as ProfilerStep#N on the GPU timeline) are
   not windows: on some traces they are ~20 us marks, not spans of the step's kernels.
2. CPU traces: comm = |union of collective ranges (gloo:*, nccl:*, ...)| on any thread;
   exposed = the part of it when the training thread was not working: outside its ops and
   DataLoader waits, inside a c10d collective call (c10d::..., the ops it runs too: the
   recorder times a call whole), or inside a range that only waits on collectives
   (FSDP::all_gather, FSDP::pre_forward, FSDP1's FullyShardedDataParallel.*) with no op of its
   own running, or a stretch of 0.5 ms or more inside a record_function range with no op running
   (a pipeline schedule's "Backward 0" waiting on a gradient); compute = |union of host ops on
   the training thread| outside the DataLoader wait and the exposed communication.
3. other = step - data - compute - exposed; each part is capped so the parts add up to the step.
4. bubble = the exposed part of point-to-point communication (gloo:send / gloo:recv, NCCL
   SendRecv kernels): a pipeline stage waiting on its neighbour.
Collectives the step launched (point-to-point left out) are returned too, for matching across
ranks; named phases (forward, backward, optimizer) are host ranges in the host window.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from . import spans
from .cpu_maths import cpu_maths
from ...vocab import RESUME_NS
from .events import (ANNOTATION, BACKWARD, CALL, COMM, COMM_HOST, COMPUTE, CPU_OP, DATA,
                     FINISH, FORWARD, LAUNCH, MICROBATCH, OP, OPTIMIZER, STEP, WAITS, WRAPS,
                     RankEvents, p2p_masks)

#: in a record_function range (a schedule's "Backward 0"), a stretch this long with no op of
#: its own running while a collective is in flight is waiting on it; gaps between ops (Python,
#: the dispatcher) are microseconds
ANNOTATION_GAP_NS = 500_000


def step_windows(ev: RankEvents) -> tuple[list[tuple[int, int, int]], list[str]]:
    """(step id, start, end) of each ProfilerStep, sorted by start."""
    warnings: list[str] = []
    idx = np.flatnonzero(ev.host_kind == STEP)
    if idx.size == 0:
        lo = min([a.min() for a in (ev.host_start, ev.dev_start) if a.size], default=0)
        hi = max([a.max() for a in (ev.host_end, ev.dev_end) if a.size], default=0)
        warnings.append("no ProfilerStep ranges: the whole trace is analysed as one step")
        return [(0, int(lo), int(hi))], warnings
    order = idx[np.argsort(ev.host_start[idx], kind="stable")]
    seen, out = set(), []
    for i in order:
        sid = int(ev.step_id[i])
        if sid in seen:
            continue
        seen.add(sid)
        out.append((sid, int(ev.host_start[i]), int(ev.host_end[i])))
    if len(order) > len(out):
        warnings.append(f"{len(order) - len(out)} repeated ProfilerStep number(s) ignored")
    return out, warnings


def last_step(ev: RankEvents) -> int | None:
    """The step HTA's default leaves out of one trace file: its last ProfilerStep, when it has
    two or more (the profiler may stop before its device work ends)."""
    idx = np.flatnonzero(ev.host_kind == STEP)
    if np.unique(ev.step_id[idx]).size < 2:
        return None
    return int(ev.step_id[idx[np.argmax(ev.host_start[idx])]])


def launch_times(ev: RankEvents) -> tuple[np.ndarray, np.ndarray]:
    """Host launch time of each device event (its own start where no launch is correlated),
    and the mask of those whose launch was found."""
    out = ev.dev_start.copy()
    found = np.zeros(out.size, dtype=bool)
    if ev.launch_corr.size == 0 or ev.dev_corr.size == 0:
        return out, found
    order = np.argsort(ev.launch_corr, kind="stable")
    corr, ts = ev.launch_corr[order], ev.launch_ts[order]
    pos = np.clip(np.searchsorted(corr, ev.dev_corr), 0, corr.size - 1)
    found = (corr[pos] == ev.dev_corr) & (ev.dev_corr >= 0)
    out[found] = ts[pos[found]]
    return out, found


def device_windows(ev: RankEvents, windows: list, launched: np.ndarray,
                   found: np.ndarray) -> list[tuple[int, int]]:
    """[b, e) on the device timeline for each host window (the module's docstring, 1.)."""
    n = len(windows)
    lo = np.array([w[1] for w in windows], dtype=np.int64)
    hi = np.array([w[2] for w in windows], dtype=np.int64)
    big = np.iinfo(np.int64).max
    first = np.full(n, big, dtype=np.int64)
    last = np.full(n, -big, dtype=np.int64)
    idx = np.flatnonzero(found)
    at = np.searchsorted(lo, launched[idx], "right") - 1  # the window that launched each
    ok = (at >= 0) & (launched[idx] < hi[np.maximum(at, 0)])
    idx, at = idx[ok], at[ok]
    np.minimum.at(first, at, ev.dev_start[idx])
    np.maximum.at(last, at, ev.dev_end[idx])
    before = ev.dev_start < first[0]  # work on the GPU before the first step's own
    prev = int(ev.dev_end[before].max()) if before.any() else -big
    starts = []
    for i in range(n):
        starts.append(int(min(first[i], max(lo[i], prev))))
        prev = int(last[i]) if last[i] > -big else starts[-1]
    out = []
    for i in range(n):
        end = int(max(hi[i], last[i]))
        if i + 1 < n:
            end = min(end, starts[i + 1])
        out.append((starts[i], end) if end > starts[i] else (int(lo[i]), int(hi[i])))
    return out


class Ranges:
    """A subset of the host ranges (one kind, a mask), sorted by start, that gives the ranges
    overlapping a window [lo, hi) without a pass over every event: those starting before hi
    (a binary search) and after the last range that ends by lo (the running maximum of ends,
    searched too). A window costs its own ranges, not the trace's."""

    def __init__(self, ev: RankEvents, kind: int, mask=None):
        sel = ev.host_kind == kind
        if mask is not None:
            sel = sel & mask
        idx = np.flatnonzero(sel)
        order = np.argsort(ev.host_start[idx], kind="stable")
        self.index = idx[order]
        self.start, self.end = ev.host_start[self.index], ev.host_end[self.index]
        self.reach = np.maximum.accumulate(self.end) if self.end.size else self.end

    def window(self, lo: int, hi: int):
        """(merged spans clipped to the window, indices into the events of the ranges in it)."""
        a = int(self.reach.searchsorted(lo, "right"))  # ranges before a all end by lo
        b = int(self.start.searchsorted(hi, "left"))   # ranges from b on start at hi or later
        s, e = self.start[a:b], self.end[a:b]
        keep = e > lo
        return spans.clip(spans.merge(s[keep], e[keep]), lo, hi), self.index[a:b][keep]


class StepCut(NamedTuple):
    """One step to cut from a rank's events: its id, its device window [lo, hi) (its host
    window in a host-only trace), its host window, the data waits in it and which of its
    collectives are gradient sync (grad_span)."""
    sid: int
    lo: int
    hi: int
    host_lo: int
    host_hi: int
    data_set: tuple
    grads_of: Callable


def _device_view(ev: RankEvents, windows: list, host_p2p, dev_p2p) -> dict:
    """What every step of a trace with device events is cut from, indexed once: the device
    windows, the merged spans of compute, communication, p2p, queued gaps and one-off host
    stalls, and the host collectives that run on the CPU."""
    launched, found = launch_times(ev)
    kind_all = ev.dev_kind
    p2p_dev = dev_p2p & (kind_all == COMM)
    # host collectives that run on the CPU even in a GPU trace (gloo, MPI); NCCL's host ranges
    # only enqueue its kernels, which are counted on the device
    cpu_coll = np.array([c is not None and not c[1].startswith("nccl:") for c in ev.host_coll],
                        dtype=bool)
    dev_order = np.argsort(launched, kind="stable")
    return {"launched": launched, "dev": device_windows(ev, windows, launched, found),
            "busy_all": spans.merge(ev.dev_start, ev.dev_end),
            "comp_all": spans.merge(ev.dev_start[kind_all == COMPUTE],
                                    ev.dev_end[kind_all == COMPUTE]),
            "comm_all": spans.merge(ev.dev_start[kind_all == COMM], ev.dev_end[kind_all == COMM]),
            "p2p_all": spans.merge(ev.dev_start[p2p_dev], ev.dev_end[p2p_dev]),
            "queued_all": queued_gaps(ev.dev_start, ev.dev_end, launched),
            "stalls_all": spans.merge(ev.stall_start, ev.stall_end),  # one-off host work
            # the host blocked on the device
            "syncs": _by_start(ev.sync_start, ev.sync_end, ev.sync_point),
            "comm_r": Ranges(ev, COMM_HOST, cpu_coll),
            "p2p_r": Ranges(ev, COMM_HOST, cpu_coll & host_p2p),
            "dev_order": dev_order, "launched_sorted": launched[dev_order],
            "host_p2p": host_p2p, "dev_p2p": dev_p2p}


def _by_start(*columns: np.ndarray) -> tuple:
    order = np.argsort(columns[0], kind="stable")
    return tuple(c[order] for c in columns)


def _syncs(v: dict, host_lo: int, host_hi: int, idle) -> tuple[dict, tuple]:
    """The runtime calls that waited on the device or copied and began in the step's host
    window: how many syncs among them, the host's time blocked in them all (their union,
    within the window), and the GPU's idle time after the syncs (`idle`: the step's idle
    spans): from a sync's return to the next device work, which the host could have queued
    ahead had it not waited; with the spans the host was blocked in."""
    start, end, point = v["syncs"]
    a, b = np.searchsorted(start, [host_lo, host_hi], "left")
    blocked = spans.merge(start[a:b], np.minimum(end[a:b], host_hi))
    back = end[a:b][point[a:b]]  # where each sync returned
    k = np.searchsorted(idle[1], back, "right")  # the first idle span that ends after it
    inside = k < idle[0].size
    k, back = k[inside], back[inside]
    inside = idle[0][k] <= back  # the GPU idle when the sync returned
    after = spans.merge(back[inside], idle[1][k[inside]])
    return ({"syncs": int(point[a:b].sum()), "sync_ns": spans.length(blocked),
             "sync_idle_ns": spans.length(after)}, blocked)


def _host_causes(v: dict, waits_host, idle, host_lo: int, host_hi: int) -> dict:
    """The GPU's wait on the host (`waits_host`, issue 70): when, the part after the host's
    syncs returned (_syncs); and what the host did meanwhile: maths on CPU tensors (cpu_maths),
    Python between torch ops (no op of a thread that feeds the GPU and no runtime call running:
    the loop's own code, a framework's outside its ops), the rest inside other ops (dispatch
    and launch). The two views overlap; each adds up within itself."""
    synced, blocked = _syncs(v, host_lo, host_hi, idle)
    out = {**synced,
           "cpu_math_ns": spans.overlap(waits_host, v["maths_r"].window(host_lo, host_hi)[0])}
    if v["feeding_r"] is not None:
        busy = spans.union(v["feeding_r"].window(host_lo, host_hi)[0], blocked)
        out["python_ns"] = spans.length(spans.subtract(waits_host, busy))
    return out


def _device_step(v: dict, ev: RankEvents, cut: StepCut, colls: list) -> dict:
    """One step's parts on a device: everything the device did inside its device window
    [lo, hi); its collectives (launched in the host window) join `colls`."""
    sid, lo, hi, host_lo, host_hi, data_set, grads_of = cut
    host_p2p, dev_p2p = v["host_p2p"], v["dev_p2p"]
    comp = spans.window(v["comp_all"], lo, hi)
    host_comm, _ = v["comm_r"].window(lo, hi)
    comm = spans.union(spans.window(v["comm_all"], lo, hi), host_comm)
    comm_ns = spans.length(comm)
    busy = spans.window(v["busy_all"], lo, hi)
    data_ns = spans.length(data_set) - spans.overlap(data_set, busy)
    idle = spans.subtract((np.array([lo], np.int64), np.array([hi], np.int64)), busy)
    known = spans.union(spans.window(v["queued_all"], lo, hi), data_set, comm)
    stalls = spans.window(v["stalls_all"], lo, hi)
    # the GPU idle while the host was in one-off work: startup, not launch overhead
    startup_ns = spans.length(spans.subtract(spans.intersect(idle, stalls), known))
    waits_host = spans.subtract(idle, spans.union(known, stalls))
    host_ns = spans.length(waits_host)
    p2p = spans.union(spans.window(v["p2p_all"], lo, hi), v["p2p_r"].window(lo, hi)[0])
    # the collectives the step launched (host window), with the part of each that no compute
    # kernel hides: the wait split compares it across ranks
    order, at = v["dev_order"], v["launched_sorted"]
    sel = order[np.searchsorted(at, host_lo, "left"):np.searchsorted(at, host_hi, "left")]
    sel = np.sort(sel)  # in trace order, as a mask would give them
    launches = int(sel.size)  # the device work the step launched: kernels, copies, memsets
    sel = sel[(ev.dev_kind[sel] == COMM) & ~dev_p2p[sel]]
    insts = [(ev.dev_coll[j], int(ev.dev_start[j]), int(ev.dev_end[j])) for j in sel.tolist()]
    grads = [grads_of(int(t)) for t in v["launched"][sel].tolist()]
    _, hsel = v["comm_r"].window(host_lo, host_hi)
    hsel = hsel[ev.host_start[hsel] >= host_lo]  # each in the step it started in
    hsel = np.sort(hsel[~host_p2p[hsel]])
    insts += [(ev.host_coll[j], int(ev.host_start[j]), int(ev.host_end[j]))
              for j in hsel.tolist()]
    grads += [grads_of(int(t)) for t in ev.host_start[hsel].tolist()]
    comp_all = v["comp_all"]
    add_collectives(colls, sid, insts,
                    lambda u: spans.length(spans.subtract(
                        u, spans.window(comp_all, int(u[0][0]), int(u[1][-1])))),
                    grads=grads)
    return {"compute_ns": spans.length(comp), "comm_ns": comm_ns,
            "exposed_ns": comm_ns - spans.overlap(comm, comp),
            "in_flight_ns": 0,  # measured on the device: what ran, not what was in flight
            "data_ns": data_ns, "host_ns": host_ns, "startup_ns": startup_ns,
            "bubble_ns": spans.length(spans.subtract(p2p, comp)), "launches": launches,
            **_host_causes(v, waits_host, idle, host_lo, host_hi)}


def _host_view(ev: RankEvents, main, leaves_main, windows: list, host_p2p) -> dict:
    """What every step of a host-only trace is cut from, indexed once: the training thread's
    ops, its waits (c10d calls, functional collectives' waits, FSDP's wrapping ranges, DDP's
    write-back of synced buckets), the ops inside them, and DDP's buckets in flight."""
    launches = main & (ev.host_wait == LAUNCH)
    wraps = main & (ev.host_wait == WRAPS)
    # a c10d call a functional collective makes is part of that one's launch: host work, as
    # the recorder counts a functional collective from the end of its launch call
    calls = main & (ev.host_wait == CALL)
    calls &= ~inside(ev, calls, launches)
    # DDP's reducer launching a bucket before its last in the step: backward's host work
    early, flights = ddp_early_launches(ev, calls, main & (ev.host_wait == FINISH), wraps,
                                        windows)
    calls &= ~early
    strict = main & ((ev.host_wait == WAITS) | calls)
    # DDP's reducer writing synced buckets back (events.FINISH): synchronization, whole
    finish = main & (ev.host_wait == FINISH)
    waits = strict | wraps | finish
    # the work inside wait ranges: ops with no op inside them, but not a wait range that has
    # no child (gloo's c10d::allreduce_ blocking 20 ms when its queue is full is waiting, not
    # work)
    leaf = leaves_main & ~waits
    annots = main & (ev.host_wait == ANNOTATION)
    return {"flights": flights, "ops_r": Ranges(ev, OP, main), "comm_r": Ranges(ev, COMM_HOST),
            "wait_r": Ranges(ev, OP, waits & ~finish), "annot_r": Ranges(ev, OP, annots),
            "leaf_r": Ranges(ev, OP, leaf), "call_r": Ranges(ev, OP, calls),
            "strict_r": Ranges(ev, OP, strict), "wrap_r": Ranges(ev, OP, wraps),
            "finish_r": Ranges(ev, OP, finish),
            # where a collective is issued or waited on
            "issue_r": Ranges(ev, OP, strict | launches),
            "p2p_r": Ranges(ev, COMM_HOST, host_p2p), "host_p2p": host_p2p}


def _host_step(v: dict, ev: RankEvents, cut: StepCut, colls: list) -> dict:
    """One step's parts on the host: the training thread's ops, less the time it was blocked
    on communication; its collectives join `colls`."""
    sid, lo, hi, _, _, data_set, grads_of = cut
    host_p2p = v["host_p2p"]
    ops, _ = v["ops_r"].window(lo, hi)
    comm, csel = v["comm_r"].window(lo, hi)
    waiting, _ = v["wait_r"].window(lo, hi)
    finished = v["finish_r"].window(lo, hi)[0]
    annot, _ = v["annot_r"].window(lo, hi)
    blocked = spans.merge(np.zeros(0, np.int64), np.zeros(0, np.int64))
    if waiting[0].size or annot[0].size or finished[0].size:  # inside wait ranges only
        # their ops work
        leaves, _ = v["leaf_r"].window(lo, hi)
        # blocked in a collective: a c10d call whole, the ops it runs too; a functional
        # collective's wait where no op of its own runs; FSDP's ranges where no op of their
        # own runs while a collective is pending (they also copy in and out and run Python
        # after the collective ended, which is work)
        strict_w = v["strict_r"].window(lo, hi)[0]
        idle_in_wraps = spans.subtract(v["wrap_r"].window(lo, hi)[0], leaves)
        blocked = spans.union(
            spans.subtract(strict_w, leaves), v["call_r"].window(lo, hi)[0], finished,
            spans.intersect(idle_in_wraps, pending(comm, v["issue_r"].window(lo, hi)[0][0])))
        idle = blocked
        if annot[0].size:  # long stretches of a record_function range with no op
            gap_s, gap_e = spans.subtract(annot, leaves)
            long = gap_e - gap_s >= ANNOTATION_GAP_NS
            idle = spans.union(idle, (gap_s[long], gap_e[long]))
        busy = spans.subtract(ops, idle)
    else:
        busy = ops
    csel = csel[ev.host_start[csel] >= lo]  # each collective in the step it started in
    csel = np.sort(csel[~host_p2p[csel]])
    insts = [(ev.host_coll[j], int(ev.host_start[j]), int(ev.host_end[j]))
             for j in csel.tolist()]
    grads = [grads_of(int(t)) for t in ev.host_start[csel].tolist()]
    gaps = pending_gaps((np.array([lo], np.int64), np.array([hi], np.int64)),
                        spans.union(ops, data_set), insts,
                        v["issue_r"].window(lo, hi)[0][0], finished[0])
    blocked = spans.union(blocked, gaps)
    # a thread blocked in a collective call, or idle until a collective it issued ends (DDP's
    # reducer waiting for the last bucket, in no op of its own), is communicating whether or
    # not the collective's own range (on its backend's thread) has started: gloo runs a DDP
    # bucket only when the one before it is done, and its thread may wait for a core
    comm = spans.union(comm, blocked)
    exposed = spans.subtract(comm, spans.union(busy, data_set))
    # DDP's synchronization is in flight from its first bucket's launch, as the record counts
    # it (record/ddp_timing.py): behind backward's compute, not exposed
    flight = spans.window(v["flights"], lo, hi)
    add_collectives(colls, sid, insts, lambda u, x=exposed: spans.overlap(u, x),
                    blocks=_blocks(waiting, blocked) + _blocks(gaps, gaps), grads=grads,
                    finished=finished)
    return {"compute_ns": spans.length(spans.subtract(ops, spans.union(data_set, exposed))),
            "comm_ns": spans.length(spans.union(comm, flight)),
            "exposed_ns": spans.length(exposed), "in_flight_ns": spans.length(flight),
            "data_ns": spans.length(data_set), "host_ns": 0, "startup_ns": 0,
            "bubble_ns": spans.overlap(v["p2p_r"].window(lo, hi)[0], exposed)}


def feeding_ops(ev: RankEvents) -> Ranges | None:
    """The torch ops of the threads that feed the GPU (the training thread, autograd's):
    outside them and the runtime calls, the host runs Python (a Python function's own range,
    with_stack, is that Python); None in a trace without torch ops, which cannot tell it."""
    torch_ops = (ev.host_kind == OP) & (ev.host_op == CPU_OP)
    if not torch_ops.any():
        return None
    feeding = np.union1d(np.unique(ev.launch_tid), [ev.step_thread])
    return Ranges(ev, OP, torch_ops & np.isin(ev.host_tid, feeding))


def rank_rows(ev: RankEvents, rank: int, drop: frozenset = frozenset()):
    """RunTable rows and collective instances (step, key, dur_ns, end_ns, exposed_ns) of one
    rank; the steps in `drop` (last_step of each of its files) are left out. Each row also
    holds "microbatches", the pipeline schedule's forward ranges in the step (not a column)."""
    windows, warnings = step_windows(ev)
    gpu = ev.dev_kind.size > 0
    main = ev.host_tid == ev.step_thread
    host_p2p, dev_p2p = p2p_masks(ev)
    # the host ranges each part of a step is made of, indexed once for all the steps
    data_r = Ranges(ev, DATA)
    phase_r = {name: Ranges(ev, OP, main & np.isin(ev.host_sub, subs))
               for name, subs in (("forward_ns", (FORWARD, MICROBATCH)),
                                  ("backward_ns", (BACKWARD,)), ("optimizer_ns", (OPTIMIZER,)))}
    micro_r = Ranges(ev, OP, main & (ev.host_sub == MICROBATCH))
    # gradient synchronization: a collective issued from the start of a step's backward (any
    # thread: on a GPU it runs on autograd's own) until its optimizer step begins, as DDP's
    # buckets, FSDP's reduce-scatters and a loop's own gradient averaging are; the loop's
    # other collectives (metrics, an EMA) are not what syncing less often saves
    bwd_any = Ranges(ev, OP, ev.host_sub == BACKWARD)
    opt_any = Ranges(ev, OP, ev.host_sub == OPTIMIZER)
    # the training thread's torch ops inside its data waits: the CPU that loading is seen to
    # use (its Python, a decoder's, is not in a trace: a lower bound)
    leaves_main = leaf_ops(ev, main)
    leaf_main = Ranges(ev, OP, leaves_main)
    view = (_device_view(ev, windows, host_p2p, dev_p2p) if gpu else
            _host_view(ev, main, leaves_main, windows, host_p2p))
    if gpu:  # the training thread's maths on CPU tensors: the GPU gets nothing meanwhile
        view["maths_r"] = Ranges(ev, OP, cpu_maths(ev, leaves_main))
        view["feeding_r"] = feeding_ops(ev)
    markers = bool((ev.host_kind == STEP).any())
    rows, colls, startup_total = [], [], 0
    for i, (sid, host_lo, host_hi) in enumerate(windows):
        if sid in drop:  # its device work may be cut off where the profiler stopped (as HTA)
            continue
        n_before = len(colls)
        lo, hi = view["dev"][i] if gpu else (host_lo, host_hi)
        grads_of = grad_span(bwd_any, opt_any, host_lo, host_hi)
        step_ns = hi - lo
        data_set, _ = data_r.window(lo, hi)
        cut = StepCut(sid, lo, hi, host_lo, host_hi, data_set, grads_of)
        if gpu:
            p = _device_step(view, ev, cut, colls)
            if not markers:  # the whole trace as one step: its startup is not part of it
                step_ns -= p["startup_ns"]
            startup_total += p["startup_ns"]
        else:
            p = _host_step(view, ev, cut, colls)
        data_ns = min(p["data_ns"], step_ns)
        data_len = spans.length(data_set)
        data_ops_ns = (int(spans.overlap(leaf_main.window(lo, hi)[0], data_set) * data_ns
                           / data_len) if data_len > 0 else 0)  # over data_ns, as its share
        exposed_ns = max(0, min(p["exposed_ns"], step_ns - data_ns))
        compute_ns = max(0, min(p["compute_ns"], step_ns - data_ns - exposed_ns))
        host_ns = max(0, min(p["host_ns"], step_ns - data_ns - exposed_ns - compute_ns))
        bubble_ns = max(0, min(p["bubble_ns"], exposed_ns))
        parts = {name: spans.length(r.window(host_lo, host_hi)[0])
                 for name, r in phase_r.items()}
        micro = int(micro_r.window(host_lo, host_hi)[1].size)
        rows.append({"rank": rank, "step": sid, "start_ns": lo, "step_ns": step_ns,
                     "data_ns": data_ns, "compute_ns": compute_ns, "comm_ns": p["comm_ns"],
                     "comm_exposed_ns": exposed_ns, "wait_ns": 0,
                     "other_ns": step_ns - data_ns - compute_ns - exposed_ns, **parts,
                     "n_comm": len(colls) - n_before,
                     "data_cpu_ns": -1,  # unknown: a trace does not say whether loading used CPU
                     "data_ops_ns": data_ops_ns,  # ... but its torch ops in it did
                     "host_ns": host_ns, "bubble_ns": bubble_ns, "microbatches": micro,
                     "in_flight_ns": p["in_flight_ns"],
                     # the host blocked on the device (GPU traces; 0 in host-only ones)
                     "launches": p.get("launches", 0),
                     "cpu_math_ns": min(p.get("cpu_math_ns", 0), host_ns),
                     "python_ns": min(p.get("python_ns", 0), host_ns),
                     "syncs": p.get("syncs", 0), "sync_ns": min(p.get("sync_ns", 0), step_ns),
                     "sync_idle_ns": min(p.get("sync_idle_ns", 0), host_ns)})
    warnings += _trace_warnings(ev, gpu, markers, startup_total, rows)
    return rows, colls, warnings


def _trace_warnings(ev: RankEvents, gpu: bool, markers: bool, startup_total: int,
                    rows: list) -> list[str]:
    """What the trace's rows leave out: one-off startup work, a GPU whose activity was not
    recorded (its rows' host compute then counted as other)."""
    out = []
    if startup_total:
        out.append(
            f"{startup_total / 1e6:,.1f} ms of one-off host work while the GPU idled (runtime "
            "calls of 10 ms or more: a library's first load inside its first launch, cudaFree, "
            "cudaMalloc, context or stream creation) is startup, not per-step launch overhead: "
            + ("left out of the trace's one step" if not markers else "not counted as host-bound"))
    if not gpu and ev.n_runtime >= 10:
        out.append(
            f"{ev.n_runtime} CUDA runtime calls (kernel launches, copies) but no GPU event: the "
            "GPU's activity was not recorded (profile with activities=[ProfilerActivity.CPU, "
            "ProfilerActivity.CUDA]); the host's ops are not the GPU's compute: counted as "
            "other")
        for r in rows:  # what the host ran is not what the GPU computed: unknown, not compute
            r["other_ns"] += r["compute_ns"]
            r["compute_ns"] = 0
    return out



#: DDP's reducer takes views of a bucket (aten::as_strided, 30 us seen) before writing it back:
#: a write-back starting this soon after the thread resumes is what it resumed for
WRITE_BACK_LEAD_NS = 500_000

#: autograd accumulating a leaf's gradient: where DDP's reducer marks it ready and launches the
#: all-reduce of a bucket it completes
ACCUMULATE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def ddp_early_launches(ev: RankEvents, calls: np.ndarray, finish: np.ndarray,
                       wraps: np.ndarray, windows: list):
    """(mask, flights): the mask of the c10d calls that are DDP's reducer launching a bucket
    before the last one of
    its step: inside autograd's AccumulateGrad (not inside an FSDP range), in a trace where
    DDP's reducer writes buckets back (`finish`), all but the last of each step window. They are
    host work of the backward, as the recorder counts them: its DDP tail starts at the last
    launch (record/ddp_timing.py), and a launch that a busy core stretched (6-9 ms seen) is the
    core taken away while the backward ran, not time that syncing less often gives back (the
    two sources' estimates were 15-24% apart in 3 of 10 busy runs with the traces calling it
    communication). The last launch stays the collective's, as in the record's tail. `flights`:
    the spans from each step's first launch to its last (spans.merge's pair), where gradient
    synchronization is in flight behind backward's compute."""
    out = np.zeros(calls.size, dtype=bool)
    none = spans.merge(np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not finish.any() or not calls.any():
        return out, none
    ids = [i for i, n in enumerate(ev.names) if n.startswith(ACCUMULATE)]
    if not ids or ev.host_name.size != calls.size:
        return out, none
    accum = (ev.host_kind == OP) & np.isin(ev.host_name, ids)
    ddp = calls & inside(ev, calls, accum) & ~inside(ev, calls, wraps)
    idx = np.flatnonzero(ddp)
    idx = idx[np.argsort(ev.host_start[idx], kind="stable")]
    starts = ev.host_start[idx]
    fs, fe = [], []
    for _, lo, hi in windows:
        a, b = np.searchsorted(starts, [lo, hi], "left")
        if b - a > 1:
            out[idx[a:b - 1]] = True  # all but the step's last
            fs.append(int(starts[a]))
            fe.append(int(starts[b - 1]))
    return out, spans.merge(np.array(fs, np.int64), np.array(fe, np.int64))


def inside(ev: RankEvents, which: np.ndarray, within: np.ndarray) -> np.ndarray:
    """Mask of the ranges in `which` that start inside one of the ranges in `within`."""
    out = np.zeros(ev.host_kind.size, dtype=bool)
    idx = np.flatnonzero(which)
    if not idx.size or not within.any():
        return out
    ws, we = spans.merge(ev.host_start[within], ev.host_end[within])
    at = np.searchsorted(ws, ev.host_start[idx], "right") - 1
    out[idx] = (at >= 0) & (ev.host_start[idx] < we[at.clip(min=0)])
    return out


def pending(comm, issued) -> tuple[np.ndarray, np.ndarray]:
    """Where a collective is pending: each collective range (`comm`, merged) until RESUME_NS past
    its end, and from each call that issues or waits on one (`issued`: their starts) until the
    end of the first collective range that ends after it (a collective queued behind another
    on its backend's thread has been issued, not started)."""
    cs, ce = comm
    if not cs.size:
        return cs[:0], ce[:0]
    issued = np.asarray(issued, np.int64)
    at = np.searchsorted(ce, issued, "left")
    ok = at < ce.size
    return spans.merge(np.r_[cs, issued[ok]], np.r_[ce, ce[at[ok]]] + RESUME_NS)


def pending_gaps(window, work, insts: list, issued, resumed=None):
    """The stretches of `window` where the training thread runs nothing (no op, no data wait:
    `work`) from after it issued a collective (a collective call starts before the stretch:
    `issued`, the starts of its wait ranges) until a collective ends, the thread running again
    within RESUME_NS of that end: it was waiting for the collective (CPU traces, where DDP's
    reducer waits for its buckets in no op of its own); of a longer stretch, up to RESUME_NS
    past the end (the rest is the thread waiting for a core: other), unless what the thread
    runs next is DDP's reducer writing a bucket back (`resumed`: the starts of those ranges,
    events.FINISH; the views it takes first may come before, WRITE_BACK_LEAD_NS): then all of
    it was inside DDP's wait for its buckets, as the recorder's DDP tail (to backward's return)
    counts it."""
    gs, ge = spans.subtract(window, work)
    ends = np.sort(np.array([b for _, _, b in insts], np.int64))
    if not gs.size or not ends.size or not np.size(issued):
        return spans.merge(gs[:0], ge[:0])
    first_issue = int(np.min(issued))
    # the last collective end within the gap, and how long before the gap's end it was
    at = np.searchsorted(ends, ge, "right") - 1
    last = np.where(at >= 0, ends[at.clip(min=0)], -1)
    keep = (gs >= first_issue) & (last > gs)
    end = np.minimum(ge, last + RESUME_NS)
    if resumed is not None and np.size(resumed):  # the next write-back starts soon after
        resumed = np.sort(np.asarray(resumed, np.int64))
        nxt = np.searchsorted(resumed, ge, "left")
        soon = (nxt < resumed.size) & (
            resumed[nxt.clip(max=resumed.size - 1)] - ge <= WRITE_BACK_LEAD_NS)
        end = np.where(soon, ge, end)
    return gs[keep], end[keep]


def _blocks(waiting, blocked) -> list:
    """[(call start, call end, blocked spans in it)] for each span of collective calls."""
    out = []
    for a, b in zip(waiting[0].tolist(), waiting[1].tolist()):
        part = spans.clip(blocked, a, b)
        if part[0].size:
            out.append((a, b, part))
    return out


def grad_span(bwd, opt, lo: int, hi: int):
    """Whether a collective issued at t synchronizes gradients: from the first backward range
    of the step's host window [lo, hi) until its first optimizer range after that (the window's
    end without one); never without a backward in the window."""
    (bs, _), _ = bwd.window(lo, hi)
    if not bs.size:
        return lambda t: False
    start = int(bs[0])
    (os_, _), _ = opt.window(start, hi)
    later = os_[os_ > start]
    end = int(later[0]) if later.size else hi
    return lambda t: start <= t < end


def add_collectives(colls: list, sid: int, insts: list, exposed_of, blocks=(),
                    grads=None, finished=None) -> None:
    """Append one step's collective instances (key, start, end) to `colls` as (step, key,
    dur_ns, end_ns, exposed_ns, grads_exposed_ns); `grads`: per instance, whether it
    synchronizes gradients (grad_span), whose exposed time, per key, is the last field. The time and the exposed time of a key are those of the union
    of its instances in the step (`exposed_of(merged spans)`), carried by its first instance:
    gloo runs two buckets' all-reduces at once on two threads, and summing them would count the
    time they overlap twice (an all_reduce total of 250 ms in a 223 ms step). `blocks`: the spans of collective calls the training thread
    was blocked in (CPU traces), each given to the key of the first instance that ends after
    the block begins: the one it overlaps, or the one it issued and waited to start (gloo's
    c10d::allreduce_ blocked 8 ms while the peer was still in its backward, its own range on
    the backend's thread starting after the call returned). `finished`: the spans of DDP's reducer
    writing buckets back (events.FINISH), each given to the key of the last instance that ended
    before it (the bucket it writes back)."""
    if not insts:
        return
    by_key: dict = {}
    for key, a, b in insts:
        by_key.setdefault(key, []).append((a, b))
    for a, b, part in blocks:
        key = next((k for k, _, e_ in insts if e_ > a), None)
        if key is not None:
            by_key[key] += list(zip(part[0].tolist(), part[1].tolist()))
    if finished is not None:  # DDP writing a bucket back: the key of the last instance
        # ended by then (the bucket it writes back), else of the first that ends after
        for a, b in zip(*(x.tolist() for x in finished)):
            done = [(e_, k) for k, _, e_ in insts if e_ <= a]
            key = max(done)[1] if done else next((k for k, _, e_ in insts if e_ > a), None)
            if key is not None:
                by_key[key].append((a, b))
    exposed, length, grad_exposed = {}, {}, {}
    for key, ab in by_key.items():
        arr = np.array(ab, dtype=np.int64)
        union = spans.merge(arr[:, 0], arr[:, 1])  # instances of no length drop out
        exposed[key] = int(exposed_of(union)) if union[0].size else 0
    grads = grads if grads is not None else [False] * len(insts)
    for key in {k for k, _, _ in insts}:  # the instances' own time, overlaps counted once
        arr = np.array([(a, b) for k, a, b in insts if k == key], dtype=np.int64)
        length[key] = spans.length(spans.merge(arr[:, 0], arr[:, 1]))
        mine = [g for (k, _, _), g in zip(insts, grads) if k == key]
        if all(mine):  # the key's exposed time, blocks included, is gradient sync
            grad_exposed[key] = exposed[key]
        elif any(mine):  # some of its instances: theirs alone
            arr = np.array([(a, b) for (k, a, b), g in zip(insts, grads) if k == key and g],
                           dtype=np.int64)
            union = spans.merge(arr[:, 0], arr[:, 1])
            grad_exposed[key] = min(int(exposed_of(union)) if union[0].size else 0,
                                    exposed[key])
    for key, a, b in insts:
        colls.append((sid, key, length.pop(key, 0), b, exposed.pop(key, 0),
                      grad_exposed.pop(key, 0)))


def leaf_ops(ev: RankEvents, main: np.ndarray) -> np.ndarray:
    """Mask of the training thread's ops with no op inside them. Ranges on one thread nest, so
    sorted by start (the longer first), an op is a leaf when the next one starts after it ends."""
    out = np.zeros(ev.host_kind.size, dtype=bool)
    idx = np.flatnonzero(main & (ev.host_kind == OP))
    if idx.size == 0:
        return out
    order = idx[np.lexsort((-ev.host_end[idx], ev.host_start[idx]))]
    start, end = ev.host_start[order], ev.host_end[order]
    out[order] = np.r_[start[1:] >= end[:-1], True]
    return out


def queued_gaps(start: np.ndarray, end: np.ndarray, launched: np.ndarray):
    """GPU-idle gaps between device events while the next one had already been launched: the
    GPU waited on something other than the host (an event, another stream). Every other idle
    stretch of a step's window is the GPU waiting for the host to launch work (HTA's "host
    wait", over all streams), outside data waits and host-side collectives."""
    if start.size < 2:
        return spans.merge(start[:0], end[:0])
    order = np.argsort(start, kind="stable")
    s, e, ln = start[order], end[order], launched[order]
    reach = np.maximum.accumulate(e)[:-1]  # GPU busy until here before event i+1
    queued = (s[1:] > reach) & (ln[1:] <= reach)
    return spans.merge(reach[queued], s[1:][queued])
