"""A DDP loop profiled with torch.profiler in which one rank runs one extra expensive op per step
(torch.linalg.svd of a square matrix), the op timed with perf_counter around the same call.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/extra_op.py \\
        --out DIR [--extra-rank 1] [--size 256] [--steps 8] [--record] [--device cuda]

Writes DIR/kineto (one trace per rank, tensorboard_trace_handler) and DIR/extra-rank<r>.json
(the extra op's seconds per profiled step). `--extra-rank -1`: no rank runs it (the run to
compare against). `--record`: no profiler; gpuscope.record(DIR/record, modules=True) instead,
the op inside the model's `extra` module (its forward), beside `body` and `head`.
`--device cuda`: every rank on GPU 0 (gloo can reduce CUDA tensors, so two ranks share one GPU),
the profiler records the GPU too, module times come from CUDA events, and the extra op is timed
between two synchronizes (its kernels' time, not only their launch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


class Extra(nn.Module):
    """torch.linalg.svd of a fixed matrix on the chosen rank, timed; identity on its input."""

    def __init__(self, mat, on: bool):
        super().__init__()
        self.mat, self.on, self.spent = mat, on, []

    def forward(self, x):
        if self.on:
            self.spent.append(timed_svd(self.mat))
        return x


def timed_svd(mat) -> float:
    """torch.linalg.svd(mat), its seconds by perf_counter (on a GPU: from an idle device to the
    end of its kernels)."""
    cuda = mat.is_cuda
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    torch.linalg.svd(mat)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


class Net(nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 512), nn.ReLU())
        self.extra = extra
        self.head = nn.Linear(512, 256)

    def forward(self, x):
        return self.head(self.extra(self.body(x)))


def recorded(args, rank: int) -> None:
    import gpuscope

    dev = args.device
    extra = Extra(torch.randn(args.size, args.size, device=dev), rank == args.extra_rank)
    model = DDP(Net(extra).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuscope.record(os.path.join(args.out, "record"), model=model, modules=True) as rec:
        for _ in range(args.steps + 2):
            loss = model(torch.randn(64, 256, device=dev)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.step()
    with open(os.path.join(args.out, f"extra-rank{rank}.json"), "w") as fh:
        json.dump({"extra_s": extra.spent[1:]}, fh)  # the first step is the warm-up left out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra-rank", type=int, default=1)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8, help="steps the profiler records")
    ap.add_argument("--record", action="store_true", help="gpuscope.record(modules=True)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.record:
        recorded(args, rank)
        dist.barrier()
        dist.destroy_process_group()
        return
    torch.manual_seed(0)
    dev = args.device
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mat = torch.randn(args.size, args.size, device=dev)
    spent = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    prof = profile(activities=activities,
                   schedule=schedule(wait=1, warmup=1, active=args.steps, repeat=1),
                   on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto")))
    with prof:
        for i in range(args.steps + 3):
            x = torch.randn(64, 256, device=dev)
            loss = model(x).square().mean()
            if rank == args.extra_rank:  # the extra op: this rank only
                took = timed_svd(mat)
                if i >= 2:  # the profiler's active steps (wait=1, warmup=1)
                    spent.append(took)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    with open(os.path.join(args.out, f"extra-rank{rank}.json"), "w") as fh:
        json.dump({"extra_s": spent}, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # leave without the interpreter's teardown (gloo's threads)
