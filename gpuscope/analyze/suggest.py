"""Turns the diagnosis into concrete changes, each with the knob, current and proposed value and an
estimate of the step time after the change (all estimates from measured times, in ms)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..report import Jitter, Straggler, Suggestion
from ..thresholds import Thresholds
from ..vocab import COMM, DATA, IMBALANCED, JITTER, MS
from .groups import Groups


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


@dataclass(frozen=True)
class TypicalStep:
    """Median step (ns) over the analysed steps: step time is the slowest rank's, parts are means."""

    step: float
    data: float
    transfer: float
    wait: float
    compute: float
    data_cpu: float
    sync_interval: int

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
    data_cpu = mean("data_cpu_ns") if "data_cpu_ns" in frame else data
    comm = mean("comm_ns")
    synced = float((comm > 0).mean()) if g.keys.size else 0.0
    interval = int(round(1 / synced)) if synced > 0 else 1
    med = lambda a: float(np.median(a)) if a.size else 0.0  # noqa: E731
    return TypicalStep(med(slowest), med(data), med(np.maximum(mean("comm_exposed_ns")
                                                                - mean("wait_ns"), 0)),
                       med(most_wait), med(mean("compute_ns")), med(data_cpu),
                       interval)


def _gain(old_step: float, new_step: float, batch_factor: float = 1.0) -> float:
    """Throughput gain in % when a step of `old_step` becomes `new_step` for batch_factor x samples."""
    return (old_step * batch_factor / max(new_step, 1.0) - 1) * 100


def suggest_data(t: TypicalStep, knobs: dict, th: Thresholds) -> list[Suggestion]:
    """More DataLoader workers sized from load time per batch vs compute time, capped by cores."""
    out: list[Suggestion] = []
    workers = knobs.get("num_workers")
    cpus = max(1, int(knobs.get("cpus_available") or knobs.get("cpu_count") or 1))
    per_rank = max(1, cpus // max(1, int(knobs.get("local_world_size") or 1)))
    cur = int(workers) if isinstance(workers, int) else 0
    if cur == 0:
        load = t.data  # loading runs in the training process: each batch costs its full load time
        io_bound = t.data_cpu < 0.5 * t.data
    else:
        load = cur * t.step  # steady state: `cur` workers deliver one batch per step
        io_bound = False
    need = math.ceil(load / t.busy) if t.busy > 0 else 1
    cap = per_rank * 4 if io_bound else per_rank
    proposed = max(min(max(need, 1), cap, 32), cur + 1)
    est = max(t.busy, load / proposed)
    kind = ("mostly waiting (I/O-like: the training thread used "
            f"{100 * t.data_cpu / max(t.data, 1):.0f}% CPU while loading)" if cur == 0 and io_bound
            else "CPU-bound" if cur == 0 else "")
    why = (f"each step waits {t.data / MS:.1f} ms for data against {t.busy / MS:.1f} ms of other work; "
           f"a batch takes ~{load / MS:.1f} ms to load{' (' + kind + ')' if kind else ''}, so "
           f"{need} worker(s) would hide it; {per_rank} CPU core(s) per rank"
           f"{', and loading is I/O-like, so up to 4 workers per core' if io_bound else ''}")
    out.append(Suggestion("num_workers", cur, proposed, est / MS, why, DATA, _gain(t.step, est)))
    if knobs.get("device", "cpu").startswith("cuda") and not knobs.get("pin_memory"):
        out.append(Suggestion("pin_memory", False, True, (t.step - 0.1 * t.data) / MS,
                              "page-locked host memory makes host-to-device copies faster and lets "
                              ".to(device, non_blocking=True) overlap them with compute", DATA,
                              _gain(t.step, t.step - 0.1 * t.data)))
    if cur > 0 and not knobs.get("persistent_workers"):
        out.append(Suggestion("persistent_workers", False, True, t.step / MS,
                              "workers are restarted every epoch; keeping them avoids the stall "
                              "at each epoch start (per-step time unchanged)", DATA, 0.0))
    if cur > 0 and proposed <= cur:
        pf = knobs.get("prefetch_factor") or 2
        out.append(Suggestion("prefetch_factor", pf, pf * 2, t.step / MS,
                              "more batches in flight per worker absorb uneven load times", DATA, 0.0))
    return out


def suggest_comm(t: TypicalStep, knobs: dict, th: Thresholds) -> list[Suggestion]:
    """Sync gradients less often, or do more work per sync, from measured transfer and compute."""
    out: list[Suggestion] = []
    T, rest = t.transfer, max(t.step - t.transfer, 1.0)
    if T <= 0:
        return out
    # average step with sync every k steps: rest + T/k; want T/k <= target * (rest + T/k)
    k = math.ceil((1 - th.comm_target) * T / (th.comm_target * rest))
    k = max(2, min(k, 32))
    cur = max(1, t.sync_interval)
    est = rest + T / k
    out.append(Suggestion(
        "sync_frequency", f"every {cur} step(s)", f"every {k * cur} steps",
        est / MS,
        f"{T / MS:.1f} ms of each {t.step / MS:.1f} ms step is exposed gradient all-reduce that "
        f"compute does not hide; accumulating gradients with DDP no_sync() for {k - 1} of every {k} "
        f"steps brings it under {th.comm_target:.0%}; the effective global batch grows {k}x "
        "(scale the learning rate or steps accordingly)", COMM, _gain(t.step, est)))
    bs = knobs.get("batch_size")
    used = knobs.get("memory_used_fraction")
    headroom = int(0.9 / used) if used else None  # how many times the batch fits in memory
    if isinstance(bs, int) and bs > 0 and (headroom is None or headroom >= 2):
        m = 4 if T > rest else 2
        if headroom is not None:
            m = min(m, headroom)
        new_step = rest * m + T  # compute scales with the batch, the gradient size does not
        out.append(Suggestion(
            "batch_size", bs, bs * m, new_step / MS,
            f"the all-reduce costs the same {T / MS:.1f} ms whatever the batch; {m}x the per-rank "
            f"batch spreads it over {m}x the samples ("
            + (f"GPU memory peaks at {used:.0%}, so {m}x fits" if used else "if memory allows")
            + "; the global batch grows too)",
            COMM, _gain(t.step, new_step, m)))
    if knobs.get("param_dtype", "float32") == "float32":
        est = t.step - T / 2
        out.append(Suggestion(
            "grad_compression", "none (fp32 gradients)", "bf16_compress_hook", est / MS,
            "a bf16 compression comm hook halves the bytes each all-reduce moves "
            "(ddp.register_comm_hook(None, bf16_compress_hook))", COMM, _gain(t.step, est)))
    return out


def suggest_imbalance(t: TypicalStep, stragglers: list[Straggler], knobs: dict,
                      early: set[int] | None = None) -> list[Suggestion]:
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
        return [Suggestion("straggler", current, "match the median rank", (t.step - t.wait) / MS,
                           why, IMBALANCED, _gain(t.step, t.step - t.wait))]
    out = []
    for s in stragglers:
        est = t.step - t.wait
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
            + (f"; {evidence}" if evidence else "") + f": {fixes[s.cause]}", IMBALANCED,
            _gain(t.step, est)))
    return out


