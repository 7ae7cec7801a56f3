"""Training loops shaped like other people's code, recorded by gpuscope and timed independently.

Run under torchrun (2 ranks, gloo, CPU; `--device cuda` on a GPU machine: NCCL when each rank has
a GPU of its own, else gloo on CUDA tensors):

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/cases.py \\
        --case nanogpt --out DIR [--profile]

Writes DIR/record (the run dir), DIR/kineto (torch.profiler traces, with --profile) and
DIR/timings-rank<r>.json: every micro-step and its forward, backward and optimizer call timed with
perf_counter around the same code, beside gpuscope.

Cases:
  nanogpt    a nanoGPT-style GPT on synthetic tokens: top-level loop with rec.start()/stop(),
             4 micro-steps per optimizer step via model.require_backward_grad_sync, loss scaling,
             grad clipping, AdamW, the next batch fetched during the micro-step
  no_sync    DDP, accumulation of 8 with `with model.no_sync()`
  fsdp2      FSDP2 (fully_shard) on a wide MLP: all-gathers and reduce-scatters dominate
  allreduce  no DDP: gradients averaged by the loop's own dist.all_reduce calls
  nomodel    DDP, but record() is not given the model
  closure    DDP with torch.optim.LBFGS and a closure (forward/backward inside step())
  autocast   DDP under torch.autocast("cpu", dtype=torch.bfloat16)
  tutorial   the shape of pytorch/examples' DDP tutorial series: a tiny Linear(20, 1), a
             DataLoader of random samples with a DistributedSampler, batch 32
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
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import gpuscope  # noqa: E402

_now = time.perf_counter
DEVICE = "cpu"  # main() sets "cuda" for --device cuda; tensors are made on torch's default device


class Timings:
    """Independent perf_counter timing of the same code gpuscope records."""

    def __init__(self):
        self.micro: list[float] = []
        self.parts: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [],
                                             "data": []}
        self._t = _now()

    def part(self, name: str, t0: float) -> None:
        self.parts[name].append(_now() - t0)

    def step(self) -> None:
        now = _now()
        self.micro.append(now - self._t)
        self._t = now

    def save(self, path: str, **extra) -> None:
        with open(path, "w") as fh:
            json.dump({"micro_s": self.micro, "parts_s": self.parts, **extra}, fh)


# ------------------------------------------------------------------------------- models
class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small GPT in nanoGPT's shape: returns (logits, loss)."""

    def __init__(self, vocab=512, block=64, d=128, layers=2, heads=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)),
                                                           targets.view(-1))
        return logits, loss


def mlp(width: int, depth: int, dim_in: int = 64) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(dim_in, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


# ------------------------------------------------------------------------------- cases
def case_nanogpt(args, rank, tim):
    torch.manual_seed(rank)
    data = torch.randint(0, 512, (20_000,))
    block, batch, accum = 64, 8, 4

    def get_batch():
        ix = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i:i + block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
        return x, y

    model = DDP(GPT())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = gpuscope.record(args.run_dir, model=model, live_every=args.live_every)
    rec.start()  # nanoGPT's loop is top-level: no `with` block to re-indent it into
    batches = rec.data(iter(get_batch, None))
    t = _now()
    X, Y = next(batches)
    tim.part("data", t)
    for it in range(args.steps):
        for micro in range(accum):
            model.require_backward_grad_sync = micro == accum - 1
            t = _now()
            _, loss = model(X, Y)
            loss = loss / accum
            tim.part("forward", t)
            t = _now()
            X, Y = next(batches)  # prefetch during the micro-step, as nanoGPT does
            tim.part("data", t)
            t = _now()
            loss.backward()
            tim.part("backward", t)
            if micro == accum - 1:
                t = _now()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                tim.part("optimizer", t)
            rec.step()
            tim.step()
    rec.stop()
    return {"accumulation": accum}


def _ddp_loop(args, rank, tim, model, rec_model, accum=1, autocast=False, closure=False,
              data_dim=64, batch=16, allreduce=False):
    torch.manual_seed(rank)
    batches = [(torch.randn(batch, data_dim), torch.randint(0, 10, (batch,)))
               for _ in range(args.steps * accum + 1)]
    opt = (torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2) if closure
           else torch.optim.SGD(model.parameters(), lr=0.01))
    world = dist.get_world_size()
    with gpuscope.record(args.run_dir, model=rec_model, live_every=args.live_every) as rec:
        it = iter(rec.data(batches))
        for step in range(args.steps * accum):
            t = _now()
            x, y = next(it)
            tim.part("data", t)
            last = step % accum == accum - 1
            if closure:
                def fn():
                    opt.zero_grad()
                    t0 = _now()
                    loss = F.cross_entropy(model(x), y)
                    tim.part("forward", t0)
                    t0 = _now()
                    loss.backward()
                    tim.part("backward", t0)
                    return loss

                t = _now()
                opt.step(fn)
                tim.part("optimizer", t)
            else:
                sync = _no_sync(model) if (accum > 1 and not last) else _nothing()
                with sync:
                    t = _now()
                    if autocast:
                        with torch.autocast(DEVICE, dtype=torch.bfloat16):
                            loss = F.cross_entropy(model(x), y)
                    else:
                        loss = F.cross_entropy(model(x), y)
                    tim.part("forward", t)
                    t = _now()
                    loss.backward()
                    if allreduce:  # the loop averages gradients itself
                        for p in model.parameters():
                            dist.all_reduce(p.grad)
                            p.grad /= world
                    tim.part("backward", t)
                if last:
                    t = _now()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    tim.part("optimizer", t)
            rec.step()
            tim.step()
    return {"accumulation": accum}


