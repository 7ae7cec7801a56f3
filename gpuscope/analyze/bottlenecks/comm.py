"""Comm-bound: exposed transfer (communication no compute hides, less waiting for other ranks).
Suggestions: synchronize gradients less often (accumulation), a larger batch per step, bucket
sizes; each with its estimate from the measured micro-steps (whatif.py).
"""

from __future__ import annotations

import math

from ...results import Suggestion
from ...thresholds import Thresholds
from ...vocab import COMM, MS
from .. import whatif
from ..findings import Findings, TypicalStep, gain, ms_range
from .spec import Bottleneck


LABEL = COMM


def _global_batch(knobs: dict, micro: int, accum: int) -> str:
    world = knobs.get("world_size")
    if not isinstance(world, int) or world < 1:  # never 1 by default
        return f"{micro} x {accum} x (world size unknown)"
    return f"{micro} x {accum} x {world} = {micro * accum * world}"


def suggest_comm(t: TypicalStep, knobs: dict, th: Thresholds,
                 exposed_by_kind: dict | None = None, micro: whatif.MicroSteps | None = None,
                 growth: dict | None = None, grad_share: float | None = None
                 ) -> list[Suggestion]:
    """Sync gradients less often, or do more work per sync, from measured transfer and compute;
    for FSDP, the all-gathers apart. `grad_share`: the part of the exposed communication that
    synchronized gradients (rank_summary.grad_sync_share; None: all but the all-gathers): only
    that part is what syncing less often saves, the loop's own collectives stay."""
    out: list[Suggestion] = []
    T, rest = t.transfer, max(t.step - t.transfer, 1.0)
    if T <= 0:
        return out
    by_kind = exposed_by_kind or {}
    total = sum(by_kind.values())
    gather = T * by_kind.get("all_gather", 0.0) / total if total > 0 else 0.0
    # the part that gradient accumulation avoids (DDP's all-reduce, FSDP's reduce-scatter)
    grads = T * grad_share if grad_share is not None else T - gather
    own = max(T - gather - grads, 0.0)  # the loop's own collectives: every micro-step still
    cur = max(1, t.sync_interval)
    bs = knobs.get("batch_size")
    micro = micro if micro is not None and micro.synced is not None else None
    # the models work on per-rank means of micro-steps; the report's step is the mean of the
    # slowest rank's per step: their estimates are moved by the difference, so a gain is against the step
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
            k = next((m for m in whatif.SYNC_MULTIPLES if m >= k), whatif.SYNC_MULTIPLES[-1])
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
        others = (f"; the loop's own collectives ({own / MS:.1f} ms of transfer per step) stay "
                  "in every micro-step" if own >= 0.05 * T else "")
        out.append(Suggestion(
            "sync_frequency", current, proposed, e.ms / MS,
            f"{grads / MS:.1f} ms of each {t.step / MS:.1f} ms step is gradient synchronization's "
            f"transfer that compute does not hide (exposed, less waiting for slower ranks); "
            f"{what}{others}{batch} (scale the learning "
            f"rate or steps accordingly); assumes: {e.assumes}", COMM, gain(t.step, e.ms),
            ms_range(e)))
    out += _reshard(t, gather)
    out += _bigger_batch(t, knobs, micro, growth, on_step)
    return out + _fewer_bytes(t, knobs, T, gather)


def _reshard(t: TypicalStep, gather: float) -> list[Suggestion]:
    """FSDP's exposed all-gathers (`gather` ns a step): keep the gathered parameters from
    forward to backward, prefetch the next modules'."""
    out: list[Suggestion] = []
    if gather > 0:
        est = t.step - gather / 2
        out.append(Suggestion(
            "reshard_after_forward", True, False, est / MS,
            f"{gather / MS:.1f} ms per step is FSDP all-gather transfer compute does not hide; "
            "keeping the gathered "
            "parameters from forward to backward (fully_shard(..., reshard_after_forward=False)) "
            "saves the backward all-gathers, about half, at the cost of holding them in memory; "
            "prefetching the next modules' all-gathers hides more of them behind compute (FSDP2: "
            "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; FSDP1: "
            "forward_prefetch=True, backward_prefetch=BACKWARD_PRE); "
            "assumes the all-gathers are bandwidth-bound (range: a quarter to all of them)",
            COMM, gain(t.step, est), ((t.step - gather) / MS, (t.step - gather / 4) / MS)))
    return out


