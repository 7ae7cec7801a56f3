"""A 2-rank DDP language model on token ids (gloo, CPU) with its FLOPs counted; for
test_throughput.py.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/tokens.py \\
        --run-dir DIR [--steps 30]

Batches of (8, 64) int64 token ids, a 2-layer MLP language model over an embedding, AdamW;
`record(count_flops=True)`. Each rank writes DIR/loop-rank<r>.json: the samples it trained and
the perf_counter time of every step, beside gpuscope's.
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

VOCAB, SEQ, BATCH, DIM = 512, 64, 8, 128

def language_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Linear(DIM, 4 * DIM), nn.GELU(),
                         nn.Linear(4 * DIM, VOCAB))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(language_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(4)]
    loader = [(b[:, :-1], b[:, 1:]) for b in batches] * (args.steps // 4 + 1)
    samples, step_s = [], []
    with gpuscope.record(args.run_dir, model=model, count_flops=True, flush_rows=8) as rec:
        t = time.perf_counter()
        for i, (x, y) in enumerate(rec.data(loader[:args.steps])):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.step()
            now = time.perf_counter()
            samples.append(int(x.shape[0]))
            step_s.append(now - t)
            t = now
    with open(os.path.join(args.run_dir, f"loop-rank{rank}.json"), "w") as fh:
        json.dump({"samples": samples, "step_s": step_s}, fh)
    dist.destroy_process_group()
