"""A 2-rank DDP run (gloo, CPU) in which one rank dies mid-run; for tests/test_dead_rank.py.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/dies.py \\
        --run-dir DIR --die-rank 1 --die-at 30 [--how kill|raise|exit]

kill: the rank SIGKILLs itself (as the OOM killer would); raise: an exception in the loop;
exit: os._exit(3) (a hard crash in native code). The surviving rank's next all-reduce fails
(gloo sees the peer's sockets close) or torchrun stops it with SIGTERM.
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", required=True)
ap.add_argument("--die-rank", type=int, default=1)
ap.add_argument("--die-at", type=int, default=30)
ap.add_argument("--how", default="kill", choices=["kill", "raise", "exit"])
ap.add_argument("--steps", type=int, default=200)
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(16, 64) for _ in range(8)]
with gpuscope.record(args.run_dir, model=model, flush_rows=4) as rec:
    for i in rec.data(range(args.steps)):
        if rank == args.die_rank and i == args.die_at:
            if args.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif args.how == "exit":
                os._exit(3)
            raise RuntimeError("injected failure")
        loss = model(data[i % 8]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.002)
        rec.step()
dist.destroy_process_group()
