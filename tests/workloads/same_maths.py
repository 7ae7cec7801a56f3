"""gpuscope must never change the training maths: the same DDP training, seeded, with and without
gpuscope.record(), for each comm hook setup; writes whether the parameters came out
bit-identical. Run under torchrun (2 ranks, gloo, CPU):

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/same_maths.py OUT
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuscope

HOOKS = {
    "none": None,
    "user_allreduce": default_hooks.allreduce_hook,
    "fp16_compress": default_hooks.fp16_compress_hook,
    "bf16_compress": default_hooks.bf16_compress_hook,
}


def train(hook, run_dir, steps=6):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(),
                          nn.Linear(48, 1))
    ddp = DDP(model, bucket_cap_mb=0.002)  # several buckets
    rec = gpuscope.record(run_dir, model=ddp).start() if run_dir else None
    if hook is not None:  # registered after record(): routed through gpuscope's dispatcher
        ddp.register_comm_hook(dist.group.WORLD, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own data
    for _ in range(steps):
        x = torch.randn(16, 24, generator=gen)
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if rec is not None:
            rec.step()
    if rec is not None:
        rec.stop()
    return [p.detach().clone() for p in model.parameters()]


def main():
    out = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {}
    for name, hook in HOOKS.items():
        try:
            plain = train(hook, None)
        except TypeError as exc:  # bf16: "required CUDA 11+ and NCCL 2.10+" (a CPU build)
            result[name] = {"unsupported": str(exc)}
            continue
        recorded = train(hook, os.path.join(out, f"run-{name}"))
        diff = max(float((a - b).abs().max()) for a, b in zip(plain, recorded))
        result[name] = {"identical": all(torch.equal(a, b) for a, b in zip(plain, recorded)),
                        "max_abs_diff": diff}
    with open(os.path.join(out, f"maths-rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
