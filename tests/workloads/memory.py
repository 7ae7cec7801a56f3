"""A 2-rank DDP run (gloo, CPU) that keeps memory alive, or runs out of it; for test_memory.py.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/memory.py \\
        --run-dir DIR [--leak-rank 1 --leak-mb 8] [--oom-rank 1 --oom-at 12] [--steps 40]

--leak-rank: that rank keeps each step's activations plus `--leak-mb` MB in a list it never
frees (as a loop that appends outputs for logging would). --oom-rank: at step `--oom-at` that
rank asks the CPU allocator for 1 PiB, a real allocation failure raised in the loop. Each rank
writes DIR/loop-rank<r>.json: its own reading of its resident set (VmRSS, /proc/self/status)
after every step, beside gpuscope's (a sample after each of the run's first 64 steps).
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", required=True)
ap.add_argument("--leak-rank", type=int, default=-1)
ap.add_argument("--leak-mb", type=float, default=8.0)
ap.add_argument("--oom-rank", type=int, default=-1)
ap.add_argument("--oom-at", type=int, default=12)
ap.add_argument("--steps", type=int, default=40)
args = ap.parse_args()


def vmrss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
kept, steps, rss = [], [], []
try:
    with gpuscope.record(args.run_dir, model=model) as rec:  # the defaults: 64-step flushes
        for i in rec.data(range(args.steps)):
            if rank == args.oom_rank and i == args.oom_at:
                torch.empty(1 << 50, dtype=torch.uint8)  # raises: the allocator cannot
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rank == args.leak_rank:
                kept.append((out.detach().clone(),
                             torch.ones(int(args.leak_mb * 2**20) // 4)))  # written: resident
            rec.step()
            steps.append(i)
            rss.append(vmrss())
finally:
    with open(os.path.join(args.run_dir, f"loop-rank{rank}.json"), "w") as fh:
        json.dump({"steps": steps, "vmrss_bytes": rss}, fh)
dist.destroy_process_group()