def _bigger_batch(t: TypicalStep, knobs: dict, micro, growth: dict | None,
                  on_step) -> list[Suggestion]:
    """A bigger per-rank micro-batch spreads the same collectives (the step's exposed transfer)
    over more samples, where memory allows: estimated on today's global batch (`micro`, `growth`,
    `on_step`: suggest_comm's)."""
    out: list[Suggestion] = []
    T, rest, cur = t.transfer, max(t.step - t.transfer, 1.0), max(1, t.sync_interval)
    bs = knobs.get("batch_size")
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
        # on the report's one basis, the time of today's global batch: a step of m x the batch
        # processes it in 1/m of its time
        per = whatif.Estimate(e.ms / m, e.lo / m, e.hi / m, e.assumes)
        out.append(Suggestion(
            "batch_size", bs, bs * m, per.ms / MS,
            f"the collectives cost the same {T / MS:.1f} ms whatever the batch; {m}x the per-rank "
            f"micro-batch spreads them over {m}x the samples ("
            + (f"GPU memory peaks at {used:.0%}, so {m}x fits" if used else "if memory allows")
            + f"; the global batch grows from {_global_batch(knobs, bs, cur)} to "
            f"{_global_batch(knobs, bs * m, cur)}: a step of it takes ~{e.ms / MS:.1f} ms, "
            f"~{per.ms / MS:.1f} ms per today's batch); the optimizer and the gradient "
            f"communication do not grow with the batch; assumes: {e.assumes}",
            COMM, gain(t.step, per.ms), ms_range(per)))
    return out


def _fewer_bytes(t: TypicalStep, knobs: dict, T: float, gather: float) -> list[Suggestion]:
    """Halve the bytes the collectives move (T ns of exposed transfer a step, `gather` of it
    FSDP's all-gathers): bf16 parameters for FSDP, a bf16 comm hook for DDP, a bf16 all-reduce
    for a loop's own; not on a CPU, where the casts cost more than the bytes save."""
    out: list[Suggestion] = []
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
                "(range: half the gain when latency-bound)", COMM, gain(t.step, est), rng))
        elif knobs.get("model") == "DistributedDataParallel":
            out.append(Suggestion(
                "grad_compression", "none (fp32 gradients)", "bf16_compress_hook", est / MS,
                "a bf16 compression comm hook halves the bytes each all-reduce moves "
                "(ddp.register_comm_hook(None, bf16_compress_hook); NCCL only, "
                "fp16_compress_hook elsewhere); assumes bandwidth-bound transfers (range: half "
                "the gain when latency-bound)", COMM, gain(t.step, est), rng))
        elif knobs.get("model"):  # a model gpuscope saw, not DDP: the loop all-reduces itself
            out.append(Suggestion(
                "grad_compression", "none (fp32 gradients)", "bf16 all-reduce", est / MS,
                "all-reducing the gradients in bf16 (cast before dist.all_reduce, average, cast "
                "back) halves the bytes each all-reduce moves", COMM, gain(t.step, est), rng))
        else:  # a profiler trace: the wrapper is not known
            out.append(Suggestion(
                "grad_compression", "none (fp32 gradients)", "bf16_compress_hook", est / MS,
                "bf16 gradients halve the bytes each all-reduce moves: with DDP, "
                "ddp.register_comm_hook(None, bf16_compress_hook); with your own "
                "dist.all_reduce, cast to bf16 before it", COMM, gain(t.step, est), rng))
    return out


def suggest(found: Findings, t: TypicalStep) -> tuple[list[Suggestion], str]:
    """suggest_comm from the findings, and why none where the typical step has no exposed
    transfer."""
    out = suggest_comm(t, found.knobs, found.thresholds, found.exposed_by_kind, found.micro,
                       found.growth, found.grad_share)
    why = ("" if t.transfer > 0 else "comm-bound steps are a minority: the typical step has no "
           "exposed transfer, so no change to how often gradients sync is suggested")
    return out, why


SPEC = Bottleneck(LABEL, "comm_share", "comm", "the exposed transfer and waiting",
                  lambda t, _: t.transfer + t.wait, lambda found: LABEL in found.labels, suggest)
