"""Turns the intervals one training micro-step recorded into one row of the record file."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocab import COMPUTE_PHASES, RESUME_NS
from . import intervals as iv

DDP_KEY = "all_reduce:ddp"  # DDP's gradient buckets, in the per-collective breakdown


@dataclass(slots=True)
class Raw:
    """What one micro-step recorded, host perf_counter ns."""

    step: int
    start: int
    end: int
    first: int | None     # first event of the step (batch fetch, forward, a phase)
    data_ns: int
    data_cpu_ns: int
    phases: list          # (name, t0, t1): forward, backward, optimizer and user phases
    exposed: list         # (t0, t1, key): blocking collectives, waits on async ones, comm phases
    buckets: list         # (launch, done): DDP gradient buckets
    colls: list           # (key, launch, done): collectives through torch.distributed
    fwd_end: int | None
    synced: int           # gradients synchronized in this micro-step: 1, 0, or -1 unknown
    samples: int = -1     # the batch's size when it differs from the first batch's (-1: same)


def sum_step(r: Raw, start_unix: int) -> list:
    """Sum one micro-step's intervals into a row of STEP_COLUMNS, plus a trailing object with
    phases that are not fixed columns and, under "_comm", {"kind:group": [comm_ns, exposed_ns,
    count]}.

    1. backward is the time inside torch.autograd.backward; without it, it runs from the end of
       forward to the optimizer (or to the last gradient bucket when no optimizer step ran);
    2. the optimizer's time excludes forward and backward run inside it (closures: LBFGS,
       Lightning); forward and backward exclude the time they were blocked on communication
       (FSDP's all-gather waits, DDP's last buckets);
    3. exposed communication: the tail from DDP's last bucket launch (the end of backward
       compute) to its last bucket done, and on to the end of the measured backward, at most
       RESUME_NS past that done (the training thread waits in DDP's reducer until the bucket's
       future is complete, which can be after its callback ran: a busy core held the backend's
       thread 3.5 ms there; what is later than that is the thread waiting for a core: other,
       the trace reader's rule too), blocking collectives and waits on async ones;
    4. compute is the union of the compute phases minus what overlaps exposed communication;
       with no phase at all, everything that is not data or exposed comm counts as compute;
    5. other is what remains of the step; `between_ns`, the part of it before the step's first
       event (what the loop did after the previous rec.step()).
    """
    start, end = r.start, r.end
    step_ns = end - start
    buckets = iv.clip(r.buckets, start, end)
    phases = [(n, a, b) for n, a, b in r.phases if b > a]
    measured_bwd = [(a, b) for n, a, b in phases if n == "backward"]
    if r.fwd_end is not None and not any(n == "backward" for n, _, _ in phases):
        opt_starts = [a for n, a, _ in phases if n == "optimizer" and a >= r.fwd_end]
        bwd_end = min(opt_starts) if opt_starts else max((b for _, b in buckets), default=None)
        if bwd_end is not None:
            phases.append(("backward", r.fwd_end, bwd_end))
    named: dict[str, int] = {}
    for n, a, b in phases:
        named[n] = named.get(n, 0) + (b - a)
    exposed = [(a, b, k) for a, b, k in r.exposed if b > a]
    if buckets:
        last_launch = max(a for a, _ in buckets)
        last_done = max(b for _, b in buckets)
        for a, b in measured_bwd:
            if a <= last_launch < b:
                last_done = max(last_done, min(b, last_done + RESUME_NS))
        if last_done > last_launch:
            exposed.append((last_launch, last_done, DDP_KEY))
    exposed_m = iv.merge([(a, b) for a, b, _ in exposed])
    if "optimizer" in named:  # forward / backward inside optimizer.step(closure)
        opt = iv.merge([(a, b) for n, a, b in phases if n == "optimizer"])
        inner = iv.merge([(a, b) for n, a, b in phases if n in ("forward", "backward")])
        named["optimizer"] = iv.total(opt) - iv.overlap(opt, inner)
    for name in ("forward", "backward"):  # a phase blocked on communication is not computing
        if name in named and exposed_m:
            spans = iv.merge([(a, b) for n, a, b in phases if n == name])
            named[name] = iv.total(spans) - iv.overlap(spans, exposed_m)
    colls = [(k, a, b) for k, a, b in r.colls if b > a]
    comm_m = iv.merge(buckets + [(a, b) for _, a, b in colls] + [(a, b) for a, b, _ in exposed])
    comm_ns = iv.total(iv.clip(comm_m, start, end))
    exposed_ns = min(iv.total(iv.clip(exposed_m, start, end)), step_ns)

    data_ns = min(r.data_ns, step_ns)
    if phases:
        compute_m = iv.merge([(a, b) for _, a, b in phases])
        compute_ns = iv.total(compute_m) - iv.overlap(compute_m, exposed_m)
        compute_ns = max(0, min(compute_ns, step_ns - data_ns - exposed_ns))
    else:  # nothing named: all that is not data or comm counts as compute
        compute_ns = max(0, step_ns - data_ns - exposed_ns)
    other_ns = max(0, step_ns - data_ns - exposed_ns - compute_ns)
    between = 0 if r.first is None else min(max(0, r.first - start), other_ns)
    fixed = [named.pop(k, 0) for k in COMPUTE_PHASES]  # the fixed columns, in their order
    row = [r.step, start_unix, step_ns, data_ns, compute_ns, comm_ns, exposed_ns,
           other_ns, *fixed, len(buckets) + len(colls), r.data_cpu_ns, r.synced, between]
    if buckets or colls or exposed:
        named["_comm"] = _by_key(buckets, colls, exposed)
    if r.samples >= 0:  # a smaller last batch: how compute grows with the batch (analyze/whatif)
        named["_samples"] = r.samples
    if named:
        row.append(named)
    return row


def _by_key(buckets: list, colls: list, exposed: list) -> dict:
    """{"kind:group": [comm_ns, exposed_ns, count]} for the step."""
    spans: dict[str, list] = {}
    counts: dict[str, int] = {}
    if buckets:
        spans[DDP_KEY] = list(buckets)
        counts[DDP_KEY] = len(buckets)
    for k, a, b in colls:
        spans.setdefault(k, []).append((a, b))
        counts[k] = counts.get(k, 0) + 1
    blocked: dict[str, list] = {}
    for a, b, k in exposed:
        blocked.setdefault(k, []).append((a, b))
    out = {}
    for k in spans.keys() | blocked.keys():
        m = iv.merge(spans.get(k, []) + blocked.get(k, []))
        out[k] = [iv.total(m), iv.total(iv.merge(blocked.get(k, []))), counts.get(k, 0)]
    return out
