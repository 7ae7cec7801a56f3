"""A 2-rank DDP run (gloo, CPU) with live diagnosis on; for tests/test_live.py.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/live_train.py \\
        --run-dir DIR --out FILE --mode imbalanced|data|leaves|stalls [--steps 60 --every 10]

imbalanced: rank 1 works 30 ms more per step; data: every batch takes 25 ms to load, on every
rank; leaves: rank 1 stops after --stop-at steps and exits; stalls: rank 1 stops recording
after --stop-at steps and sleeps (alive, silent). In leaves/stalls there is no DDP (only the
live exchange talks between ranks), so rank 0 trains on alone. Rank 0's diagnoses go to --out
(one JSON line each, from on_diagnosis) and each rank's loop time to FILE.rank-N.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--mode", default="imbalanced",
                choices=["imbalanced", "data", "leaves", "stalls", "raises"])
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--every", type=int, default=10)
ap.add_argument("--stop-at", type=int, default=25)
ap.add_argument("--timeout", type=float, default=60.0)
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
alone = args.mode in ("leaves", "stalls")
net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
model = net if alone else DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def loader():
    for i in range(args.steps):
        if args.mode == "data":
            time.sleep(0.025)
        yield torch.randn(16, 64)


def on_diagnosis(summary):
    with open(args.out, "a") as f:
        f.write(json.dumps(summary) + "\n")
    if args.mode == "raises":
        raise ValueError("a callback that fails")


t0 = time.perf_counter()
with gpuscope.record(args.run_dir, model=model, live_every=args.every, on_diagnosis=on_diagnosis,
                     live_timeout_s=args.timeout) as rec:
    for i, x in enumerate(rec.data(loader())):
        if alone and rank == 1 and i == args.stop_at:
            if args.mode == "leaves":
                os._exit(0)  # gone without a word: its sockets close
            rec.stop()
            time.sleep(3 * args.timeout)  # alive, silent, for longer than the others train
            break
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.005 + (0.03 if args.mode == "imbalanced" and rank == 1 else 0.0))
        rec.step()
with open(f"{args.out}.rank-{rank}", "w") as f:
    json.dump({"loop_s": time.perf_counter() - t0, "end_unix_s": time.time(),
               "summaries": len(rec.live_summaries)}, f)
if not alone:
    dist.barrier()
    dist.destroy_process_group()
