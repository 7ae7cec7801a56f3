"""Data-bound: the loop waits for its next batch. Suggestions: DataLoader workers (capped by
the cores per rank and what a worker costs per batch), pinned memory, persistent workers, each
with its estimate.
"""

from __future__ import annotations

import numpy as np

import math

from ...results import Suggestion
from ...thresholds import Thresholds
from ...vocab import DATA, MS
from ..findings import TypicalStep, gain


LABEL = DATA


def share(steps, th):
    """The evidence, per step of classify's table: its data share where it is data-bound (at
    least th.data_high of the step waiting for the next batch), else -1."""
    s = steps["data_share"].to_numpy()
    return np.where(s >= th.data_high, s, -1.0)

#: what a DataLoader worker process costs the loop per batch, measured with
#: benchmarks/bench_workers.py (loading that costs nothing, num_workers 1 against 0, on a 2-core
#: VM: 0.34-0.61 ms per batch of 4-256 KB, +0.5-0.75 ms per MB beyond)
WORKER_BATCH_NS = 500_000
WORKER_NS_PER_BYTE = 0.5
#: starting one worker process (fork, first batches), for the per-epoch restart: ~30 ms each with
#: 2 ranks x 4 workers forking at once on the 2-core VM (benchmarks/bench_whatif.py, data case)
WORKER_START_NS = 30_000_000


def worker_cost_ns(knobs: dict) -> float:
    """What one worker process costs the loop per batch (WORKER_* above)."""
    nbytes = knobs.get("batch_bytes")
    return WORKER_BATCH_NS + WORKER_NS_PER_BYTE * (nbytes if isinstance(nbytes, int) else 0)


def suggest_data(t: TypicalStep, knobs: dict, th: Thresholds) -> tuple[list[Suggestion], str]:
    """More DataLoader workers, sized from load time per batch against the rest of the step and
    capped by cores, when that pays for what a worker costs; else why not."""
    out: list[Suggestion] = []
    if knobs.get("dataloader") is False:
        return out, (f"batches come from a {knobs.get('loader', 'plain iterable')}, not a torch "
                     "DataLoader: make loading itself faster, or move it into a DataLoader whose "
                     "worker processes load ahead")
    workers = knobs.get("num_workers")
    cpus = knobs.get("cpus_available") or knobs.get("cpu_count")
    cores_known = isinstance(cpus, int) and cpus > 0  # a trace does not record them
    per_rank = (max(1, cpus // max(1, int(knobs.get("local_world_size") or 1))) if cores_known
                else None)
    cur = int(workers) if isinstance(workers, int) else 0
    cpu_known = t.data_cpu is not None
    cpu_pct = 100 * (t.data_cpu or 0.0) / max(t.data, 1)
    if cur == 0:
        load = t.data  # loading runs in the training process: each batch costs its full load time
        io_bound = cpu_known and t.data_cpu < 0.5 * t.data
    else:
        load = cur * t.step  # steady state: `cur` workers deliver one batch per step
        io_bound = False
    cap = (per_rank * 4 if io_bound else per_rank) if per_rank else 32
    if cur == 0 and cpu_known and not io_bound and per_rank is not None and per_rank < 2:
        return out, (f"loading is CPU-bound ({cpu_pct:.0f}% of a core "
                     "while waiting) and there is 1 CPU core per rank: a worker process would "
                     "take its CPU time from training; make loading cheaper (pre-process once, "
                     "cache decoded samples) or give each rank more cores")
    need = math.ceil(load / t.busy) if t.busy > 0 else 1
    proposed = max(min(max(need, 1), cap, 32), cur + 1)
    cost = worker_cost_ns(knobs)
    est = max(t.busy, load / proposed) + (cost if cur == 0 else 0.0)
    lo, hi = max(t.busy, load / proposed), est
    assumes = [f"a batch keeps loading in ~{load / MS:.1f} ms in a worker"]
    epoch = knobs.get("batches_per_epoch")
    if not knobs.get("persistent_workers") and isinstance(epoch, int) and epoch > 0:
        # workers start again every epoch: its first batches wait for them to fork and load
        restart = (load + proposed * WORKER_START_NS) / epoch
        est += restart
        hi = est + restart
        assumes.append(f"workers restart every epoch of {epoch} batches, ~{restart / MS:.2f} ms "
                       "per step (persistent_workers=True saves it)")
    if not io_bound:  # CPU-bound loading: workers and the training thread share the rank's cores
        busy_cpu = (t.data_cpu if cpu_known else load) if cur == 0 else load
        if cur == 0 and not cpu_known and per_rank is not None:
            assumes.append("the CPU time of loading is not in traces: the upper end assumes it "
                           "is CPU-bound")
        share = min(1.0, busy_cpu / max(t.step, 1.0))
        if per_rank is None:  # unknown: say what the estimate takes instead of a number
            assumes.append(f"CPU cores per rank are not recorded in traces: the estimate takes "
                           f"{proposed + 1} free core(s) per rank (the workers and training)")
        else:
            contention = max(1.0, (proposed * share + 1) / per_rank)
            hi = max(hi, est + t.busy * (contention - 1))
            if contention > 1:
                assumes.append(f"{proposed} worker(s) and training on {per_rank} core(s) slow "
                               f"training up to {contention:.1f}x (upper end)")
    if cur == 0 and (t.step - est < max(0.05 * t.step, 2 * cost)):
        return out, (f"a batch loads in {load / MS:.2f} ms; a worker process costs the loop about "
                     f"{cost / MS:.1f} ms per batch (benchmarks/bench_workers.py), so workers would "
                     "not make the step faster")
    kind = ("mostly waiting (I/O-like: the training thread used "
            f"{cpu_pct:.0f}% CPU while loading)" if cur == 0 and io_bound
            else "CPU-bound" if cur == 0 and cpu_known
            else "its CPU use not measured: traces do not say" if cur == 0 else "")
    why = (f"each step waits {t.data / MS:.1f} ms for data against {t.busy / MS:.1f} ms of other work; "
           f"a batch takes ~{load / MS:.1f} ms to load{' (' + kind + ')' if kind else ''}, so "
           f"{need} worker(s) would hide it"
           + (f"; {per_rank} CPU core(s) per rank" if per_rank else "")
           + f"{', and loading is I/O-like, so up to 4 workers per core' if io_bound else ''}"
           + (f"; a worker costs ~{cost / MS:.1f} ms per batch to hand over, included"
              if cur == 0 else "") + "; assumes: " + "; ".join(assumes))
    out.append(Suggestion("num_workers", cur, proposed, est / MS, why, DATA, gain(t.step, est),
                          (lo / MS, hi / MS)))
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
    return out, ""
