"""FSDP2 and nn.DataParallel on a GPU, recorded by gpuscope and profiled by torch.profiler at once,
for scripts/gpu_check.sh (a GPU machine; not run in CI).

    torchrun --standalone --nproc_per_node 1 scripts/gpu_parallel.py --mode fsdp --out DIR
    python scripts/gpu_parallel.py --mode dp --out DIR          # every visible GPU, one process

Writes DIR/record (the gpuscope run dir), DIR/kineto (torch.profiler traces) and
DIR/timings.json (each step timed independently with perf_counter on the host, and the whole
loop to a final device sync).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpuscope  # noqa: E402


def model(width: int, depth: int) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 16))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("fsdp", "dp"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--no-record", action="store_true", help="the same run without gpuscope")
    ap.add_argument("--no-profile", action="store_true", help="without torch.profiler")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.mode == "fsdp":
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        net = model(args.width, args.depth).cuda()
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        wrapped = fully_shard(net)
        rank = dist.get_rank()
    else:
        net = model(args.width, args.depth).cuda()
        wrapped = nn.DataParallel(net)
        rank = 0
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
    data = [(torch.randn(args.batch, args.width), torch.randn(args.batch, 16))
            for _ in range(args.steps)]
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=2, warmup=1, active=4, repeat=1),
                   on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto"),
                                                            use_gzip=True))
    rec = gpuscope.record(os.path.join(args.out, "record"), model=wrapped,
                          enabled=not args.no_record)
    times = []
    if not args.no_profile:
        prof.start()
    torch.cuda.synchronize()
    start = t = time.perf_counter()
    with rec:
        for x, y in rec.data(data):
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = nn.functional.mse_loss(wrapped(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.step()
            if not args.no_profile:
                prof.step()
            now = time.perf_counter()
            times.append(now - t)
            t = now
        torch.cuda.synchronize()
        total = time.perf_counter() - start
    if not args.no_profile:
        prof.stop()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "timings.json"), "a") as fh:
            fh.write(json.dumps({"mode": args.mode, "record": not args.no_record,
                                 "step_s": times, "total_s": total,
                                 "devices": torch.cuda.device_count()}) + "\n")
    if args.mode == "fsdp":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
