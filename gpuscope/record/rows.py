"""A flush's rows from its micro-steps' events (what `StepLog.take` handed over): every row rule
lives here, behind one switch between two paths that give the same row.

- general (`interpret`, then `sum_steps`): any micro-step's events are paired into intervals
  (`Raw`) and summed by the rules in `_general_step`'s docstring;
- fast (`plain_row`): the common shape (forward, backward, optimizer once each in order, at most
  one fetch and one DDP tail, nothing else) straight from its events, with no intervals made
  first; any other shape falls back to the general path. It exists for its cost (1.5 us a
  micro-step against 24: benchmarks/bench_row_paths.py).

`build(taken, shift, path)` is the switch: the recorder uses the fast path, the tests run every
row rule on both (tests/test_rows.py, tests/test_golden_cases.py). Its result holds everything
else the recorder reads of the flush (each step's all-to-all rows, forward calls per step), so
the recorder knows nothing of either path's shape.
"""

from __future__ import annotations

from typing import NamedTuple

from ..run_format import COMM_KEY
from ..vocab import COMPUTE_PHASES, RESUME_NS
from . import intervals as iv
from .events import BEGAN, COLL, LOOP_FORWARD, ROWS, SAMPLES, WAIT

FAST, GENERAL = "fast", "general"
PATHS = (FAST, GENERAL)
_NEVER = 1 << 62  # no time yet

#: DDP's gradient buckets, in the per-collective breakdown, and the record header's comm_key: a
#: row whose "_comm" would be {DDP_KEY: [comm_ns, exposed_ns, n_comm]} of its own columns leaves
#: it out (run_format.py)
DDP_KEY = COMM_KEY


class Raw(NamedTuple):
    """What one micro-step recorded, host perf_counter ns: its events paired into intervals
    (interpret)."""

    step: int
    start: int
    end: int
    first: int | None     # first event of the step (batch fetch, forward, a phase)
    data_ns: int
    data_cpu_ns: int
    phases: list          # (name, t0, t1): forward, backward, optimizer and user phases
    exposed: list         # (t0, t1, key): blocking collectives, waits on async ones, comm phases
    ddp_tails: list       # (start, done[, first]): the end of a DDP backward that waited for
    #                       its all-reduce, and when its first bucket was launched, where timed
    #                       (ddp_timing.py): one per timed backward
    colls: list           # (key, launch, done): collectives through torch.distributed
    fwd_end: int | None
    synced: int           # gradients synchronized in this micro-step: 1, 0, or -1 unknown
    samples: int = -1     # the batch's size when it differs from the first batch's (-1: same)
    forwards: int = 0     # forward phases in it (a pipeline stage's micro-batches: several)
    rows: tuple = ()      # rows each all_to_all_single delivered, in issue order


class Built(NamedTuple):
    """A flush's rows and what else the recorder reads of its micro-steps."""

    rows: list      # one per micro-step in which something began, in order (STEP_COLUMNS...)
    routed: list    # (step, rows each all_to_all_single delivered) where one ran
    forwards: list  # forward calls of each micro-step with a row


def build(taken: list, shift: int, path: str = FAST) -> Built:
    """A flush's rows, in order (start_unix = start + `shift`): `path` FAST makes the common
    shape's row straight from its events and pairs any other into intervals; GENERAL pairs all.
    A micro-step in which nothing began has no row."""
    if path == FAST:
        rows = [plain_row(item, shift) for item in taken]
        if all(row is not None for row in rows):
            return Built(rows, [], [1] * len(rows))  # the common shape: one forward each
    elif path == GENERAL:
        rows = [None] * len(taken)
    else:
        raise ValueError(f"path {path!r}: one of {PATHS}")
    raws = interpret([item for item, row in zip(taken, rows) if row is None])
    general = dict(zip((r.step for r in raws), zip(sum_steps(raws, shift), raws)))
    out, forwards = [], []
    for item, row in zip(taken, rows):
        if row is not None:
            out.append(row)
            forwards.append(1)
        elif item[4] in general:
            row, raw = general[item[4]]
            out.append(row)
            forwards.append(raw.forwards)
    return Built(out, [(r.step, list(r.rows)) for r in raws if r.rows], forwards)


