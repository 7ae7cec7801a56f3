"""A small DDP training run with one bottleneck injected on purpose; run it under torchrun.

Scenarios (2 ranks, gloo on CPU, a few seconds each):

- ``data``: a Dataset that takes 2 ms per sample to load, read with num_workers=0;
- ``comm``: a wide model (~8M parameters) fed a batch of 2, so the gradient all-reduce dominates;
- ``imbalanced``: rank ``--slow-rank``'s forward runs an extra matmul loop every step (as a rank
  with longer inputs or a slower device would);
- ``compute``: a balanced compute-heavy MLP (large batch, few parameters) with in-memory data.

``--profile DIR`` also writes torch.profiler (Kineto) traces there with tensorboard_trace_handler;
``--no-record`` runs the same loop without gpuscope (for the overhead benchmark). The knobs gpuscope
suggests can be set to re-run a scenario with a suggestion applied (benchmarks/bench_whatif.py):
``--num-workers``, ``--batch-size``, ``--sync-every K`` (gradient accumulation: DDP ``no_sync()`` and
no optimizer step on K-1 of every K micro-steps), ``--comm-hook bf16|fp16``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, TensorDataset

from gpuscope.demo import SCENARIOS  # absolute: launch.py runs this file as a script


class SlowDataset(Dataset):
    """Synthetic samples that take `delay_s` each to 'load' (like a slow disk or decoder)."""

    def __init__(self, n: int, dim: int, delay_s: float):
        self.n, self.dim, self.delay_s = n, dim, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), torch.randint(0, 10, (), generator=g)


def mlp(dim: int, hidden: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    layers.append(nn.Linear(hidden, 10))
    return nn.Sequential(*layers)


EPOCH_STEPS = 32  # the dataset holds this many batches per rank; longer runs take more epochs


def epoch_samples(batch: int, steps: int, world: int) -> int:
    """Samples in the dataset: up to EPOCH_STEPS full batches per rank, and on runs that reach an
    epoch's end a last batch of half the size, as most datasets have (gpuscope fits how compute
    grows with the batch on it)."""
    if steps <= EPOCH_STEPS:
        return batch * steps * world
    return (batch * EPOCH_STEPS + batch // 2) * world


def build(scenario: str, steps: int, world: int, batch_size: int | None = None):
    """Model, dataset and loader settings for one scenario (`batch_size` overrides its batch)."""
    if scenario == "data":
        model, dim, batch = mlp(64, 256, 2), 64, batch_size or 16
        ds = SlowDataset(epoch_samples(batch, steps, world), dim, delay_s=0.002)
    elif scenario == "comm":
        model, dim, batch = mlp(256, 1400, 4), 256, batch_size or 2
        n = epoch_samples(batch, steps, world)
        ds = TensorDataset(torch.randn(n, dim), torch.randint(0, 10, (n,)))
    elif scenario in ("compute", "imbalanced"):
        # many FLOPs per parameter: compute dominates and the all-reduce stays small
        model, dim, batch = mlp(128, 128, 3), 128, batch_size or 4096
        n = epoch_samples(batch, steps, world)
        ds = TensorDataset(torch.randn(n, dim), torch.randint(0, 10, (n,)))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}; pick one of {', '.join(SCENARIOS)}")
    return model, ds, batch


def extra_work(ms: float, device=None) -> None:
    """Busy compute for about `ms` milliseconds (matmuls, not sleep: a real slow rank computes)."""
    a = torch.randn(256, 256, device=device)
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
        if a.is_cuda:
            torch.cuda.synchronize()


class Slowed(nn.Module):
    """`inner` whose forward also computes for `ms` more milliseconds (0: not slowed)."""

    def __init__(self, inner: nn.Module, ms: float):
        super().__init__()
        self.inner, self.ms = inner, ms

    def forward(self, x):
        out = self.inner(x)
        if self.ms:
            extra_work(self.ms, x.device)
        return out


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=SCENARIOS, default="data")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--run-dir", default="runs/demo")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--extra-ms", type=float, default=40.0)
    ap.add_argument("--profile", metavar="DIR", help="also write torch.profiler traces here")
    ap.add_argument("--no-record", action="store_true", help="run without gpuscope")
    ap.add_argument("--timings", metavar="FILE", help="append this rank's step times (JSON line)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per local rank)")
    ap.add_argument("--backend", default=None, help="gloo (default on CPU) or nccl (on CUDA)")
    ap.add_argument("--tensorboard", action="store_true",
                    help="also write per-step scalars for TensorBoard's Scalars tab")
    ap.add_argument("--batch-size", type=int, help="per-rank batch (default: the scenario's)")
    ap.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--sync-every", type=int, default=1,
                    help="synchronize gradients and step the optimizer every K micro-steps")
    ap.add_argument("--comm-hook", choices=("bf16", "fp16"), help="DDP gradient compression")
    ap.add_argument("--live-every", type=int, default=0, metavar="N",
                    help="live diagnosis every N steps (rank 0 logs a line)")
    return ap.parse_args(argv)


def _loader(ds, sampler, batch: int, workers: int) -> DataLoader:
    """The rank's DataLoader: whole batches sliced from an in-memory dataset (no per-sample
    collate), else per sample; workers kept across epochs, as the num_workers suggestion's
    estimate takes them."""
    if isinstance(ds, TensorDataset):  # in memory: slice whole batches, no per-sample collate
        return DataLoader(ds, sampler=BatchSampler(sampler, batch, drop_last=False),
                          batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    return DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                      persistent_workers=workers > 0)


class _LoopClock:
    """The loop's own clock (--timings): work with no communication inside, to check a named
    straggler by: forward, backward's compute to its last gradient, the optimizer step."""

    def __init__(self, model, on: bool):
        self.forward: list[float] = []
        self.backward: list[float] = []
        self.optimizer: list[float] = []
        self.grads_ready = 0.0
        if on:
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, _) -> None:
        self.grads_ready = time.perf_counter()