def suggest_jitter(t: TypicalStep, jitter: Jitter) -> list[Suggestion]:
    """Waiting that moves between ranks: no one rank to fix, so even out the per-step work."""
    wait_share = jitter.wait_share
    est = t.step * (1 - wait_share)
    return [Suggestion(
        "rank_jitter", f"waiting moves between ranks ({jitter.steps_share:.0%} of step time)",
        "even out per-step work", est / MS,
        f"ranks lose {wait_share:.1%} of step time waiting for each other, but no rank is late "
        "step after step: look for uneven inputs (sort or bucket samples by length), noisy "
        "neighbours or CPU oversubscription on the hosts, and host work that runs on some steps "
        "(logging, checkpointing, garbage collection)", JITTER, _gain(t.step, est))]


def suggest(found: Findings) -> list[Suggestion]:
    """Suggestions for every bottleneck present (label or secondary), best estimated gain first.

    Jitter gets a suggestion when its steps hold a material share (>= 20%) of the time."""
    frame, labels, th, knobs = found.frame, found.labels, found.thresholds, found.knobs
    if frame.empty:
        return []
    t = typical_step(frame)
    out: list[Suggestion] = []
    if IMBALANCED in labels:
        out += suggest_imbalance(t, found.stragglers, knobs, found.early_ranks)
    if found.jitter.steps_share >= 0.2 and found.jitter.wait_share > 0:
        out += suggest_jitter(t, found.jitter)
    if DATA in labels or found.data_share >= th.data_moderate:
        out += suggest_data(t, knobs, th)
    if COMM in labels:
        out += suggest_comm(t, knobs, th)
    return sorted(out, key=lambda s: -s.gain_pct)