_new = tuple.__new__


def interpret(taken: list) -> list:
    """The intervals (Raw) of each micro-step in `taken` (what take() handed over, a
    flush's batch; one call for all: this runs for every micro-step). For each: `first`, the
    earliest time anything of it began; its start, that first when it had none (the first
    after the recording started); `fwd_end`, the end of the model's last forward. A micro-step
    in which nothing began is left out."""
    out = []
    for phases, data, tails, rare, step, start, end, sync_flag in taken:
        first = _NEVER
        fwd_end = None
        forwards = 0
        for name, t0, t1 in phases:
            if t0 < first:
                first = t0
            if name == "forward":
                forwards += 1
                fwd_end = t1
        data_ns = data_cpu_ns = 0
        for t0, t1, cpu in data:
            data_ns += t1 - t0
            # a fetch whose CPU was not measured (-1) leaves the step's unknown
            data_cpu_ns = data_cpu_ns + cpu if cpu >= 0 and data_cpu_ns >= 0 else -1
            if t0 < first:
                first = t0
        exposed = colls = rows = ()  # what most steps have of them
        samples = -1
        if rare:
            exposed, colls, rows, loop_ends = [], [], [], []
            for e in rare:
                kind = e[0]
                if kind == COLL:
                    colls.append(e[1:4])
                    if e[4]:  # issued by the training thread, which waited for it: began then
                        exposed.append((e[2], e[3], e[1]))
                        if e[2] < first:
                            first = e[2]
                elif kind == WAIT:
                    exposed.append((e[2], e[3], e[1]))
                    if e[2] < first:
                        first = e[2]
                elif kind == SAMPLES:
                    samples = e[1]
                elif kind == ROWS:
                    rows.append(e[1])
                elif kind == BEGAN:
                    if e[1] < first:
                        first = e[1]
                elif kind == LOOP_FORWARD:
                    loop_ends.append(e[1])
            rows = tuple(rows)
            if loop_ends:  # the model's last forward: the last "forward" not the loop's
                fwd_end = next((t1 for name, _, t1 in reversed(phases)
                                if name == "forward" and t1 not in loop_ends), None)
        if first == _NEVER:
            first = None
        if start is None:
            start = first
            if start is None:
                continue
        if sync_flag is not None:
            synced = 1 if sync_flag else 0
        else:
            synced = 1 if tails or colls else -1
        # a tuple made in one C call (Raw's own constructor is a Python function)
        out.append(_new(Raw, (step, start, end, first, data_ns, data_cpu_ns, phases, exposed,
                              tails, colls, fwd_end, synced, samples, forwards, rows)))
    return out


def sum_steps(raws: list, shift: int) -> list:
    """Each micro-step's intervals (`raws`) summed into a row of STEP_COLUMNS (start_unix: its
    start + `shift`), plus a trailing object with phases that are not fixed columns and, under
    "_comm", {"kind:group": [comm_ns, exposed_ns, count]} (left out when it would only say that
    all of the row's communication was DDP's: the header's comm_key, run_format.py).

    1. backward is the time inside torch.autograd.backward; without it, it runs from the end of
       forward to the optimizer (or to the DDP tail's end when no optimizer step ran);
    2. the optimizer's time excludes forward and backward run inside it (closures: LBFGS,
       Lightning); forward and backward exclude the time they were blocked on communication
       (FSDP's all-gather waits, DDP's tail);
    3. communication: DDP's from its first bucket's launch where that was timed (in flight
       behind backward's compute: not exposed), the tail below, collectives through
       torch.distributed; exposed communication: DDP's tail from its start (the end of backward
       compute; or the launch of the first collective through torch.distributed inside it, a
       Python comm hook's: a hook that runs long before launching, or waits, is that rank's own
       time) to its done, and on to the end of the measured backward, at most RESUME_NS past
       that done (the training thread waits in DDP's reducer until the bucket's future is complete, which can be after
       its callback ran: a busy core held the backend's thread 3.5 ms there; what is later
       than that is the thread waiting for a core: other, the trace reader's rule too),
       blocking collectives and waits on async ones;
    4. compute is the union of the compute phases minus what overlaps exposed communication;
       with no phase at all, everything that is not data or exposed comm counts as compute;
    5. other is what remains of the step; `between_ns`, the part of it before the step's first
       event (what the loop did after the previous rec.step()).
    """
    return [_general_step(r, r.start + shift) for r in raws]


