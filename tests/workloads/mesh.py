"""2D parallelism on a DeviceMesh (gloo, CPU): tensor parallel over `tp`, FSDP2 over `dp`, the
shape of pytorch/examples distributed/tensor_parallelism/fsdp_tp_example.py (its MLP block:
colwise in, rowwise out, then fully_shard over the data-parallel dimension) on synthetic data.

    python -m torch.distributed.run --standalone --nproc_per_node 4 tests/workloads/mesh.py \\
        --out DIR [--tp 2] [--steps 10] [--profile]

CPU adaptations: device type "cpu" and gloo; a plain MLP (no attention, whose flash kernel
DTensor cannot shard on CPU). Writes DIR/record, and with --profile DIR/kineto.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--tp", type=int, default=2)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--dim", type=int, default=512)
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.ReLU(), nn.Linear(4 * args.dim, args.dim))
model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
model = fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(mesh["dp"].get_local_rank())  # tp peers share a batch
x = torch.randn(64, args.dim, generator=g)

prof = None
if args.profile:
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    prof = profile(activities=[ProfilerActivity.CPU],
                   schedule=schedule(wait=1, warmup=1, active=args.steps - 3, repeat=1),
                   on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto"),
                                                            use_gzip=True))
    prof.start()
with gpuscope.record(os.path.join(args.out, "record"), model=model) as rec:
    for _ in rec.data(range(args.steps)):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.step()
        if prof is not None:
            prof.step()
if prof is not None:
    prof.stop()
dist.destroy_process_group()
