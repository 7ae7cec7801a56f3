"""Data-bound: the loop waits for its next batch. Suggestions: DataLoader workers (as many as
hide the wait, the estimate held by the CPU the rank's cores give training and loading, and what
a worker costs per batch), pinned memory, persistent workers, each with its estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...results import Suggestion
from ...thresholds import Thresholds
from ...vocab import DATA, MS
from ..findings import Findings, TypicalStep, gain
from .spec import Bottleneck


LABEL = DATA


#: what a DataLoader worker process costs the loop per batch, measured with
#: benchmarks/bench_workers.py (loading that costs nothing, num_workers 1 against 0, on a 2-core
#: VM: 0.34-0.61 ms per batch of 4-256 KB, +0.5-0.75 ms per MB beyond)
WORKER_BATCH_NS = 500_000
WORKER_NS_PER_BYTE = 0.5
#: starting one worker process (fork, first batches), for the per-epoch restart: ~30 ms each with
#: 2 ranks x 4 workers forking at once on the 2-core VM (benchmarks/bench_whatif.py, data case)
WORKER_START_NS = 30_000_000


def warm_rest(t: TypicalStep) -> tuple[float, float]:
    """(point, low end) of the rest of the step once the loop no longer leaves it for the load
    (WARM_WHEN_LOAD_OVER_BUSY): as fast as its fastest tenth of steps; those start cold too, so
    the low end goes as far again below them as they are below the mean (to half, no lower)."""
    busy = t.busy
    warm = min(busy, t.busy_fast) if t.busy_fast is not None else busy
    return warm, max(warm - (busy - warm), 0.5 * warm)


def worker_cost_ns(knobs: dict) -> float:
    """What one worker process costs the loop per batch (WORKER_* above)."""
    nbytes = knobs.get("batch_bytes")
    return WORKER_BATCH_NS + WORKER_NS_PER_BYTE * (nbytes if isinstance(nbytes, int) else 0)


#: what the training thread pays to take a batch the workers have ready when the rank has a
#: core for each of them and two to spare (a queue's get and the tensors' handles; the pin
#: thread pins): a tenth of a millisecond, an assumption this machine cannot measure (2 cores:
#: there the workers take the training's cores, and WORKER_BATCH_NS is what it pays, measured
#: in benchmarks/bench_workers.py); the range's upper end keeps the measured figure
HANDOVER_SPARE_NS = 100_000
#: a loop that loads in its own thread leaves its work for the load every step; the work then
#: starts on cold caches (and a core woken from its idle state): measured on this project's
#: 2-core VM, a 1.7 ms step of a small model ran in 2.9-4.3 ms after 30 ms spent elsewhere in
#: the same thread; on an H200, a launch-bound step's rest took 4.85 ms with the Dataset
#: sleeping in the thread against 3.56 ms with 8 workers (../shared/gpu-h200/data_workers*).
#: With workers the loop runs step after step, as its fastest steps do now: the point takes the
#: rest of the step at its 10th percentile, the range as far again below (warm_rest), when the
#: load is at least as long as the rest (the thread is away most of the step)
WARM_WHEN_LOAD_OVER_BUSY = 1.0


#: at each epoch's start the workers' queue is empty, even with persistent workers: the first
#: batch waits at least its whole load, with nothing loaded ahead of it. Measured on this
#: project's 2-core VM (the demo's data scenario, 32 batches an epoch of ~32 ms each, 2 ranks):
#: the epoch's first step took 51-53 ms with 4 workers a rank and 65-128 ms with 12 against
#: ~5 ms steps, 1.5-4x a batch's load. The point takes one load per epoch, the range's upper
#: end EPOCH_REFILL_MOST of them
EPOCH_REFILL_MOST = 4.0


def _epoch_refill(knobs: dict, load: float) -> tuple[float, float, str]:
    """(ns a step for the point, for the upper end, in words) that each epoch's empty queue
    adds, spread over the epoch's batches; nothing where the epoch's length is not known."""
    epoch = knobs.get("batches_per_epoch")
    if not isinstance(epoch, int) or epoch <= 0:
        return 0.0, 0.0, ""
    per = load / epoch
    return per, EPOCH_REFILL_MOST * per, (
        f"each epoch's first batch waits for its whole load (~{load / MS:.1f} ms once per "
        f"{epoch} batches, ~{per / MS:.2f} ms a step; range: up to {EPOCH_REFILL_MOST:g}x, "
        "workers starting their first batches at once)")


#: worker counts proposed: the smallest of these that hides the wait (two sources of one run
#: measure 6.9 and 7.1 workers' worth of loading: both propose 8) ...
WORKER_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: ... to within this share of the rest of the step: one more step of the ladder would buy less
#: than the noise between two readings of one run (its record and its trace measured 7.9 and 8.1
#: workers' worth, and proposed 8 and 12 without it), at the memory and CPU of the extra workers
HIDE_SLACK = 0.05


def cores_per_rank(knobs: dict) -> tuple[int | None, str]:
    """(CPU cores per rank, where that comes from): the cores this process may use over the
    ranks of its host (a record's, or a trace's from gpuscope.record beside the profiler),
    else None."""
    cpus = knobs.get("cpus_available") or knobs.get("cpu_count")
    if not isinstance(cpus, int) or cpus <= 0:
        return None, ""
    local = knobs.get("local_world_size")
    local = local if isinstance(local, int) and local > 0 else 1
    return max(1, cpus // local), f"{cpus} core(s) for {local} rank(s) on the host"


def loading_cpu(t: TypicalStep, knobs: dict) -> tuple[float | None, str]:
    """(the share of a batch's load time that uses the CPU, how it is known): measured by the
    recorder (the training thread's CPU time while it waited), told by one beside the profiler
    (a trace's gpuscope facts), or in a trace the torch ops inside the wait (a lower bound: the
    loader's Python, a decoder's, is not in a trace); None when nothing says."""
    if t.data <= 0:
        return None, ""
    if t.data_cpu is not None:
        return min(t.data_cpu / t.data, 1.0), "measured"
    told = knobs.get("data_cpu_share")
    if isinstance(told, (int, float)) and 0 <= told <= 1:
        return float(told), "measured by gpuscope.record beside the profiler"
    if t.data_ops is not None:
        return (min(t.data_ops / t.data, 1.0),
                "its torch ops in the trace; Python work in it (a decoder) is not in a trace")
    return None, ""


#: a need within this share of a rung's edge is said to sit on it
EDGE = 0.10


def _edge(need: float, proposed: int, step_with, cores) -> str:
    """Where the measured need sits near the edge between two rungs of the ladder (another
    reading of the same run, or its traces, may land on the other side), the other rung's
    count and estimate, so that two reports a rung apart tell one story; "" elsewhere."""
    i = WORKER_COUNTS.index(proposed) if proposed in WORKER_COUNTS else -1
    if i < 0:
        return ""
    lower = WORKER_COUNTS[i - 1] if i > 0 else None
    upper = WORKER_COUNTS[i + 1] if i + 1 < len(WORKER_COUNTS) else None
    edge = proposed * (1 + HIDE_SLACK)  # past this the next rung is proposed
    if upper is not None and need >= edge * (1 - EDGE):
        other = upper
    elif lower is not None and need <= lower * (1 + HIDE_SLACK) * (1 + EDGE):
        other = lower
    else:
        return ""
    return (f"; {need:.1f} workers' worth sits near the edge between {min(other, proposed)} "
            f"and {max(other, proposed)} workers (another reading of this run may propose "
            f"{other}: ~{step_with(other, cores) / MS:.1f} ms/step)")


@dataclass(frozen=True)
class WorkerModel:
    """What the workers' estimate is made of (suggest_data): today's workers and the count
    proposed, a batch's load time, the rest of the step as it is (`busy`) and as warm as the
    loop's fastest steps say (`warm`, the range's `warm_least`), whether the rank has cores to
    spare beside the workers, what the training thread pays a batch (`cost`; `worker`: a
    worker's hand-over on 2 cores), the cores per rank and the share of loading that uses the
    CPU, each with where it comes from (None: not known)."""
    cur: int
    proposed: int
    load: float
    busy: float
    warm: float
    warm_least: float
    spare: bool
    cost: float
    worker: float
    cores: int | None
    cores_how: str
    f: float | None
    f_how: str

    @property
    def point_cores(self) -> int:
        """The cores the point estimate takes: the known ones, else one (the least a rank has)."""
        return self.cores if self.cores is not None else 1

    def step(self, w: int, c: int | None, b: float | None = None, h: float | None = None,
             deliver: float | None = None) -> float:
        """The step with `w` workers on `c` cores a rank (None: as many as they need): the
        longest of the rest of the step `b` (warm) plus the hand-over `h` (cost), a batch's
        `deliver` time (load) over the workers plus the hand-over, and the CPU the rank needs
        over its cores."""
        b = self.warm if b is None else b
        h = self.cost if h is None else h
        deliver = self.load if deliver is None else deliver
        s = max(b + h, deliver / w + h)
        if c is not None and self.f is not None:
            s = max(s, (b + self.f * self.load + h) / c)
        return s


def worker_model(t: TypicalStep, knobs: dict, cur: int) -> tuple[WorkerModel, float]:
    """(The workers' model for a run with `cur` workers today, how many workers' worth of
    loading its data wait holds)."""
    cores, cores_how = cores_per_rank(knobs)
    if cur == 0:
        load = t.data  # loading runs in the training process: each batch costs its full load time
        f, f_how = loading_cpu(t, knobs)
    else:
        load = cur * t.step  # steady state: `cur` workers deliver one batch per step
        f, f_how = None, ""  # the workers' own CPU: not measured by either source
    busy = t.busy
    worker = worker_cost_ns(knobs) if cur == 0 else 0.0  # what a worker costs, 2 cores
    need = load / busy if busy > 0 else 1.0
    enough = need / (1 + HIDE_SLACK)
    proposed = max(next((n for n in WORKER_COUNTS if n >= enough), WORKER_COUNTS[-1]), cur + 1)
    proposed = min(proposed, WORKER_COUNTS[-1])
    # a core for each worker and two to spare: the training thread keeps its core, takes a
    # ready batch cheaply, and (loading in its own thread today) no longer starts its work cold
    # after each load (WARM_WHEN_LOAD_OVER_BUSY); else its core is shared with the workers
    spare = cur == 0 and cores is not None and cores >= proposed + 2
    warm = warm_least = busy
    if spare and t.busy_fast is not None and load >= WARM_WHEN_LOAD_OVER_BUSY * busy:
        warm, warm_least = warm_rest(t)
    cost = HANDOVER_SPARE_NS if spare else worker  # what the training thread pays a batch
    return WorkerModel(cur, proposed, load, busy, warm, warm_least, spare, cost, worker, cores,
                       cores_how, f, f_how), need


def _worker_assumes(knobs: dict, m: WorkerModel) -> tuple[list[str], float]:
    """(What the workers' estimate assumes, in words; the ns a step that restarting the workers
    every epoch adds to its upper end)."""
    assumes = [f"a batch keeps loading in ~{m.load / MS:.1f} ms in a worker"]
    if m.warm < m.busy:
        assumes.append(f"with the load out of the training thread, the rest of the step runs as "
                       f"in today's fastest tenth of steps, ~{m.warm / MS:.1f} ms against "
                       f"{m.busy / MS:.1f} ms on average (a thread that leaves its work for the "
                       "load finds its caches cold; range: as far again below, to the average)")
    if m.spare:
        assumes.append(f"the training thread takes a ready batch in ~{m.cost / MS:.1f} ms "
                       f"({m.cores} cores a rank leave two to spare beside {m.proposed} workers; "
                       f"the range's upper end: {m.worker / MS:.1f} ms, what a worker costs the "
                       "loop on 2 cores, with the rest of the step as it is)")
    if m.f is not None:
        assumes.append(f"loading uses the CPU {m.f:.0%} of its time ({m.f_how})")
    if m.cores is not None:
        assumes.append(f"{m.cores} CPU core(s) per rank ({m.cores_how})")
    else:
        assumes.append("CPU cores per rank are not in the trace: one per rank (the least a rank "
                       "has; the range's low end: as many as the workers need)")
    if m.f is None and m.cur == 0:
        assumes.append("how much of loading uses the CPU is not known: the workers are taken "
                       "to have the cores they need")
    restart = 0.0
    epoch = knobs.get("batches_per_epoch")
    persistent = knobs.get("persistent_workers")
    if not persistent:  # workers start again every epoch: its first batches wait for them
        if isinstance(epoch, int) and epoch > 0:
            restart = (m.load + m.proposed * WORKER_START_NS) / epoch
            assumes.append(f"persistent_workers=True (else they restart every epoch of {epoch} "
                           f"batches: ~{restart / MS:.2f} ms more per step, the range's upper "
                           "end)")
        else:
            assumes.append("persistent_workers=True (else they restart every epoch)")
    return assumes, restart


def _workers_would_not_help(knobs: dict, m: WorkerModel, est: float) -> str:
    """Why more workers are not proposed: the rank's cores are busy, or a worker costs the loop
    more than the load it takes over."""
    if m.f is not None and m.cores is not None and \
            (m.busy + m.f * m.load + m.cost) / m.cores >= est - 1:
        return (f"loading uses the CPU {m.f:.0%} of its time and there is {m.cores} CPU core per "
                f"rank ({m.cores_how}): worker processes would take their CPU time from "
                "training; make loading cheaper (pre-process once, cache decoded samples) or "
                "give each rank more cores")
    return (f"a batch loads in {m.load / MS:.2f} ms; a worker process costs the loop about "
            f"{worker_cost_ns(knobs) / MS:.1f} ms per batch (benchmarks/bench_workers.py) "
            "and the rank's CPU, so workers would not make the step faster")


def suggest_data(t: TypicalStep, knobs: dict, th: Thresholds) -> tuple[list[Suggestion], str]:
    """More DataLoader workers, as many as hide the data wait, with an estimate that accounts
    for the CPU their loading takes from the rank's cores; else why not.

    Steady state, workers kept across epochs: a step takes the longest of the rest of the step
    (busy) plus what handing a batch over costs the training thread (h), a batch's load time
    over the workers (L / W), and the CPU the rank needs over its cores, (busy + f L + h) / C,
    f the share of loading that uses the CPU. Cores per rank and f come from the record; a
    trace holds them only where gpuscope.record ran beside the profiler: otherwise the estimate
    takes one core per rank (the least a rank has) and f from the trace's own ops inside the
    wait, and says so; the range's low end is as many cores as the workers need."""
    out: list[Suggestion] = []
    if knobs.get("dataloader") is False:
        return out, (f"batches come from a {knobs.get('loader', 'plain iterable')}, not a torch "
                     "DataLoader: make loading itself faster, or move it into a DataLoader whose "
                     "worker processes load ahead")
    workers = knobs.get("num_workers")
    cur = int(workers) if isinstance(workers, int) else 0
    m, need = worker_model(t, knobs, cur)
    proposed, load, busy = m.proposed, m.load, m.busy
    est = m.step(proposed, m.point_cores)
    # the low end: the rest of the step as warm as the spread says, the workers delivering as
    # fast as the training needs (a worker's load does not start cold, nor pin: the pin thread
    # does); the high end: the rest as it is, a batch handed over at the 2-core cost
    lo = m.step(proposed, None, m.warm_least, deliver=0.0 if m.spare else load)
    hi = max(est, m.step(proposed, m.point_cores, busy, m.worker))
    assumes, restart = _worker_assumes(knobs, m)
    hi += restart  # workers restarted every epoch: their first batches wait
    refill, refill_most, said = _epoch_refill(knobs, load)
    steady = est
    if said:
        est, lo, hi = est + refill, lo + refill, hi + refill_most
        assumes.append(said)
    if est >= t.step - max(0.05 * t.step, 2 * m.cost):
        return out, _workers_would_not_help(knobs, m, est)
    why = (f"each step waits {t.data / MS:.1f} ms for data against {busy / MS:.1f} ms of other "
           f"work: {need:.1f} workers' worth of loading (a batch takes ~{load / MS:.1f} ms), so "
           f"{proposed} hide it" + (f" (to within {HIDE_SLACK:.0%} of the step)"
                                     if proposed < need else "")
           + (f"; the rank's CPU holds the step at ~{steady / MS:.1f} ms (training, loading and "
              f"the hand-over on {m.point_cores} core(s))" if m.f is not None
              and m.cores is not None and steady > m.step(proposed, None) + 0.05 * MS else "")
           + (f"; a worker costs ~{m.cost / MS:.1f} ms per batch to hand over, included"
              if cur == 0 and not m.spare else "")
           + _edge(need, proposed, lambda w, c: m.step(w, c) + refill, m.point_cores)
           + "; assumes: " + "; ".join(assumes))
    out.append(Suggestion("num_workers", cur, proposed, est / MS, why, DATA, gain(t.step, est),
                          (lo / MS, hi / MS)))
    return out + _loader_settings(t, knobs, cur, proposed), ""


def _loader_settings(t: TypicalStep, knobs: dict, cur: int, proposed: int) -> list[Suggestion]:
    """The loader's other settings beside its workers: pinned memory on a GPU, workers kept
    across epochs, more batches in flight per worker when more workers are not proposed."""
    out: list[Suggestion] = []
    if knobs.get("device", "cpu").startswith("cuda") and not knobs.get("pin_memory"):
        est = t.step - 0.1 * t.data
        out.append(Suggestion("pin_memory", False, True, est / MS,
                              "page-locked host memory makes host-to-device copies faster and lets "
                              ".to(device, non_blocking=True) overlap them with compute; assumes "
                              "a tenth of the data wait is the copy (range: none to a third)", DATA,
                              gain(t.step, est), ((t.step - 0.3 * t.data) / MS, t.step / MS)))
    if cur > 0 and not knobs.get("persistent_workers"):
        out.append(Suggestion("persistent_workers", False, True, t.step / MS,
                              "workers are restarted every epoch; keeping them avoids the stall "
                              "at each epoch start (per-step time unchanged)", DATA, 0.0,
                              (t.step / MS, t.step / MS)))
    if cur > 0 and proposed <= cur:
        pf = knobs.get("prefetch_factor") or 2
        out.append(Suggestion("prefetch_factor", pf, pf * 2, t.step / MS,
                              "more batches in flight per worker absorb uneven load times; the "
                              "typical step stays, the slow ones shrink (range: up to the data "
                              "wait saved)", DATA, 0.0, ((t.step - t.data) / MS, t.step / MS)))
    return out


def asks(found: Findings) -> bool:
    """Data-bound, or a data wait of the moderate share or more."""
    return LABEL in found.labels or found.data_share >= found.thresholds.data_moderate


SPEC = Bottleneck(LABEL, "data_share", "data_high", "the data wait", lambda t, _: t.data, asks,
                  lambda found, t: suggest_data(t, found.knobs, found.thresholds))
