"""Turns the diagnosis into concrete changes, each with the knob, current and proposed value and an
estimate of the step time after the change (all estimates from measured times, in ms)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..results import Jitter, Straggler, Suggestion
from ..thresholds import Thresholds
from ..vocab import COMM, DATA, HOST, IMBALANCED, JITTER_BOUND, MS
from . import whatif
from .rowgroups import Groups

#: what a DataLoader worker process costs the loop per batch, measured with
#: benchmarks/bench_workers.py (loading that costs nothing, num_workers 1 against 0, on a 2-core
#: VM: 0.34-0.61 ms per batch of 4-256 KB, +0.5-0.75 ms per MB beyond)
WORKER_BATCH_NS = 500_000
WORKER_NS_PER_BYTE = 0.5
#: starting one worker process (fork, first batches), for the per-epoch restart: ~30 ms each with
#: 2 ranks x 4 workers forking at once on the 2-core VM (benchmarks/bench_whatif.py, data case)
WORKER_START_NS = 30_000_000


@dataclass
class Findings:
    """What the analysis found that the suggestions are drawn from."""

    frame: pd.DataFrame             # the analysed rank x step table (wait filled)
    labels: set[str]                # the verdict and every label holding a material share
    thresholds: Thresholds
    knobs: dict
    stragglers: list[Straggler] = field(default_factory=list)
    early_ranks: set[int] = field(default_factory=set)  # ranks that wait for all others
    data_share: float = 0.0         # median step's data share
    jitter: Jitter = field(default_factory=Jitter)
    exposed_by_kind: dict = field(default_factory=dict)  # kind -> mean exposed ns per step
    micro: whatif.MicroSteps | None = None  # per micro-step medians, synchronized or not
    growth: dict = field(default_factory=dict)  # {m: (point, lo, hi)} forward's growth, measured


@dataclass(frozen=True)
class TypicalStep:
    """Median step (ns) over the analysed steps: step time is the slowest rank's, parts are means."""

    step: float
    data: float
    transfer: float
    wait: float
    compute: float
    data_cpu: float | None  # CPU time of loading, None when not measured (traces)
    sync_interval: int
    host: float = 0.0    # GPU idle waiting for the host to launch (GPU traces)
    mean_wait: float = 0.0  # mean over steps of the longest wait (sporadic waiting counts)
    mean_step: float = 0.0  # mean over steps of the slowest rank's step

    @property
    def busy(self) -> float:  # time the step needs besides data
        return max(self.step - self.data, 1.0)


def typical_step(frame: pd.DataFrame) -> TypicalStep:
    g = Groups(frame["step"].to_numpy())

    def mean(col: str) -> np.ndarray:
        return g.mean(frame[col].to_numpy()) if col in frame else np.zeros(g.keys.size)

    slowest = g.max(frame["step_ns"].to_numpy())
    most_wait = g.max(frame["wait_ns"].to_numpy())
    data = mean("data_ns")
    # CPU time while loading: recorded runs measure it; traces do not (-1): unknown stays unknown
    known_cpu = "data_cpu_ns" in frame and bool((frame["data_cpu_ns"] >= 0).all())
    data_cpu = mean("data_cpu_ns") if known_cpu else None
    comm = mean("comm_ns")
    if "micro_steps" in frame:  # rows are optimizer steps of several micro-steps
        interval = int(np.median(frame["micro_steps"].to_numpy()))
    else:  # rows are micro-steps: how often one of them communicated
        synced = float((comm > 0).mean()) if g.keys.size else 0.0
        interval = int(round(1 / synced)) if synced > 0 else 1
    med = lambda a: float(np.median(a)) if a.size else 0.0  # noqa: E731
    transfer = mean("comm_exposed_ns") - mean("wait_ns") - mean("bubble_ns")
    return TypicalStep(med(slowest), med(data), med(np.maximum(transfer, 0)),
                       med(most_wait), med(mean("compute_ns")),
                       med(data_cpu) if data_cpu is not None else None,
                       interval, med(mean("host_ns")),
                       float(most_wait.mean()) if most_wait.size else 0.0,
                       float(slowest.mean()) if slowest.size else 0.0)


def _ms_range(e: "whatif.Estimate") -> tuple[float, float]:
    lo, hi = e.range
    return (lo / MS, hi / MS)


