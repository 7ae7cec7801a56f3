"""A 4-rank DDP run (gloo, CPU) in which one rank stops at a step and the job is ended from
outside (a scheduler's time limit); for tests/test_stall.py.

    timeout -s TERM 40 python -m torch.distributed.run --standalone --nproc_per_node 4 \\
        tests/workloads/hangs.py --run-dir DIR --rank 2 --at 20 --how block [--stall-s 3]

block:    the rank blocks forever inside its model's forward (a stuck loader, lock or filesystem
          stands for it: a sleep in a forward pre-hook), the others wait in DDP's all-reduce
mismatch: the rank calls all_gather where the others call all_reduce (the loss, for logging)
raise:    the rank's training raises
kill:     the rank is SIGKILLed while it waits in the loss's all_reduce, 2 s past the stall
          bound (its peers write a checkpoint meanwhile: a sleep)

Every rank logs the loss's all_reduce each step (as training scripts do for their logs). The
rank that stops was made late before (`--late-ms` in each step's forward) so that the report
can say it was already the straggler.
"""

import argparse
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", required=True)
ap.add_argument("--rank", type=int, default=2)
ap.add_argument("--at", type=int, default=20)
ap.add_argument("--how", default="block", choices=["block", "mismatch", "raise", "kill"])
ap.add_argument("--steps", type=int, default=10_000)
ap.add_argument("--stall-s", type=float, default=3.0)
ap.add_argument("--late-ms", type=float, default=0.0)
ap.add_argument("--live-every", type=int, default=0)
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
me = rank == args.rank
net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
step = 0


def stuck(module, inputs):
    if me and step == args.at and args.how == "block":
        while True:  # never comes back
            time.sleep(3600)
    if me and args.late_ms:
        time.sleep(args.late_ms / 1000)


net.register_forward_pre_hook(stuck)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(16, 64) for _ in range(8)]
with gpuscope.record(args.run_dir, model=model, stall_s=args.stall_s,
                     live_every=args.live_every) as rec:
    for i in rec.data(range(args.steps)):
        step = i
        if me and i == args.at and args.how == "raise":
            raise RuntimeError("injected failure")
        loss = model(data[i % 8]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        logged = loss.detach().reshape(1)
        if i == args.at and args.how == "kill":
            if me:  # killed while it waits for its late peers (past the stall bound)
                threading.Timer(args.stall_s + 2.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
            else:
                time.sleep(3600)  # a long checkpoint
        if me and i == args.at and args.how == "mismatch":
            dist.all_gather([torch.zeros(1) for _ in range(dist.get_world_size())], logged)
        else:
            dist.all_reduce(logged)
        rec.step()
dist.destroy_process_group()
