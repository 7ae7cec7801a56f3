"""2D parallelism on a DeviceMesh (gloo, CPU): tensor parallel over `tp`, FSDP2 over `dp`, the
shape of pytorch/examples distributed/tensor_parallelism/fsdp_tp_example.py, on synthetic data.

    python -m torch.distributed.run --standalone --nproc_per_node 4 tests/workloads/mesh.py \\
        --out DIR [--model mlp|block] [--tp 2] [--steps 10] [--profile]

--model mlp (default): its MLP block, colwise in and rowwise out (TP's all-reduces), then
fully_shard over the data-parallel dimension.
--model block: the example's Llama plan with sequence parallel on a small transformer of our
own (2 layers): token embedding rowwise with its output sharded on the sequence, the norms
SequenceParallel, attention and feed-forward inputs gathered (PrepareModuleInput), q/k/v and w1/w3
colwise, the output projections rowwise back to sequence shards, the head colwise: TP/SP's
all-gathers and reduce-scatters inside forward and backward.

CPU adaptations: device type "cpu" and gloo; FSDP2's fully_shard for the example's FSDP1 wrapper;
attention on local heads with the math kernel. Writes DIR/record, and with --profile DIR/kineto.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)

import gpuscope

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--tp", type=int, default=2)
ap.add_argument("--model", choices=("mlp", "block"), default="mlp")
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--dim", type=int, default=512)
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
VOCAB, SEQ, HEADS = 1024, 64, 8


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.n_heads = HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.n_heads, -1).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))  # local heads: n_heads is per rank
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention, self.feed_forward = Attention(dim), FeedForward(dim)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Tiny(nn.Module):
    def __init__(self, dim, n_layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.norm, self.output = nn.LayerNorm(dim), nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


tp_mesh = mesh["tp"]
if args.model == "mlp":
    model = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.ReLU(),
                          nn.Linear(4 * args.dim, args.dim))
    model = parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
else:  # the example's plan, layer by layer
    model = Tiny(args.dim)
    model = parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    for block in model.layers:
        block.attention.n_heads = HEADS // tp_mesh.size()
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(
                output_layouts=Shard(1)), "feed_forward.w3": ColwiseParallel()})
model = fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(mesh["dp"].get_local_rank())  # tp peers share a batch
x = (torch.randn(64, args.dim, generator=g) if args.model == "mlp"
     else torch.randint(VOCAB, (8, SEQ), generator=g))

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
        out = model(x)
        loss = out.square().mean() if args.model == "mlp" else out.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.step()
        if prof is not None:
            prof.step()
if prof is not None:
    prof.stop()
dist.destroy_process_group()
