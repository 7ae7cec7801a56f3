"""A 2-rank DDP loop (gloo, CPU) that prints each finished step, for scripts/soak.py: the soak
kills it with SIGKILL and compares what reached the run dir with what ran.

    RANK=.. WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python tests/workloads/soak_train.py \\
        --run-dir DIR --steps N [--tensorboard]
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", required=True)
ap.add_argument("--steps", type=int, default=400)
ap.add_argument("--tensorboard", action="store_true")
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
model = DDP(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 32)
print("started", flush=True)
with gpuscope.record(args.run_dir, model=model, tensorboard=args.tensorboard) as rec:
    for i in rec.data(range(args.steps)):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.002)
        rec.step()
        sys.stdout.write(f"{i}\n")
        sys.stdout.flush()
print("closed", flush=True)
dist.destroy_process_group()