def _no_sync(model):
    """DDP's no_sync(), or FSDP2's set_requires_gradient_sync(False) for one micro-step."""
    if hasattr(model, "no_sync"):
        return model.no_sync()
    import contextlib

    @contextlib.contextmanager
    def off():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return off()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def case_no_sync(args, rank, tim):
    model = DDP(mlp(512, 3))
    return _ddp_loop(args, rank, tim, model, model, accum=args.accum or 8,
                     batch=args.batch or 16)


def case_nomodel(args, rank, tim):
    model = DDP(mlp(1024, 4))
    return _ddp_loop(args, rank, tim, model, None, batch=2)


def case_closure(args, rank, tim):
    model = DDP(mlp(256, 3))
    return _ddp_loop(args, rank, tim, model, model, closure=True)


def case_autocast(args, rank, tim):
    model = DDP(mlp(256, 3))
    return _ddp_loop(args, rank, tim, model, model, autocast=True)


def case_allreduce(args, rank, tim):
    model = mlp(512, 3)
    return _ddp_loop(args, rank, tim, model, model, allreduce=True, batch=4)


def case_fsdp2(args, rank, tim):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = mlp(1024, 4)
    reshard = not args.no_reshard
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return _ddp_loop(args, rank, tim, model, model, batch=args.batch or 4, accum=args.accum or 1)


def case_tutorial(args, rank, tim):
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    class Samples(Dataset):
        def __init__(self, n):
            self.data = [(torch.rand(20), torch.rand(1)) for _ in range(n)]

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            return self.data[i]

    # the tutorial keeps its data on the CPU and moves each batch to its GPU (its default device
    # stays the CPU: DistributedSampler's shuffle draws on it)
    torch.set_default_device("cpu")
    torch.manual_seed(0)
    data = Samples(2048)
    loader = DataLoader(data, batch_size=32, pin_memory=False, shuffle=False,
                        sampler=DistributedSampler(data))
    model = DDP(nn.Linear(20, 1).to(DEVICE))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with gpuscope.record(args.run_dir, model=model, live_every=args.live_every) as rec:
        for epoch in range(args.epochs):
            loader.sampler.set_epoch(epoch)
            it = iter(rec.data(loader))
            while True:
                t = _now()
                try:
                    source, targets = next(it)
                except StopIteration:
                    break
                source, targets = source.to(DEVICE), targets.to(DEVICE)
                tim.part("data", t)
                opt.zero_grad()
                t = _now()
                out = model(source)
                loss = F.mse_loss(out, targets)
                tim.part("forward", t)
                t = _now()
                loss.backward()
                tim.part("backward", t)
                t = _now()
                opt.step()
                tim.part("optimizer", t)
                rec.step()
                tim.step()
    return {}


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-steps", type=int, default=4, help="micro-steps the profiler records")
    ap.add_argument("--live-every", type=int, default=0, help="record(live_every=N)")
    ap.add_argument("--accum", type=int, help="micro-steps per optimizer step (no_sync, fsdp2)")
    ap.add_argument("--batch", type=int, help="per-rank batch (no_sync, fsdp2)")
    ap.add_argument("--epochs", type=int, default=2, help="tutorial: epochs (32 steps each)")
    ap.add_argument("--no-reshard", action="store_true",
                    help="fsdp2: fully_shard(..., reshard_after_forward=False)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the loop's tensors on this rank's GPU (torch.set_default_device), "
                         "as some training code sets it")
    args = ap.parse_args()
    args.run_dir = os.path.join(args.out, "record")
    torch.set_num_threads(1)
    backend = "gloo"
    if args.device == "cuda":
        global DEVICE
        DEVICE = "cuda"
        gpus = torch.cuda.device_count()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % gpus)
        torch.set_default_device("cuda")
        if int(os.environ.get("LOCAL_WORLD_SIZE", 1)) <= gpus:
            backend = "nccl"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    prof = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
        prof = profile(activities=acts,
                       schedule=schedule(wait=1, warmup=1, active=args.profile_steps, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(os.path.join(args.out, "kineto")))
        prof.start()
        orig_step = gpuscope.Recorder.step

        def step(self):  # one profiler step per recorded micro-step
            orig_step(self)
            prof.step()

        gpuscope.Recorder.step = step
    tim = Timings()
    extra = CASES[args.case](args, rank, tim)
    if prof is not None:
        prof.stop()
    tim.save(os.path.join(args.out, f"timings-rank{rank}.json"), case=args.case, **(extra or {}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # everything is written and the group destroyed: leave without the interpreter's teardown,
    # where gloo's threads can abort a finished run (PyTorch's, gpuscope off too)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