def _general_step(r: Raw, start_unix: int) -> list:
    """One micro-step's row by the rules of sum_steps."""
    start, end = r.start, r.end
    step_ns = end - start
    tails = iv.clip([t[:2] for t in r.ddp_tails], start, end)
    # DDP's synchronization in flight from its first bucket's launch: communication, not exposed
    flights = iv.clip([(t[2], t[0]) for t in r.ddp_tails if len(t) > 2 and t[2] < t[0]],
                      start, end)
    phases = [(n, a, b) for n, a, b in r.phases if b > a]
    measured_bwd = [(a, b) for n, a, b in phases if n == "backward"]
    if r.fwd_end is not None and not any(n == "backward" for n, _, _ in phases):
        opt_starts = [a for n, a, _ in phases if n == "optimizer" and a >= r.fwd_end]
        bwd_end = min(opt_starts) if opt_starts else max((b for _, b in tails), default=None)
        if bwd_end is not None:
            phases.append(("backward", r.fwd_end, bwd_end))
    named: dict[str, int] = {}
    for n, a, b in phases:
        named[n] = named.get(n, 0) + (b - a)
    exposed = [e for e in r.exposed if e[1] > e[0]]
    if tails:
        last_launch = max(a for a, _ in tails)
        last_done = max(b for _, b in tails)
        # a Python comm hook's collective launched inside the tail: before it, the rank ran
        # its own work (the hook, DDP's copy into the bucket), not waiting for the others
        inside = [a for _, a, _ in r.colls if last_launch <= a < last_done]
        if inside:
            last_launch = min(inside)
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
    colls = [c for c in r.colls if c[2] > c[1]]
    comm_ns = iv.length(iv.clip(tails + flights + [(a, b) for _, a, b in colls] + exposed_m,
                                start, end))
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
           other_ns, *fixed, len(tails) + len(colls), r.data_cpu_ns, r.synced, between]
    if tails or colls or exposed:
        by_key = _by_key(tails, colls, exposed, flights)
        if by_key != {DDP_KEY: row[5:7] + [row[11]]}:  # else implied (run_format: comm_key)
            named["_comm"] = by_key
    if r.samples >= 0:  # a smaller last batch: how compute grows with the batch (analyze/whatif)
        named["_samples"] = r.samples
    if named:
        row.append(named)
    return row