def _gain(old_step: float, new_step: float, batch_factor: float = 1.0) -> float:
    """Throughput gain in % when a step of `old_step` becomes `new_step` for batch_factor x samples."""
    return (old_step * batch_factor / max(new_step, 1.0) - 1) * 100


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
    out.append(Suggestion("num_workers", cur, proposed, est / MS, why, DATA, _gain(t.step, est),
                          (lo / MS, hi / MS)))
    if knobs.get("device", "cpu").startswith("cuda") and not knobs.get("pin_memory"):
        est = t.step - 0.1 * t.data
        out.append(Suggestion("pin_memory", False, True, est / MS,
                              "page-locked host memory makes host-to-device copies faster and lets "
                              ".to(device, non_blocking=True) overlap them with compute; assumes "
                              "a tenth of the data wait is the copy (range: none to a third)", DATA,
                              _gain(t.step, est), ((t.step - 0.3 * t.data) / MS, t.step / MS)))
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


def _global_batch(knobs: dict, micro: int, accum: int) -> str:
    world = knobs.get("world_size") or 1
    return f"{micro} x {accum} x {world} = {micro * accum * world}"


def suggest_comm(t: TypicalStep, knobs: dict, th: Thresholds,
                 exposed_by_kind: dict | None = None, micro: whatif.MicroSteps | None = None,
                 growth: dict | None = None) -> list[Suggestion]:
    """Sync gradients less often, or do more work per sync, from measured transfer and compute;
    for FSDP, the all-gathers apart."""
    out: list[Suggestion] = []
    T, rest = t.transfer, max(t.step - t.transfer, 1.0)
    if T <= 0:
        return out
    by_kind = exposed_by_kind or {}
    total = sum(by_kind.values())
    gather = T * by_kind.get("all_gather", 0.0) / total if total > 0 else 0.0
    grads = T - gather  # the part that gradient accumulation avoids (all-reduce/reduce-scatter)
    cur = max(1, t.sync_interval)
    bs = knobs.get("batch_size")
    micro = micro if micro is not None and micro.synced is not None else None
    # the models work on per-rank medians of micro-steps; the report's step is the median of the
    # slowest rank's: their estimates are moved by the difference, so a gain is against the step
    # it is quoted for and never claims more than the change can save
    shift = 0.0
    if micro is not None:  # the models' own current cycle: its synchronized micro-step and
        # the run's others (measured when it accumulates)
        u = micro.unsynced.step if micro.unsynced is not None else micro.synced.step
        shift = t.step - (micro.synced.step + (cur - 1) * u)

    def on_step(e: whatif.Estimate) -> whatif.Estimate:
        return whatif.Estimate(max(e.ms + shift, 1.0), max(e.lo + shift, 1.0),
                               max(e.hi + shift, 1.0), e.assumes)
    if grads > 0:
        fsdp = "reduce_scatter" in by_kind
        share = grads / T
        if micro is not None:
            unsync = whatif.unsynced_step(micro, knobs, share)
            new = whatif.choose_interval(micro.synced.step, unsync.ms, th.comm_target, cur)
            e = on_step(whatif.sync_estimate(micro, unsync, new, cur))
            k = new // cur
        else:  # no per-micro-step table (a saved report): exposed transfer only
            k = math.ceil((1 - th.comm_target) * grads / (th.comm_target * (rest + gather)))
            k = max(2, min(k, 32))
            est = rest + gather + grads / k
            e = whatif.Estimate(est, est * 0.85, est, "communication hidden behind backward is "
                                "assumed free")
        how = ("model.set_requires_gradient_sync(False) on FSDP" if fsdp
               else "DDP no_sync() (or model.require_backward_grad_sync = False)")
        batch = (f"; the global batch grows {k}x, from {_global_batch(knobs, bs, cur)} to "
                 f"{_global_batch(knobs, bs, k * cur)} samples (per-rank micro-batch x "
                 "accumulation x ranks)" if isinstance(bs, int) and bs > 0
                 else f"; the effective global batch grows {k}x")
        if cur == 1:
            current, proposed = f"every {cur} step(s)", f"every {k * cur} steps"
            what = (f"accumulating gradients with {how} for {k - 1} of every {k} steps brings "
                    f"it under {th.comm_target:.0%}")
        else:
            current = f"accumulation {cur} (sync every {cur} micro-steps)"
            proposed = f"accumulation {k * cur}"
            what = (f"the run accumulates {cur} micro-steps per optimizer step; {k * cur} would "
                    f"bring it under {th.comm_target:.0%} ({how})")
        out.append(Suggestion(
            "sync_frequency", current, proposed, e.ms / MS,
            f"{grads / MS:.1f} ms of each {t.step / MS:.1f} ms step is exposed gradient "
            f"synchronization that compute does not hide; {what}{batch} (scale the learning "
            "rate or steps accordingly); estimate per step of today's global batch; "
            f"assumes: {e.assumes}", COMM, _gain(t.step, e.ms), _ms_range(e)))
    if gather > 0:
        est = t.step - gather / 2
        out.append(Suggestion(
            "reshard_after_forward", True, False, est / MS,
            f"{gather / MS:.1f} ms per step is exposed FSDP all-gather; keeping the gathered "
            "parameters from forward to backward (fully_shard(..., reshard_after_forward=False)) "
            "saves the backward all-gathers, about half, at the cost of holding them in memory; "
            "assumes the all-gathers are bandwidth-bound (range: a quarter to all of them)",
            COMM, _gain(t.step, est), ((t.step - gather) / MS, (t.step - gather / 4) / MS)))
    used = knobs.get("memory_used_fraction")
    headroom = int(0.9 / used) if used else None  # how many times the batch fits in memory
    if isinstance(bs, int) and bs > 0 and (headroom is None or headroom >= 2):
        m = 4 if T > rest else 2
        if headroom is not None:
            m = min(m, headroom)
        if micro is not None:
            e = on_step(whatif.batch_estimate(micro, knobs, m, cur, (growth or {}).get(m)))
        else:
            new_step = rest * m + T  # compute scales with the batch, the gradient size does not
            e = whatif.Estimate(new_step, t.step + (new_step - t.step) * 0.5, new_step,
                                "compute grows linearly with the batch")
        out.append(Suggestion(
            "batch_size", bs, bs * m, e.ms / MS,
            f"the collectives cost the same {T / MS:.1f} ms whatever the batch; {m}x the per-rank "
            f"micro-batch spreads them over {m}x the samples ("
            + (f"GPU memory peaks at {used:.0%}, so {m}x fits" if used else "if memory allows")
            + f"; the global batch grows from {_global_batch(knobs, bs, cur)} to "
            f"{_global_batch(knobs, bs * m, cur)}); the optimizer and the gradient communication "
            f"do not grow with the batch; assumes: {e.assumes}",
            COMM, _gain(t.step, e.ms, m), _ms_range(e)))
    on_cpu = whatif.device_kind(knobs) == "cpu" and knobs.get("device") is not None
    if on_cpu:  # measured: fp16_compress_hook made a gloo/CPU step 9% slower (casts, half sums)
        return out
    hook = str(knobs.get("comm_hook") or "")
    if knobs.get("param_dtype", "float32") == "float32" and "compress" not in hook:
        est = t.step - T / 2
        rng = (est / MS, (t.step - T / 4) / MS)  # latency-bound transfers gain less
        if gather > 0:
            out.append(Suggestion(
                "mixed_precision", "fp32 parameters", "bf16 parameters for communication", est / MS,
                "FSDP's MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) "
                "halves the bytes each all-gather moves; assumes bandwidth-bound transfers "
                "(range: half the gain when latency-bound)", COMM, _gain(t.step, est), rng))
        elif knobs.get("model") == "DistributedDataParallel":
            out.append(Suggestion(
                "grad_compression", "none (fp32 gradients)", "bf16_compress_hook", est / MS,
                "a bf16 compression comm hook halves the bytes each all-reduce moves "
                "(ddp.register_comm_hook(None, bf16_compress_hook); NCCL only, "
                "fp16_compress_hook elsewhere); assumes bandwidth-bound transfers (range: half "
                "the gain when latency-bound)", COMM, _gain(t.step, est), rng))
        elif knobs.get("model"):  # a model gpuscope saw, not DDP: the loop all-reduces itself
            out.append(Suggestion(
                "grad_compression", "none (fp32 gradients)", "bf16 all-reduce", est / MS,
                "all-reducing the gradients in bf16 (cast before dist.all_reduce, average, cast "
                "back) halves the bytes each all-reduce moves", COMM, _gain(t.step, est), rng))
        else:  # a profiler trace: the wrapper is not known
            out.append(Suggestion(
                "grad_compression", "none (fp32 gradients)", "bf16_compress_hook", est / MS,
                "bf16 gradients halve the bytes each all-reduce moves: with DDP, "
                "ddp.register_comm_hook(None, bf16_compress_hook); with your own "
                "dist.all_reduce, cast to bf16 before it", COMM, _gain(t.step, est), rng))
    return out


