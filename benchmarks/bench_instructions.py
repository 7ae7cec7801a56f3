"""The recorder's cost per micro-step in instructions (valgrind's callgrind): a figure that does
not move with the machine's speed, where wall-clock rounds on a shared 2-core VM swing by
+-10 us.

One process (gloo, 1 rank, one thread for torch) trains a model plain, then recorded by
gpuscope with every default on, then recorded again; callgrind dumps its counts at each
os.getppid() call (--dump-before=getppid), which the harness makes around each measured loop.
The figure is the second recorded loop's instructions per micro-step less the plain loop's (the
first recorded loop also pays one-time costs: imports, first encodes). Both threads count (the
writer's work too), but not what they cost each other in caches or the GIL: that is what the
wall-clock figure of bench_overhead.py adds.

    python benchmarks/bench_instructions.py [--steps 1024] [--nanogpt-steps 2]

tiny: bench_overhead's tiny DDP model (Linear(8, 8), SGD), 1,024 micro-steps;
nanogpt: tests/workloads/cases.py's nanoGPT-style GPT with 4 micro-steps per optimizer step
(AdamW, gradient clipping, no_sync-style accumulation), 2 optimizer steps (8 micro-steps).
Needs valgrind; takes ~3 min (tiny) + ~20 min (nanogpt; --nanogpt-steps 0 leaves it out).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from measured import commit  # noqa: E402  (benchmarks/measured.py)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

_HARNESS = r"""
import os, sys, tempfile
sys.path.insert(0, os.path.join(sys.argv[3], "tests", "workloads"))
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import gpuscope
torch.set_num_threads(1)
model_name, n = sys.argv[1], int(sys.argv[2])
d = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
torch.manual_seed(0)
if model_name == "tiny":
    model = DDP(nn.Linear(8, 8)); opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    def batches():
        while True:
            yield x
    def loop(it, steps, rec=None):  # steps: micro-steps
        for _, b in zip(range(steps), it):
            opt.zero_grad(); model(b).sum().backward(); opt.step()
            if rec is not None: rec.step()
    warm, accum = 50, 1
else:
    import cases
    data = torch.randint(0, 512, (20_000,))
    block, batch, accum = 64, 8, 4
    def batches():
        while True:
            ix = torch.randint(len(data) - block - 1, (batch,))
            yield (torch.stack([data[i:i + block] for i in ix]),
                   torch.stack([data[i + 1:i + 1 + block] for i in ix]))
    model = DDP(cases.GPT()); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    def loop(it, steps, rec=None):  # steps: optimizer steps of `accum` micro-steps
        X, Y = next(it)
        for _ in range(steps):
            for micro in range(accum):
                model.require_backward_grad_sync = micro == accum - 1
                _, loss = model(X, Y)
                X, Y = next(it)
                (loss / accum).backward()
                if micro == accum - 1:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step(); opt.zero_grad(set_to_none=True)
                if rec is not None: rec.step()
    warm = 1
mark = os.getppid  # callgrind dumps its counts before each call
loop(batches(), warm); mark(); loop(batches(), n); mark()
for i in range(2):
    with gpuscope.record(os.path.join(d, f"run{i}"), model=model) as rec:
        it = rec.data(batches())
        loop(it, warm, rec); mark(); loop(it, n, rec); mark()
os._exit(0)
"""


def _count(path: str) -> int:
    with open(path) as fh:
        for line in fh:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"{path}: no totals")


def instructions(model: str, steps: int, micro_per_step: int) -> dict:
    """Instructions per micro-step of the plain loop and of the second recorded one."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg")
        script = os.path.join(tmp, "harness.py")
        with open(script, "w") as fh:
            fh.write(_HARNESS)
        t = time.perf_counter()
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=getppid",
                        f"--callgrind-out-file={out}", sys.executable, script, model, str(steps),
                        ROOT], check=True, capture_output=True, text=True, cwd=tmp,
                       env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
        dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        counts = [_count(p) for p in dumps]
        # dumps: [start..plain warm] [plain] [rec warm] [rec] [rec warm] [rec]; the rest at exit
        if len(counts) < 6:
            raise SystemExit(f"{model}: {len(counts)} callgrind dumps, expected 6")
        micro = steps * micro_per_step
        plain, recorded = counts[1] / micro, counts[5] / micro
        return {"micro_steps": micro, "plain_per_micro_step": round(plain),
                "recorded_per_micro_step": round(recorded), "added": round(recorded - plain),
                "added_pct": round((recorded - plain) / plain * 100, 3),
                "seconds": round(time.perf_counter() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1024, help="tiny model's micro-steps")
    ap.add_argument("--nanogpt-steps", type=int, default=2,
                    help="nanoGPT's optimizer steps (4 micro-steps each); 0: not measured")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "instructions.json"))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed (apt-get install valgrind)")
    version = subprocess.run(["valgrind", "--version"], capture_output=True,
                             text=True).stdout.strip()
    result = {"valgrind": re.sub(r"^valgrind-", "", version), "commit": commit(),
              "python": sys.version.split()[0], "models": {}}
    result["models"]["tiny"] = instructions("tiny", args.steps, 1)
    print("tiny", result["models"]["tiny"], flush=True)
    if args.nanogpt_steps:
        result["models"]["nanogpt"] = instructions("nanogpt", args.nanogpt_steps, 4)
        print("nanogpt", result["models"]["nanogpt"], flush=True)
    for m in result["models"].values():
        m["commit"] = result["commit"]
    try:  # a model not measured this time keeps its last count, with the commit it was made at
        with open(args.out) as fh:
            kept = json.load(fh).get("models", {})
    except (OSError, ValueError):
        kept = {}
    for name, m in kept.items():
        if name not in result["models"] and m.get("commit"):
            result["models"][name] = m
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
