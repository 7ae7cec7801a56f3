"""One row of the fault benchmark: a real training run in which chosen ranks are slowed by a known
amount, recorded by gpuscope and profiled by torch.profiler at once. Run it under torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node 4 benchmarks/faults/train.py \\
        --out DIR --parallel ddp --fault forward --ranks 2 --ms 8 [--workers 2] [--steps 24]

Parallelism: ``ddp``; ``accum`` (DDP, gradients synchronized every 4th micro-step with
``no_sync()``); ``fsdp2`` (``fully_shard`` on each layer and the model); ``pipeline`` (4 ranks as
2 data-parallel replicas x 2 pipeline stages: ranks 0, 1 are replica 0's stages, 2, 3 replica
1's; a GPipe of 4 micro-batches written with dist.send / dist.recv, each stage's gradients
all-reduced over its replicas; both stages of a replica read the same batch).

Faults (on ``--ranks``, ``--ms`` milliseconds a step; the other ranks run the same code unslowed):

- ``data``: the rank's Dataset takes ``ms`` longer per batch (spread over its samples), read with
  ``--workers`` loader processes (0: in the training loop);
- ``forward``, ``optimizer``: busy compute (matmuls, not sleep) in the forward / after the
  optimizer's step;
- ``backward``: busy compute inside backward, from a hook on the middle layer's gradient: later
  layers' gradients are ready and DDP's first buckets are in flight (DDP's all-reduce window);
- ``between``: asleep between steps (logging, a checkpoint);
- ``comm``: the rank's link is slow: a DDP comm hook that waits ``ms`` (over its buckets) before
  launching each all-reduce, its compute untouched (ddp and accum only);
- ``intermittent``: ``forward``'s fault in one step of five;
- ``rotating``: step k slows rank k mod N in its forward;
- ``control``: nobody slowed.

Writes DIR/record (gpuscope), DIR/kineto (torch.profiler, two cycles of 5 active steps) and
DIR/truth-rank<r>.json: what was injected on this rank at which steps, and the loop's own
perf_counter around each step and each phase (data, forward, backward, optimizer, between,
gpuscope's rec.step() and the profiler's step call, which writes a trace at the end of each
cycle), and backward's compute: from its start to its last gradient's accumulation (a hook of
its own on every parameter; DDP's all-reduce waits for the other ranks after that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import gpuscope  # noqa: E402

FAULTS = ("control", "data", "forward", "backward", "optimizer", "between", "comm",
          "intermittent", "rotating")
PARALLEL = ("ddp", "accum", "fsdp2", "pipeline")
STAGES, MICRO = 2, 4  # the pipeline runs' stages per replica and micro-batches per step
ACCUM = 4  # micro-steps per optimizer step in the `accum` runs
DIM, HIDDEN, DEPTH, BATCH = 128, 256, 4, 256
_now = time.perf_counter


def busy(ms: float) -> None:
    """Compute for `ms` milliseconds of wall time (a slower rank computes, it does not sleep)."""
    if ms <= 0:
        return
    a = torch.randn(64, 64)
    end = _now() + ms / 1000
    while _now() < end:
        a = torch.tanh(a @ a)


class Samples(Dataset):
    """Synthetic samples; `delay_s` more per sample on a slowed rank (a slow disk or decoder)."""

    def __init__(self, n: int, delay_s: float):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(DIM, generator=g), torch.randint(0, 10, (), generator=g)


class Slowable(nn.Module):
    """An MLP whose forward computes `self.forward_ms` longer and whose backward, at the middle
    layer's gradient, `self.backward_ms` longer (both set per step by the loop)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(),
                                  *[m for _ in range(DEPTH // 2 - 1)
                                    for m in (nn.Linear(HIDDEN, HIDDEN), nn.ReLU())])
        self.tail = nn.Sequential(*[m for _ in range(DEPTH - DEPTH // 2)
                                    for m in (nn.Linear(HIDDEN, HIDDEN), nn.ReLU())],
                                  nn.Linear(HIDDEN, 10))
        self.forward_ms = self.backward_ms = 0.0

    def forward(self, x):
        h = self.head(x)
        if self.backward_ms and h.requires_grad:
            ms = self.backward_ms
            h.register_hook(lambda g: (busy(ms), g)[1])
        out = self.tail(h)
        busy(self.forward_ms)
        return out


class Stage(nn.Module):
    """One pipeline stage of the same MLP (stage 0: the input layer and half the hidden ones;
    stage 1: the rest and the head), slowed as Slowable is, per micro-batch: a step's
    `forward_ms` and `backward_ms` spread over its MICRO micro-batches."""

    def __init__(self, stage: int):
        super().__init__()
        first = [nn.Linear(DIM, HIDDEN), nn.ReLU()] if stage == 0 else []
        hidden = [m for _ in range(DEPTH // 2 - (1 if stage == 0 else 0))
                  for m in (nn.Linear(HIDDEN, HIDDEN), nn.ReLU())]
        last = [nn.Linear(HIDDEN, 10)] if stage == STAGES - 1 else []
        self.layers = nn.Sequential(*first, *hidden, *last)
        self.forward_ms = self.backward_ms = 0.0

    def forward(self, x):
        h = self.layers(x)
        if self.backward_ms and h.requires_grad:
            ms = self.backward_ms / MICRO
            h.register_hook(lambda g: (busy(ms), g)[1])
        busy(self.forward_ms / MICRO)
        return h


def pipeline_step(module: Stage, x, y, stage: int, rank: int) -> tuple[float, float]:
    """One step of a GPipe written by hand: every micro-batch's forward, then every backward;
    activations and gradients sent point to point within the replica. Returns the seconds of
    local forward and backward compute (no sends or receives inside)."""
    fwd = bwd = 0.0
    xs, ys = x.chunk(MICRO), y.chunk(MICRO)
    ins, outs = [], []
    for i in range(MICRO):
        if stage == 0:
            a = xs[i]
        else:
            a = torch.empty(xs[i].shape[0], HIDDEN)
            dist.recv(a, src=rank - 1)
            a.requires_grad_(True)
        t = _now()
        out = module(a)
        fwd += _now() - t
        if stage < STAGES - 1:
            dist.send(out.detach(), dst=rank + 1)
        ins.append(a)
        outs.append(out)
    for i in range(MICRO):
        if stage == STAGES - 1:
            t = _now()
            (F.cross_entropy(outs[i], ys[i]) / MICRO).backward()
        else:
            g = torch.empty_like(outs[i])
            dist.recv(g, src=rank + 1)
            t = _now()
            outs[i].backward(g)
        bwd += _now() - t
        if stage > 0:
            dist.send(ins[i].grad, dst=rank - 1)
    return fwd, bwd


def slow_link_hook(ms_now):
    """A DDP comm hook: before a step's first bucket, wait `ms_now()` ms (a slow link: its
    transfer starts late, its compute untouched); then DDP's own all-reduce of every bucket."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state, bucket):
        if bucket.index() == 0:
            ms = ms_now()
            if ms:
                time.sleep(ms / 1000)
        return default_hooks.allreduce_hook(state, bucket)

    return hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parallel", choices=PARALLEL, default="ddp")
    ap.add_argument("--fault", choices=FAULTS, default="control")
    ap.add_argument("--ranks", default="", help="the slowed ranks, comma-separated")
    ap.add_argument("--ms", type=float, default=0.0, help="ms a step the fault adds")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    slowed = {int(r) for r in args.ranks.split(",") if r.strip()}
    fault = args.fault
    accum = ACCUM if args.parallel == "accum" else 1
    micro_steps = args.steps * accum

    def injected(step: int) -> float:
        """ms this rank's fault adds in optimizer step `step` (0 where it is not slowed)."""
        if fault == "control":
            return 0.0
        if fault == "rotating":
            return args.ms if step % world == rank else 0.0
        if rank not in slowed:
            return 0.0
        if fault == "intermittent":
            return args.ms if step % 5 == 2 else 0.0
        return args.ms

    torch.manual_seed(0)
    pipe = args.parallel == "pipeline"
    if pipe:
        if world % STAGES:
            raise SystemExit(f"a pipeline of {STAGES} stages needs a multiple of {STAGES} ranks")
        replica, stage = divmod(rank, STAGES)
        dp_groups = [dist.new_group(list(range(s, world, STAGES))) for s in range(STAGES)]
        model = wrapped = Stage(stage)
    else:
        model = Slowable()
    if pipe:
        pass
    elif args.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for m in model.modules():
            if isinstance(m, nn.Linear):
                fully_shard(m)
        wrapped = fully_shard(model)
    else:
        wrapped = DDP(model)
    state = {"step": 0}
    if fault == "comm":
        if args.parallel in ("fsdp2", "pipeline"):
            raise SystemExit("the comm fault needs DDP (a comm hook)")
        wrapped.register_comm_hook(None, slow_link_hook(lambda: injected(state["step"])))
    # data: a batch of a slowed rank takes ms longer, spread over its samples
    per_sample = (args.ms / BATCH / 1000) if fault == "data" and rank in slowed else 0.0
    ds = Samples(BATCH * (micro_steps + 2) * world, per_sample)
    # a pipeline's replica reads one stream of batches: its first stage the inputs, its last
    # the targets
    sampler = (DistributedSampler(ds, world // STAGES, rank // STAGES, shuffle=False) if pipe
               else DistributedSampler(ds, world, rank, shuffle=False))
    loader = DataLoader(ds, batch_size=BATCH, num_workers=args.workers, sampler=sampler,
                        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None)
    opt_ms = [0.0]

    class SlowSGD(torch.optim.SGD):
        """SGD whose step computes `opt_ms[0]` longer on a slowed rank (inside the step, as a
        heavier optimizer would: torch's step hooks and the profiler's range hold it)."""

        def step(self, closure=None):
            out = super().step(closure)
            busy(opt_ms[0])
            return out

    opt = SlowSGD(wrapped.parameters(), lr=0.01)
    prof = None
    if not args.no_profile:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        prof = profile(activities=[ProfilerActivity.CPU],
                       schedule=schedule(wait=1, warmup=1, active=5, repeat=2),
                       on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto"),
                                                                use_gzip=True))
        prof.start()
    parts = {k: [] for k in ("step", "data", "forward", "backward", "optimizer", "between",
                             "profiler", "backward_compute", "record")}
    # the truth's own clock on backward's compute: when its last gradient was ready (DDP's
    # all-reduce waits for the other ranks after that; FSDP2's parameters are not hooked)
    grads_ready = [0.0]
    if args.parallel not in ("fsdp2", "pipeline"):
        def ready(_):
            grads_ready[0] = _now()

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(ready)
    added: list[float] = []
    with gpuscope.record(os.path.join(args.out, "record"), model=wrapped) as rec:
        it = iter(rec.data(loader))
        t_step = _now()
        for micro in range(micro_steps):
            step = micro // accum
            state["step"] = step
            ms = injected(step)
            last = micro % accum == accum - 1
            t = _now()
            x, y = next(it)
            parts["data"].append(_now() - t)
            model.forward_ms = ms if fault in ("forward", "intermittent", "rotating") else 0.0
            model.backward_ms = ms if fault == "backward" else 0.0
            if pipe:
                t = _now()
                fwd, bwd = pipeline_step(model, x, y, stage, rank)
                for p in model.parameters():  # data parallel over this stage's replicas
                    dist.all_reduce(p.grad, group=dp_groups[stage])
                    p.grad /= world // STAGES
                parts["forward"].append(fwd)
                parts["backward"].append(_now() - t - fwd)  # its waits for the other stage too
                parts["backward_compute"].append(bwd)
            else:
                sync = contextlib.nullcontext() if last else (
                    wrapped.no_sync() if hasattr(wrapped, "no_sync") else _fsdp_no_sync(wrapped))
                with sync:
                    t = _now()
                    loss = F.cross_entropy(wrapped(x), y)
                    parts["forward"].append(_now() - t)
                    t = _now()
                    grads_ready[0] = t
                    loss.backward()
                    parts["backward"].append(_now() - t)
                    parts["backward_compute"].append(grads_ready[0] - t)
            t = _now()
            if last:
                opt_ms[0] = ms if fault == "optimizer" else 0.0
                opt.step()
                opt.zero_grad(set_to_none=True)
            parts["optimizer"].append(_now() - t)
            t = _now()
            if last and fault == "between" and ms:
                time.sleep(ms / 1000)  # logging, a checkpoint: the host busy elsewhere
            parts["between"].append(_now() - t)
            added.append(ms if last or fault not in ("optimizer", "between") else 0.0)
            t = _now()
            rec.step()
            parts["record"].append(_now() - t)
            t = _now()
            if prof is not None and last:
                prof.step()  # writes a trace at the end of each active cycle: not the step's
            parts["profiler"].append(_now() - t)
            now = _now()
            parts["step"].append(now - t_step)
            t_step = now
    if prof is not None:
        prof.stop()
    with open(os.path.join(args.out, f"truth-rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world": world, "parallel": args.parallel, "fault": fault,
                   "slowed": sorted(slowed), "ms": args.ms, "workers": args.workers,
                   "accumulation": accum, "added_ms": added, "seconds": parts}, fh)
    dist.barrier()
    dist.destroy_process_group()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


if __name__ == "__main__":
    main()
    os._exit(0)  # gloo's threads can abort an interpreter's teardown; everything is written