def suggest_host(t: TypicalStep) -> list[Suggestion]:
    """The GPU waits for the host to launch work: fewer, larger launches."""
    if t.host <= 0:
        return []
    est = t.step - t.host
    return [Suggestion(
        "host_overhead", f"GPU idle {t.host / MS:.1f} ms per step waiting for launches",
        "CUDA graphs / torch.compile", est / MS,
        f"the GPU sits idle {t.host / MS:.1f} ms of each {t.step / MS:.1f} ms step after a kernel "
        "ends and before the host has launched the next: capture the step in CUDA graphs "
        "(torch.compile(mode='reduce-overhead')) or fuse kernels with torch.compile, remove host "
        "syncs from the loop (.item(), .cpu(), printing tensors), or give each launch more work "
        "(a larger batch); assumes every idle gap closes (range: half of them)", HOST,
        _gain(t.step, est), (est / MS, (t.step - 0.5 * t.host) / MS))]


def suggest_imbalance(t: TypicalStep, stragglers: list[Straggler], knobs: dict,
                      early: set[int] | None = None,
                      frame: pd.DataFrame | None = None) -> list[Suggestion]:
    if not stragglers:
        if early:
            names = ", ".join(str(r) for r in sorted(early))
            current = f"rank(s) {names} wait for the rest every step"
            why = (f"rank(s) {names} consistently finish first and wait up to {t.wait / MS:.1f} ms "
                   "for the others, which are all slower: look at what those ranks do less of "
                   "(a smaller data shard, skipped logging or eval) or what slows the rest (shared "
                   "hosts, clocks); DataParallel's master GPU is the classic case")
        else:
            current = "none consistent"
            why = (f"ranks wait up to {t.wait / MS:.1f} ms per step for each other, but too few "
                   "steps show who is late: record more steps to name a straggler")
        est = t.step - t.wait
        return [Suggestion("straggler", current, "match the median rank", est / MS,
                           why, IMBALANCED, _gain(t.step, est), _straggler_range(t, est))]
    out = []
    fixed = without_stragglers(frame, {s.rank for s in stragglers}) if frame is not None else None
    floor = t.step - t.wait  # all the waiting gone: no estimate goes below it
    for s in stragglers:
        est = floor
        rng = _straggler_range(t, est)
        if fixed is not None and fixed[0] < t.step:
            est = max(fixed[0], floor)
            rng = (max(min(fixed[1], fixed[0]), floor) / MS, max(min(fixed[2], t.step), est) / MS)
        where = f" on host {s.host}" if s.host else ""
        part = f"{s.cause} ({s.cause_detail})" if s.cause_detail else s.cause
        fixes = {
            "data": "its data loading is slower: check its storage/decoder, its DataLoader workers "
                    "and whether its shard holds larger samples",
            "compute": "it computes longer: check for uneven inputs (sort or bucket by length), "
                       "extra work on that rank (logging, metrics, eval), other processes on its "
                       "device, GPU clocks and temperature; with DataParallel, switch to DDP",
            "other": "it spends longer outside data and compute: host overhead, Python work or "
                     "synchronization specific to that rank",
        }
        evidence = s.telemetry
        out.append(Suggestion(
            "straggler", f"rank {s.rank}{where}", "match the median rank", est / MS,
            f"the other ranks wait {t.wait / MS:.1f} ms per step for rank {s.rank} (slow in "
            f"{s.slow_steps_share:.0%} of steps); it spends {s.cause_excess_ns / MS:+.1f} ms "
            f"more per step in {part} than the median rank"
            + (f"; {evidence}" if evidence else "") + f": {fixes[s.cause]}; assumes the other "
            "ranks keep their pace and their own step-to-step variation (the step then waits "
            "for the last of them)", IMBALANCED, _gain(t.step, est), rng))
    return out