def plain_row(item: tuple, shift: int) -> list | None:
    """The row of a micro-step of the common shape straight from its events (StepLog.take's
    tuple), with no intervals made first: forward, backward and optimizer once each, in that
    order inside the step, at most one batch fetched and one DDP tail, nothing else; its start
    in unix ns is its start + `shift`. None for any other shape, which takes the general path
    (interpret, then sum_steps), which gives the same row: tests/test_rows.py gives
    both the same random micro-steps. It exists for its cost: 1.5 us a micro-step against the
    general path's 24 (benchmarks/bench_row_paths.py, docs/performance.md "Making the rows")."""
    phases, data, tails, rare, step, start, end, sync_flag = item
    if rare or start is None or len(phases) != 3 or len(tails) > 1 or len(data) > 1:
        return None
    (n, f0, f1), (m, b0, b1), (k, o0, o1) = phases
    if not (n == "forward" and m == "backward" and k == "optimizer"
            and start <= f0 < f1 <= b0 < b1 <= o0 < o1 <= end):
        return None
    first = f0
    data_ns = data_cpu_ns = 0
    if data:
        t0, t1, data_cpu_ns = data[0]
        data_ns = t1 - t0
        if t0 < first:
            first = t0
    if sync_flag is not None:
        synced = 1 if sync_flag else 0
    else:
        synced = 1 if tails else -1
    step_ns = end - start
    f, bk, o = f1 - f0, b1 - b0, o1 - o0
    o_blocked = exposed_ns = comm_ns = n_comm = 0
    if tails:
        tail = tails[0]
        la, ld = tail[0], tail[1]
        lf = tail[2] if len(tail) > 2 else la  # the first bucket's launch: in flight from there
        if la < start or ld > end or lf < start:
            return None
        n_comm = 1
        if b0 <= la < b1:  # the tail runs on to backward's end, if soon (_general_step, 3.)
            x = ld + RESUME_NS
            if b1 < x:
                x = b1
            if x > ld:
                ld = x
        if lf < la:  # in flight from the first bucket's launch, behind backward's compute
            comm_ns = la - lf
        if ld > la:  # the tail: each phase less what it blocked of it
            exposed_ns = ld - la if ld - la < step_ns else step_ns
            comm_ns += ld - la
            if f1 > la and f0 < ld:
                f -= (f1 if f1 < ld else ld) - (f0 if f0 > la else la)
            if b1 > la and b0 < ld:
                bk -= (b1 if b1 < ld else ld) - (b0 if b0 > la else la)
            if o1 > la and o0 < ld:
                o_blocked = (o1 if o1 < ld else ld) - (o0 if o0 > la else la)
    if data_ns > step_ns:
        data_ns = step_ns
    rest = step_ns - data_ns - exposed_ns
    # the optimizer's column keeps its whole time; compute does not count the tail
    compute_ns = f + bk + o - o_blocked
    if compute_ns > rest:
        compute_ns = rest
    if compute_ns < 0:
        compute_ns = 0
    other_ns = rest - compute_ns if rest > compute_ns else 0
    between = first - start if first - start < other_ns else other_ns
    # its one collective, DDP's tail, is the header's comm_key: no "_comm" (run_format.py)
    return [step, start + shift, step_ns, data_ns, compute_ns, comm_ns, exposed_ns, other_ns,
            f, bk, o, n_comm, data_cpu_ns, synced, between if between > 0 else 0]


def _spans_by_key(items) -> dict[str, list]:
    """{key: [(a, b), ...]} of (key, a, b) items, in their order."""
    out: dict[str, list] = {}
    for k, a, b in items:
        out.setdefault(k, []).append((a, b))
    return out


def _by_key(tails: list, colls: list, exposed: list, flights: list = ()) -> dict:
    """{"kind:group": [comm_ns, exposed_ns, count]} for the step. A key whose collectives all
    blocked (their spans are their blocked spans) is summed once. DDP's synchronization counts
    from its first bucket's launch (`flights`) where that was timed."""
    spans = _spans_by_key([(DDP_KEY, a, b) for a, b in tails] + list(colls))
    blocked = _spans_by_key((k, a, b) for a, b, k in exposed)
    out = {}
    for k in spans.keys() | blocked.keys():
        mine, held = spans.get(k, ()), blocked.get(k)
        more = flights if k == DDP_KEY else ()
        if held is None:
            out[k] = [iv.length([*mine, *more]), 0, len(mine)]
        elif mine == held and not more:
            out[k] = [iv.length(held)] * 2 + [len(mine)]
        else:
            out[k] = [iv.length([*mine, *more, *held]), iv.length(held), len(mine)]
    return out