def _ddp(model, cuda: bool):
    """(device, the model in DDP): one GPU per local rank (several ranks may share one GPU with
    gloo), else the CPU."""
    if not cuda:
        return torch.device("cpu"), DDP(model)
    local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    return device, DDP(model.to(device), device_ids=[local])


def _compress(ddp, hook: str | None) -> None:
    """DDP's gradient compression (--comm-hook bf16 / fp16)."""
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, getattr(default_hooks, f"{hook}_compress_hook"))


def _profiler(out_dir: str | None, cuda: bool):
    """torch.profiler, started, when traces are asked for (--profile DIR): two cycles of 5
    active steps, one gzip trace file per rank and cycle; else None."""
    if not out_dir:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
                   schedule=schedule(wait=1, warmup=1, active=5, repeat=2),
                   on_trace_ready=tensorboard_trace_handler(out_dir, use_gzip=True))
    prof.start()
    return prof


def main(argv=None) -> None:
    args = _parse(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cuda = args.device.startswith("cuda")
    dist.init_process_group(args.backend or ("nccl" if cuda else "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, ds, batch = build(args.scenario, args.steps, world, args.batch_size)
    slow = args.scenario == "imbalanced" and rank == args.slow_rank
    model = Slowed(model, args.extra_ms if slow else 0.0)
    device, ddp = _ddp(model, cuda)
    # after record() starts, so that gpuscope times the hook's buckets
    compress = functools.partial(_compress, ddp, args.comm_hook)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    loader = _loader(ds, sampler, batch, args.num_workers)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    prof = _profiler(args.profile, cuda)
    micro = [0]
    clock = _LoopClock(ddp.module, bool(args.timings))

    def train_step(x, y):
        if cuda:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        micro[0] += 1
        sync = micro[0] % args.sync_every == 0
        with contextlib.nullcontext() if sync else ddp.no_sync():
            t0 = time.perf_counter()
            out = ddp(x)
            clock.forward.append(time.perf_counter() - t0)
            loss = loss_fn(out, y)
            clock.grads_ready = t0 = time.perf_counter()
            (loss / args.sync_every).backward()
            clock.backward.append(clock.grads_ready - t0)
        if sync:
            t0 = time.perf_counter()
            opt.step()
            clock.optimizer.append(time.perf_counter() - t0)
            opt.zero_grad(set_to_none=True)

    step_times: list[float] = []

    def run(wrap, step_done) -> None:
        """Train for args.steps steps, epoch after epoch over the loader."""
        t = time.perf_counter()
        for epoch in range(10**9):
            sampler.set_epoch(epoch)
            for x, y in wrap(loader):
                train_step(x, y)
                step_done()
                if prof is not None:
                    prof.step()
                now = time.perf_counter()
                step_times.append(now - t)
                t = now
                if len(step_times) >= args.steps:
                    return

    if args.no_record:
        compress()
        run(lambda it: it, lambda: None)
    else:
        import gpuscope

        with gpuscope.record(args.run_dir, model=ddp, tensorboard=args.tensorboard,
                             live_every=args.live_every) as rec:
            compress()
            run(rec.data, rec.step)
    if prof is not None:
        prof.stop()
    if args.timings:
        with open(args.timings, "a") as fh:
            fh.write(json.dumps({"rank": rank, "record": not args.no_record,
                                 "live_every": args.live_every, "scenario": args.scenario,
                                 "step_s": step_times, "forward_s": clock.forward,
                                 "backward_compute_s": clock.backward,
                                 "optimizer_s": clock.optimizer}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is written (the recording closed with its block, the timings and traces are
    # saved, the process group destroyed). Leave without the interpreter's teardown: there,
    # gloo's threads can abort the process ("terminate called without an active exception",
    # PyTorch's, with gpuscope switched off too), failing a training that had finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