#: E[max of n standard normals]: how much later than the mean the last of n ranks arrives
_EXPECTED_MAX = {1: 0.0, 2: 0.564, 3: 0.846, 4: 1.029, 5: 1.163}


def without_stragglers(frame: pd.DataFrame, slow: set[int]) -> tuple[float, float, float] | None:
    """(point, lo, hi) ns of a step once the slow ranks keep pace: the other ranks' busy time
    (step minus waiting), its mean plus how late the last of n ranks with that per-step spread
    comes (the synchronous step waits for it); lo: the median, hi: twice the spread's share."""
    if frame.empty or "wait_ns" not in frame:
        return None
    keep = ~np.isin(frame["rank"].to_numpy(), list(slow))  # columns, not a copy of the frame
    if not keep.any():
        return None
    busy = (frame["step_ns"].to_numpy(dtype=float) - frame["wait_ns"].to_numpy(dtype=float))[keep]
    n = int(frame["rank"].nunique())
    c = _EXPECTED_MAX.get(n, math.sqrt(2 * math.log(max(n, 2))))
    sd = float(np.std(busy))
    point = float(np.mean(busy)) + c * sd
    return point, float(np.median(busy)), point + c * sd


def _straggler_range(t: TypicalStep, est: float) -> tuple[float, float]:
    """Without the straggler the others still wait for each other now and then: up to a tenth
    of the step and half the wait the straggler caused."""
    return (est / MS, min(t.step, est * 1.1 + 0.1 * t.wait) / MS)


