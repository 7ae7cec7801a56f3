"""What a step would take after a change: the models behind the suggestions' estimates.

Each model starts from what the run measured per micro-step and says what it had to assume where a
measurement is missing; each returns a point estimate and a range (`Estimate`). Validated by
re-running the training with the change applied: benchmarks/bench_whatif.py.

Measured per micro-step (`MicroSteps`), over ranks: a synchronized micro-step S (the one that
all-reduces, or reduce-scatters, gradients and, with accumulation, steps the optimizer) and, when
the run accumulates, a micro-step that does not synchronize N. What a change does:

- **sync every K micro-steps** (accumulation): a cycle is (K-1) N + S. Without N measured, N is
  S minus the exposed gradient transfer, minus the optimizer and the step's untimed work between
  optimizer steps (logging, the learning rate; both run once per cycle: nanoGPT's 4-9 ms of it a
  step took 0.6 ms a micro-step re-run with 32), minus what the communication hidden behind
  backward cost backward: a shared CPU does the reduction on the cores that compute (alpha ~ 1:
  measured 0.9-1.1 here), a GPU's collectives take a few SMs (alpha ~ 0.1).
- **batch x m**: loading grows m-fold per step; forward and backward grow between 1x (fixed costs:
  weights read, kernel launches, Python) and m x (linear), the point estimate from the rows a
  micro-batch puts through each layer against the device's roofline knee (ROOFLINE_ROWS) unless
  the run measured how its compute grows with the batch; the optimizer, gradient communication and
  its cost to backward do not change with the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import order_stats
from .rowgroups import PerRank, warm_rows

MICRO_PARTS = ("step", "data", "forward", "backward", "optimizer", "comm", "comm_exposed", "wait",
               "other")

#: what communication hidden behind backward costs backward (fraction of its time): (point, lo, hi)
HIDDEN_COST = {"cpu": (1.0, 0.7, 1.1), "cuda": (0.1, 0.0, 0.3)}


@dataclass(frozen=True)
class Estimate:
    ms: float
    lo: float
    hi: float
    assumes: str = ""

    @property
    def range(self) -> tuple[float, float]:
        return (min(self.lo, self.ms), max(self.hi, self.ms))


@dataclass(frozen=True)
class Micro:
    """Mean ns of each part of one kind of micro-step: per rank, then the mean over ranks (the
    step: the slowest rank's mean), with the step's quartiles over rows."""

    step: float
    data: float
    forward: float
    backward: float
    optimizer: float
    comm: float
    comm_exposed: float
    wait: float
    other: float
    q1: float
    q3: float
    rows: int

    @property
    def hidden(self) -> float:
        """Communication that ran behind compute."""
        return max(self.comm - self.comm_exposed, 0.0)

    @property
    def transfer(self) -> float:
        return max(self.comm_exposed - self.wait, 0.0)


@dataclass(frozen=True)
class MicroSteps:
    synced: Micro | None
    unsynced: Micro | None


def _micro(rows: pd.DataFrame, per_rank_means: PerRank | None = None) -> Micro | None:
    if rows.empty:
        return None
    cols = {p: f"{p}_ns" for p in MICRO_PARTS}
    means = per_rank_means or PerRank(rows)
    per_rank = {c: means.mean(c) for c in set(cols.values()) | {"step_ns"} if c in rows}
    vals = {p: float(per_rank[c].mean()) if c in per_rank else 0.0 for p, c in cols.items()}
    vals["step"] = float(per_rank["step_ns"].max())
    q1, q3 = order_stats.percentile(rows["step_ns"].to_numpy(dtype=float), [25, 75])
    return Micro(**vals, q1=float(q1), q3=float(q3), rows=len(rows))


def micro_steps(frame: pd.DataFrame, warmup: int = 1,
                per_rank: PerRank | None = None) -> MicroSteps:
    """From the micro-step table (before cycles are summed): synchronized and not, warm-up left
    out. A micro-step that closes a cycle (cycles.cycle_ends) synchronized; without cycles, the
    rows' own `synced`, and rows that do not say count as synchronized. `per_rank`: means
    of `frame`'s rows, used when every row is kept on one side."""
    if frame.empty:
        return MicroSteps(None, None)
    from .cycles import cycle_ends

    ends = cycle_ends(frame)  # with accumulation: the micro-steps that close a cycle
    if ends is not None:
        synced = ends.astype(int)
    elif "synced" in frame:
        synced = frame["synced"].to_numpy()
    else:
        synced = np.ones(len(frame), dtype=int)
    keep = ~warm_rows(frame, warmup)
    if not keep.any():
        keep[:] = True
    if per_rank is not None and keep.all() and (synced != 0).all():
        return MicroSteps(_micro(frame, per_rank), None)
    kept, synced = frame[keep], synced[keep]
    return MicroSteps(_micro(kept[synced != 0]), _micro(kept[synced == 0]))


#: the smallest batch a growth fit may rest on: on the comm demo, forward took the same time for 1
#: and 2 samples and 66% longer for 4 (bench_whatif.py, comm-batch)
MIN_FIT_SAMPLES = 8


def batch_growth(frame: pd.DataFrame, batch: int | None, mult: int,
                 warmup: int = 1) -> tuple[float, float, float] | None:
    """How forward time grows for `mult` x the batch, fitted on the run's own batches of another
    size (an epoch's smaller last batch, noted as `samples`): forward = a + b x samples, on the
    per-rank medians of each size. Forward, because backward also holds communication's cost.
    (point, lo, hi), or None without at least 2 rows of another size on some rank."""
    if not batch or "samples" not in frame or "forward_ns" not in frame or frame.empty:
        return None
    f = frame[~warm_rows(frame, warmup)]
    n = f["samples"].to_numpy()
    n = np.where(n >= 0, n, batch)
    other = (n != batch) & (n > 0)
    if other.sum() < 2 or (~other).sum() < 2:
        return None
    if n[other].min() < MIN_FIT_SAMPLES:
        return None  # a 1-4 sample batch runs other kernels (GEMV): it does not extrapolate
    f = f.assign(n=n)
    med = f[f["forward_ns"] > 0].groupby(["rank", "n"])["forward_ns"].median().reset_index()
    pts = med.groupby("n")["forward_ns"].mean()
    if len(pts) < 2:
        return None
    x, y = pts.index.to_numpy(dtype=float), pts.to_numpy(dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    at_b = intercept + slope * batch
    if at_b <= 0:
        return None
    g = float(np.clip((intercept + slope * batch * mult) / at_b, 1.0, mult))
    # the fit rests on few small batches: half a step of the fitted growth either way
    lo, hi = max(1.0, g - 0.5 * (g - 1) - 0.05 * mult), min(float(mult), g + 0.5 * (g - 1) + 0.05 * mult)
    return g, lo, hi


def device_kind(knobs: dict) -> str:
    return "cuda" if str(knobs.get("device", "cpu")).startswith("cuda") else "cpu"


#: the part of DDP's in-flight window (its first bucket's launch to the end of backward
#: compute) that costs the step, by device. On a CPU (gloo) what an all-reduce behind backward
#: costs is the cores its thread takes, which neither a record nor a trace measures: a trace's
#: spans of gloo's thread also hold its waits for the other ranks, and gloo runs one bucket at a
#: time. Both sources measure the window the synchronization was in flight for (knobs
#: "hidden_comm": "in_flight"); this part of it is the point. Calibrated on re-runs: the comm
#: demo synchronizing every step, then every 32 (benchmarks/bench_whatif.py, 3 repeats each):
#: the micro-steps without synchronization were shorter than the synchronized ones, less their
#: exposed transfer and optimizer, by 0.44 and 0.50 of the window on a quiet machine and 0.42
#: with 2 cores kept busy. On CUDA not measured: all of it
IN_FLIGHT_RAN = {"cpu": 0.45}
#: the least of the window taken to be in flight (at HIDDEN_COST's low end, 0.7x: a quarter of
#: it costing the step; one re-run set, its window not timed, put the cost near 0.3 of it)
IN_FLIGHT_LEAST = 0.35


def hidden_comm(s: Micro, knobs: dict) -> tuple[float, float, float, str]:
    """(point, least, most) communication hidden behind a synchronized micro-step's backward,
    and what it rests on:
    - measured in the rows (what ran behind compute, a GPU's kernels; knobs without
      "hidden_comm");
    - the window DDP's synchronization was in flight for behind backward (knobs "hidden_comm":
      "in_flight", a CPU trace; or "unmeasured" with rows that hold the window, a record that
      timed its first bucket's launch): IN_FLIGHT_RAN of it as the point, IN_FLIGHT_LEAST of it
      to all of it as the range;
    - not measured (a DDP record that times only the backward's exposed tail, knobs
      "hidden_comm": "unmeasured"): the share of backward DDP's own sampled iterations had
      communication in flight for (knobs "hidden_comm_share"), else anywhere from none of the
      backward to all of it, half of it as the point (even with one gradient bucket, which
      starts when every gradient is ready, a synchronizing backward does more: DDP copies the
      gradients into the bucket, and on a CPU the all-reduce takes cores from the next step's
      work)."""
    mode = knobs.get("hidden_comm")
    if mode == "unmeasured" and s.hidden > 0:
        mode = "in_flight"
    if mode not in ("unmeasured", "in_flight"):
        return s.hidden, s.hidden, s.hidden, ""
    ran = IN_FLIGHT_RAN.get(device_kind(knobs), 1.0)
    taken = (f", {ran:.0%} of it taken to cost the step (what gloo's thread takes from backward "
             "is not measured: calibrated on re-runs that synchronized less)" if ran < 1 else "")
    if mode == "in_flight":
        w = s.hidden
        least = min(IN_FLIGHT_LEAST, ran)
        return (ran * w, least * w, w,
                f"; gradient synchronization was in flight behind backward for {w / 1e6:.1f} ms "
                f"(from its first bucket's launch){taken}: that as the point, {least:.0%} of "
                "the window to all of it as the range")
    bwd = max(s.backward, 0.0)
    share = knobs.get("hidden_comm_share")
    if isinstance(share, float) and 0 < share <= 1:
        return (ran * share * bwd, 0.5 * share * bwd, bwd,
                f"; DDP's own timing of its sampled iterations had gradient communication in "
                f"flight for the last {share:.0%} of backward{taken}"
                ": that as the point, half of the flight to all of backward as the range")
    return (0.5 * bwd, 0.0, bwd, "; how much communication hid behind backward was not "
            "measured (DDP is timed by its backward's tail): from none of the backward to all "
            "of it, half as the point")


def unsynced_step(m: MicroSteps, knobs: dict, grads_share: float = 1.0) -> Estimate:
    """A micro-step that does not synchronize gradients (measured, or from a synchronized one).

    grads_share: the part of the exposed transfer that gradient synchronization is (FSDP's
    all-gathers stay in every micro-step)."""
    if m.unsynced is not None and m.unsynced.rows >= 3:
        u = m.unsynced
        return Estimate(u.step, u.q1, u.q3, "the run's own micro-steps without synchronization")
    s = m.synced
    point, lo_a, hi_a = HIDDEN_COST[device_kind(knobs)]
    between = max(s.other, 0.0)
    base = s.step - grads_share * s.comm_exposed - s.optimizer - between
    h_point, h_least, h_most, why = hidden_comm(s, knobs)
    bwd = max(s.backward, 0.0)
    at = lambda a, h: max(base - min(a * grads_share * h, 0.9 * bwd), 0.05 * s.step)  # noqa: E731
    return Estimate(at(point, h_point), at(hi_a, h_most), at(lo_a, h_least) + between,
                    f"no micro-step without synchronization was recorded: communication hidden "
                    f"behind backward is assumed to cost it {point:.0%} of its time on "
                    f"{device_kind(knobs).upper()} (range {lo_a:.0%}-{hi_a:.0%}){why}; the "
                    f"step's untimed work ({between / 1e6:.1f} ms: logging, the learning rate, "
                    "zero_grad between optimizer steps) taken to run once per cycle (the range "
                    "keeps it in every micro-step)")


def per_micro_cycle(sync: float, unsync: float, k: int) -> float:
    """Mean micro-step of a cycle of k micro-steps, one of them synchronized."""
    return ((k - 1) * unsync + sync) / k


#: the multiples of the current interval a sync-frequency proposal takes: the 1-1.5-2 steps of
#: batch sizes people use. The interval a measurement needs falls anywhere between them, and two
#: measurements of one run (its record and its traces) fell either side of it (31 against 32
#: steps in one of 10 busy runs): a rung rounds the need up, as the worker ladder does
SYNC_MULTIPLES = (2, 3, 4, 6, 8, 12, 16, 24, 32)


def choose_interval(sync: float, unsync: float, target: float, cur: int, cap: int = 32) -> int:
    """The smallest interval K (`cur` times a rung of SYNC_MULTIPLES, at most `cap`) whose
    synchronization costs at most `target` of the mean micro-step:
    (S - N) / K <= target x ((K - 1) N + S) / K."""
    extra = max(sync - unsync, 0.0)
    k = math.ceil((1 - target) * extra / (target * max(unsync, 1.0))) if extra > 0 else 1
    need = math.ceil(k / cur)
    mult = next((m for m in SYNC_MULTIPLES if m >= need and m <= cap), None)
    return (mult if mult is not None else max(2, min(need, cap))) * cur


def sync_estimate(m: MicroSteps, n: Estimate, new_interval: int, cur: int) -> Estimate:
    """ns per current cycle (`cur` micro-steps) when gradients sync every `new_interval`, from
    the synchronized micro-step and `n`, one that does not synchronize (unsynced_step)."""
    s = m.synced
    f = lambda nn_: cur * per_micro_cycle(s.step, nn_, new_interval)  # noqa: E731
    return Estimate(f(n.ms), f(n.lo), f(n.hi), n.assumes)


#: rows (samples, or tokens where the batch is token ids) a micro-batch puts through each dense
#: layer at which its time turns from reading the weights (the same whatever the rows) to
#: computing (linear in them): the device's FLOPs per byte of memory read, times a weight's
#: bytes, over the 2 FLOPs a row costs it. A CPU core: ~50 GFLOP/s fp32 against ~15 GB/s, ~13
#: rows; re-runs on this project's 2-core VM at twice or four times the batch
#: (benchmarks/bench_whatif.py): an MLP fed 2 samples took the same time for 4 (0.83-0.91x), one
#: fed 4 took 1.12-1.24x for 16, nanoGPT fed 32 tokens took 1.8-2.1x for 64: 14 fits all three.
#: A GPU (H100/H200, bf16): ~990 TFLOP/s against 3.3-4.8 TB/s, ~250 rows (not re-run here)
ROOFLINE_ROWS = {"cpu": 14, "cuda": 250}


#: how far the knee may sit from ROOFLINE_ROWS either way (a factor): the range's ends
KNEE_SPREAD = 2.0


def roofline_growth(knobs: dict, mult: int) -> tuple[tuple[float, float, float], str] | None:
    """How forward and backward grow for `mult` x the batch when the run did not measure it:
    the larger of reading the weights and computing on the rows (ROOFLINE_ROWS), from the rows
    a micro-batch holds; the range: the knee KNEE_SPREAD times further (less growth) or nearer
    (more), the low end at most half the point's growth; (point, lo, hi) and what it rests on,
    or None where the batch is not known."""
    batch = knobs.get("batch_size")
    if not isinstance(batch, int) or batch <= 0:
        return None
    tokens = knobs.get("tokens_per_sample")
    rows = batch * (tokens if isinstance(tokens, int) and tokens > 0 else 1)
    knee = ROOFLINE_ROWS[device_kind(knobs)]
    at = lambda k: max(rows * mult, k) / max(rows, k)  # noqa: E731
    # the low end also leaves half the growth to fixed costs a roofline of dense layers leaves
    # out (writing every gradient, DDP's bucket copies: nanoGPT's backward grew 1.3x for its
    # forward's 2x)
    g, hi = at(knee), at(knee / KNEE_SPREAD)
    lo = min(at(knee * KNEE_SPREAD), 1 + (g - 1) / 2)
    what = f"{rows} {'tokens' if rows != batch else 'samples'}"
    return ((g, lo, hi),
            f"assumed {g:.2f}x for {mult}x the batch: {what} a micro-batch, against the ~{knee} "
            f"rows at which a dense layer on a {device_kind(knobs).upper()} turns from reading "
            f"its weights to computing on the rows (range {lo:.2f}x-{hi:.2f}x: that knee "
            f"{KNEE_SPREAD:.0f}x further or nearer, and half the growth left to fixed costs)")


def batch_estimate(m: MicroSteps, knobs: dict, mult: int, cur: int,
                   growth: tuple[float, float, float] | None = None) -> Estimate:
    """ns per current cycle with a `mult` x per-rank batch: loading grows mult-fold, forward and
    backward by `growth` (point, lo, hi; fitted on the run's own batches of other sizes, else
    roofline_growth, else sqrt(mult), 1, mult), the rest stays."""
    s = m.synced
    n = unsynced_step(m, knobs, 1.0)
    point = HIDDEN_COST[device_kind(knobs)][0]
    bwd_pure = max(s.backward - min(point * hidden_comm(s, knobs)[0], 0.9 * s.backward), 0.0)
    comp_s = s.forward + bwd_pure
    if m.unsynced is not None and m.unsynced.rows >= 3:
        comp_n = m.unsynced.forward + m.unsynced.backward
    else:
        comp_n = comp_s
    roof = roofline_growth(knobs, mult) if growth is None else None
    g = growth or (roof[0] if roof else (math.sqrt(mult), 1.0, float(mult)))
    data_s = s.data
    data_n = m.unsynced.data if m.unsynced is not None else data_s

    def cycle(gr: float, n_step: float) -> float:
        sync = s.step + data_s * (mult - 1) + comp_s * (gr - 1)
        unsync = n_step + data_n * (mult - 1) + comp_n * (gr - 1)
        return sync + (cur - 1) * unsync

    assumes = (f"how forward and backward grow with the batch was not measured: {roof[1]}"
               if roof else
               "how forward and backward grow with the batch was not measured: "
               f"assumed {g[0]:.2f}x for {mult}x the batch (range {g[1]:.0f}x fixed cost to "
               f"{g[2]:.0f}x linear)" if growth is None else
               f"forward and backward grow {g[0]:.2f}x for {mult}x the batch, fitted on the run's "
               "own batches of different sizes")
    return Estimate(cycle(g[0], n.ms), cycle(g[1], n.lo), cycle(g[2], n.hi), assumes)
