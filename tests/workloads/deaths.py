"""A DDP run (gloo, CPU) in which one rank dies, hangs or calls another collective at a known
step, for tests/test_deaths.py; each rank prints its own log ("rank R step S at T") as the truth.

    python -m torch.distributed.run --standalone --nproc_per_node 4 tests/workloads/deaths.py \\
        --run-dir DIR --rank 2 --at 20 --how raise [--form with|start] [--timeout-s S] \\
        [--stall-s S]

kill:       the rank SIGKILLs itself at step --at; early (step 40 comes in under a second), before
            its first rows are written (every 64 steps or second)
raise:      the rank's training raises at step --at, in a helper of the script (`lose`)
block:      the rank blocks in Python at step --at (a stuck loader); the others wait in DDP's
            forward; with --timeout-s the process group's timeout ends the run
extra:      the rank calls an all-reduce of [1] at step --at; the others go on to DDP's forward
            (the buffers' broadcast of its BatchNorm)
gather:     the rank calls an all-gather of the loss the others never call
abort:      the rank calls an all-reduce of [1] the others do not (as extra) and is aborted in it
            (SIGABRT), as gloo aborts a rank on some collective mismatches (here it hangs
            instead: the abort is the script's, os.abort a second later)

--form start: the recorder by `rec = gpuscope.record(...); rec.start()` ... `rec.stop()`, as a
long top-level loop uses it (the README's nanoGPT form), instead of `with`.
"""

import argparse
import datetime
import os
import signal
import sys
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
ap.add_argument("--how", required=True,
                choices=["kill", "raise", "block", "extra", "gather", "abort"])
ap.add_argument("--form", default="with", choices=["with", "start"])
ap.add_argument("--steps", type=int, default=10_000)
ap.add_argument("--timeout-s", type=float, default=0)
ap.add_argument("--stall-s", type=float, default=None)
ap.add_argument("--extra-numel", type=int, default=1)
args = ap.parse_args()

torch.set_num_threads(1)
kw = {"timeout": datetime.timedelta(seconds=args.timeout_s)} if args.timeout_s else {}
dist.init_process_group("gloo", **kw)
rank = dist.get_rank()
me = rank == args.rank
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(16, 64) for _ in range(8)]


def log(step):
    # one write per line: print's text and newline go out apart, and the ranks share one pipe
    sys.stdout.write(f"rank {rank} step {step} at {time.time():.3f}\n")
    sys.stdout.flush()


def lose(out, step):
    """The loss, where the injected failure is raised."""
    if me and step == args.at and args.how == "raise":
        raise RuntimeError(f"injected failure at step {step}")
    return out.square().mean()


def one_step(i):
    if me and i == args.at:
        if args.how == "block":
            log(i)
            while True:
                time.sleep(3600)
        if args.how in ("extra", "abort"):
            if args.how == "abort":
                threading.Timer(1.0, os.abort).start()
            dist.all_reduce(torch.ones(args.extra_numel))
    loss = lose(model(data[i % 8]), i)
    loss.backward()
    opt.step()
    opt.zero_grad()
    logged = loss.detach().reshape(1)
    if me and i == args.at and args.how == "gather":
        dist.all_gather([torch.zeros(1) for _ in range(dist.get_world_size())], logged)
    dist.all_reduce(logged)


def train(rec):
    for i in rec.data(range(args.steps)):
        if me and args.how == "kill" and i == args.at:
            os.kill(os.getpid(), signal.SIGKILL)
        one_step(i)
        rec.step()
        log(i)
        time.sleep(0.002)


opts = {} if args.stall_s is None else {"stall_s": args.stall_s}
if args.form == "with":
    with gpuscope.record(args.run_dir, model=model, **opts) as rec:
        train(rec)
else:
    rec = gpuscope.record(args.run_dir, model=model, **opts)
    rec.start()
    train(rec)
    rec.stop()
dist.destroy_process_group()
sys.exit(0)