def suggest_jitter(t: TypicalStep, jitter: Jitter) -> list[Suggestion]:
    """Waiting that moves between ranks: no one rank to fix, so even out the per-step work.
    The estimate takes the typical step less the waiting in jitter steps, per step on average."""
    wait_share = jitter.wait_share
    est = max(t.step - wait_share * t.mean_step, 0.0)
    return [Suggestion(
        "rank_jitter", f"waiting moves between ranks ({jitter.steps_share:.0%} of step time)",
        "even out per-step work", est / MS,
        f"ranks lose {wait_share:.1%} of step time waiting for each other, but no rank is late "
        "step after step: look for uneven inputs (sort or bucket samples by length), noisy "
        "neighbours or CPU oversubscription on the hosts, and host work that runs on some steps "
        "(logging, checkpointing, garbage collection); assumes all the waiting goes (range: "
        "none of it)", JITTER_BOUND, _gain(t.step, est), (est / MS, t.step / MS))]


def suggest(found: Findings) -> list[Suggestion]:
    """Suggestions for every bottleneck present (label or secondary), best estimated gain first.

    Jitter gets a suggestion when its steps hold a material share (>= 20%) of the time."""
    return _suggest(found)[0]


def _suggest(found: Findings) -> tuple[list[Suggestion], dict[str, str]]:
    """(suggestions, label -> why none was made for it)."""
    frame, labels, th, knobs = found.frame, found.labels, found.thresholds, found.knobs
    if frame.empty:
        return [], {}
    t = typical_step(frame)
    out: list[Suggestion] = []
    why_not: dict[str, str] = {}
    if IMBALANCED in labels:
        out += suggest_imbalance(t, found.stragglers, knobs, found.early_ranks, frame)
    if ((JITTER_BOUND in labels or found.jitter.steps_share >= 0.2)
            and found.jitter.wait_share > 0):
        out += suggest_jitter(t, found.jitter)
    if DATA in labels or found.data_share >= th.data_moderate:
        data, why_not[DATA] = suggest_data(t, knobs, th)
        out += data
    if COMM in labels:
        out += suggest_comm(t, knobs, th, found.exposed_by_kind, found.micro, found.growth)
        if t.transfer <= 0:
            why_not[COMM] = ("comm-bound steps are a minority: the typical step has no exposed "
                             "transfer, so no change to how often gradients sync is suggested")
    if HOST in labels:
        out += suggest_host(t)
    return sorted(out, key=lambda s: -s.gain_pct), why_not


def unaddressed(found: Findings, label: str, suggestions: list[Suggestion]) -> str:
    """Why no suggestion addresses the verdict `label` ("" when one does)."""
    if any(s.addresses == label for s in suggestions):
        return ""
    why = _suggest(found)[1].get(label) or "no change with a measurable gain could be estimated"
    return f"no suggestion for {label}: {why}"
