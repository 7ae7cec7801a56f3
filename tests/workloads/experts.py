"""Expert parallel with skewed routing (gloo, CPU): each rank holds one expert; tokens go to the
experts through all_to_all_single (the functional collective MoE layers use, with autograd),
and `--hot` of every rank's tokens go to rank `--hot-rank`'s expert, so that rank computes most.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/experts.py \\
        --out DIR [--hot 0.8] [--hot-rank 1] [--steps 16] [--profile]

Writes DIR/record (and DIR/kineto with --profile) and DIR/tokens-rank<r>.json: the tokens each
rank's expert received per step, as the loop counted them.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--hot", type=float, default=0.8)
ap.add_argument("--hot-rank", type=int, default=1)
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--tokens", type=int, default=4096)
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
dim = 256
router = nn.Linear(dim, dim)
expert = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
opt = torch.optim.SGD(list(router.parameters()) + list(expert.parameters()), lr=1e-3)
x = torch.randn(args.tokens, dim)
# tokens per destination expert: `hot` of them to the hot rank, the rest spread over the others
hot = int(args.hot * args.tokens)
rest = (args.tokens - hot) // max(world - 1, 1)
splits = [hot if r == args.hot_rank else rest for r in range(world)]
splits[-1 if args.hot_rank != world - 1 else 0] += args.tokens - sum(splits)
got = []

prof = None
if args.profile:
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    prof = profile(activities=[ProfilerActivity.CPU],
                   schedule=schedule(wait=1, warmup=1, active=args.steps - 3, repeat=1),
                   on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto"),
                                                            use_gzip=True))
    prof.start()
with gpuscope.record(os.path.join(args.out, "record"), model=expert) as rec:
    for _ in rec.data(range(args.steps)):
        h = router(x)
        counts = torch.tensor(splits)
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts)          # how many tokens each expert gets
        out_splits, in_splits = recv.tolist(), splits
        routed = funcol.all_to_all_single_autograd(h, out_splits, in_splits, dist.group.WORLD)
        y = expert(routed)
        back = funcol.all_to_all_single_autograd(y, in_splits, out_splits, dist.group.WORLD)
        back.square().mean().backward()
        opt.step()
        opt.zero_grad()
        got.append(sum(out_splits))
        rec.step()
        if prof is not None:
            prof.step()
if prof is not None:
    prof.stop()
with open(os.path.join(args.out, f"tokens-rank{rank}.json"), "w") as fh:
    json.dump(got, fh)
dist.destroy_process_group()
