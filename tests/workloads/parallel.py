"""Pipeline and hybrid (data x pipeline) parallel training on CPU/gloo, recorded by gpuscope.

    python -m torch.distributed.run --standalone --nproc_per_node N tests/workloads/parallel.py \\
        --case pipeline|sendrecv|hybrid --out DIR [--heavy-stage 1 | --layers 4,4] [--slow-rank -1]
        [--profile]

  pipeline  2 ranks, torch.distributed.pipelining: 2 stages, ScheduleGPipe over 4 micro-batches;
            --heavy-stage gets 3x the layers of the other
  sendrecv  2 ranks, the same split written by hand with dist.send / dist.recv per micro-batch
  hybrid    4 ranks as 2 (data parallel) x 2 (pipeline stages): ranks 0,1 are replica 0's
            stages, 2,3 replica 1's; each stage's gradients are all-reduced over its data-parallel
            group (new_group); --slow-rank does extra work in its forward

Writes DIR/record, DIR/kineto (--profile) and DIR/timings-rank<r>.json (perf_counter per step;
the hybrid case also its local work per step: forward, backward, optimizer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import gpuscope  # noqa: E402

WIDTH, MICRO, BATCH = 512, 4, 64
_now = time.perf_counter


class Slow(nn.Module):
    """`ms` more device time in forward (a rank on a slower or throttled GPU), spent asleep."""

    def __init__(self, ms: float):
        super().__init__()
        self.ms = ms

    def forward(self, x):
        time.sleep(self.ms / 1000)
        return x


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ms):
        ctx.ms = ms
        time.sleep(ms / 1000)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.ms / 1000)  # backward costs twice the forward, as on a GPU
        return grad, None


class DeviceLinear(nn.Linear):
    """A Linear layer that also takes `ms` of device time per default micro-batch in forward
    (2x in backward), spent
    asleep: stages then run side by side as on separate GPUs, which 2 shared CPU cores cannot
    show with compute alone."""

    def __init__(self, ms: float):
        super().__init__(WIDTH, WIDTH)
        self.ms = ms

    def forward(self, x):  # device time scales with the micro-batch's rows
        return _Sleep.apply(super().forward(x), self.ms * x.shape[0] / (BATCH // MICRO))


def mark(marks: list, t: float, args) -> float:
    """Note a step that ran from `t` to now (rec.step() to rec.step(), as gpuscope counts it),
    then step the profiler: its work falls into the next step for both clocks."""
    now = _now()
    marks.append(now - t)
    if args.profiler is not None:
        args.profiler.step()
    return now


def stage_module(layers: int, slow_ms: float = 0.0, device_ms: float = 0.0) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [DeviceLinear(device_ms) if device_ms else nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    if slow_ms:
        mods.append(Slow(slow_ms))
    return nn.Sequential(*mods)


def layers_of(stage: int, heavy: int, split: str = "") -> int:
    if split:  # --layers 4,4: layers per stage, given
        return int(split.split(",")[stage])
    return 6 if stage == heavy else 2


def case_pipeline(args, rank, world, marks):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(rank)
    module = stage_module(layers_of(rank, args.heavy_stage, args.layers), device_ms=args.device_ms)
    mb = torch.randn(BATCH // args.micro, WIDTH)  # the input shape given: inferring it hung on gloo
    stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=(mb,))
    loss_fn = nn.MSELoss()  # on every stage: the schedule runs backward only with one
    schedule = ScheduleGPipe(stage, n_microbatches=args.micro, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    with gpuscope.record(args.run_dir, model=stage) as rec:
        t = _now()
        for _ in range(args.steps):
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y)
            opt.step()
            opt.zero_grad()
            rec.step()
            t = mark(marks, t, args)


#: the workload's own clock around its local work (forward, backward, optimizer: no
#: communication inside), summed per step: what tells a rank that really computed longer from
#: one a report names without cause (test_parallel's balanced hybrid)
COMPUTE: list[float] = []


def _p2p_stage(module, rank, world, peer_prev, peer_next, group=None, micro=MICRO):
    """One step of a hand-written GPipe: all forwards, then all backwards, per micro-batch."""
    acts, outs = [], []
    local = 0.0
    for _ in range(micro):
        if peer_prev is None:
            x = torch.randn(BATCH // micro, WIDTH)
        else:
            x = torch.empty(BATCH // micro, WIDTH)
            dist.recv(x, src=peer_prev, group=group)
        x.requires_grad_(peer_prev is not None)
        t = _now()
        out = module(x)
        local += _now() - t
        if peer_next is not None:
            dist.send(out.detach(), dst=peer_next, group=group)
        acts.append(x)
        outs.append(out)
    for x, out in zip(acts, outs):
        if peer_next is None:
            t = _now()
            out.pow(2).mean().backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=peer_next, group=group)
            t = _now()
            out.backward(grad)
        local += _now() - t
        if peer_prev is not None:
            dist.send(x.grad, dst=peer_prev, group=group)
    return local


def case_sendrecv(args, rank, world, marks):
    torch.manual_seed(rank)
    module = stage_module(layers_of(rank, args.heavy_stage, args.layers), device_ms=args.device_ms)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    prev = rank - 1 if rank > 0 else None
    nxt = rank + 1 if rank < world - 1 else None
    with gpuscope.record(args.run_dir, model=module) as rec:
        t = _now()
        for _ in range(args.steps):
            _p2p_stage(module, rank, world, prev, nxt, micro=args.micro)
            opt.step()
            opt.zero_grad()
            rec.step()
            t = mark(marks, t, args)


def case_hybrid(args, rank, world, marks):
    """ranks 0,1 = replica 0 (stage 0, 1); ranks 2,3 = replica 1 (stage 0, 1)."""
    stages = 2
    replica, stage = divmod(rank, stages)
    dp_groups = [dist.new_group([s, s + stages]) for s in range(stages)]  # same stage, each replica
    dp = dp_groups[stage]
    torch.manual_seed(stage)
    module = stage_module(3, slow_ms=args.slow_ms if rank == args.slow_rank else 0.0,
                          device_ms=args.device_ms)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    prev = rank - 1 if stage > 0 else None
    nxt = rank + 1 if stage < stages - 1 else None
    with gpuscope.record(args.run_dir, model=module) as rec:
        t = _now()
        for _ in range(args.steps):
            local = _p2p_stage(module, rank, world, prev, nxt, micro=args.micro)
            for p in module.parameters():  # data parallel over this stage's replicas
                dist.all_reduce(p.grad, group=dp)
                p.grad /= 2
            t0 = _now()
            opt.step()
            COMPUTE.append(local + _now() - t0)
            opt.zero_grad()
            rec.step()
            t = mark(marks, t, args)


CASES = {"pipeline": case_pipeline, "sendrecv": case_sendrecv, "hybrid": case_hybrid}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--heavy-stage", type=int, default=1)
    ap.add_argument("--device-ms", type=float, default=0.0,
                    help="device time per layer and micro-batch forward (slept; 2x in backward)")
    ap.add_argument("--micro", type=int, default=MICRO, help="micro-batches per step")
    ap.add_argument("--layers", default="", help="layers per stage, e.g. 4,4 (else --heavy-stage)")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=10.0, help="--slow-rank's extra ms per forward")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    args.run_dir = os.path.join(args.out, "record")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    prof = args.profiler = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        prof = profile(activities=[ProfilerActivity.CPU],
                       schedule=schedule(wait=1, warmup=1, active=max(1, args.steps - 2),
                                         repeat=1),  # the trace is written after the last step
                       on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto"),
                                                              use_gzip=True))
        prof.start()
        args.profiler = prof
    marks: list[float] = []
    CASES[args.case](args, rank, world, marks)
    if prof is not None:
        prof.stop()
    with open(os.path.join(args.out, f"timings-rank{rank}.json"), "w") as fh:
        json.dump({"step_s": marks, "compute_s": COMPUTE}, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # everything is written and the group destroyed: leave without the interpreter's teardown,
    # where gloo's threads can abort a finished run (PyTorch's, gpuscope off too)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
