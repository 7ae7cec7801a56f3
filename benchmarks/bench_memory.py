"""Memory and throughput figures beside independent measurements, on real 2-rank runs (gloo, CPU).

    python benchmarks/bench_memory.py [--runs 3]

- leak: tests/workloads/memory.py, rank 1 keeping 8 MiB alive every step for 60 steps: the
  growth rate gpuscope reports against the loop's own VmRSS readings (/proc/self/status after
  every step: their growth from the first analysed step to the last), and the forecast;
- oom: the same loop, rank 1 asking for 1 PiB at step 12: what the post-mortem says;
- tokens: tests/workloads/tokens.py (an LM on (8, 64) token ids, count_flops=True): samples/s
  against the loop's own count over perf_counter time, tokens/s, and the counted FLOPs against
  FlopCounterMode run here on the same shapes.

Results: benchmarks/results/memory.json (docs/performance.md is written from it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "workloads"))

from measured import commit  # noqa: E402

MiB = 1 << 20


def _torchrun(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", os.path.join(ROOT, "tests", "workloads",
                                                                 script), *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def leak(tmp: str) -> dict:
    import gpuscope

    out = os.path.join(tmp, "leak")
    proc = _torchrun("memory.py", "--run-dir", out, "--leak-rank", "1", "--leak-mb", "8",
                     "--steps", "60")
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    rep = gpuscope.analyze(out)
    growth = [f for f in (rep.memory.findings if rep.memory else []) if f["kind"] == "growth"]
    loop = json.load(open(os.path.join(out, "loop-rank1.json")))
    steps, rss = np.array(loop["steps"]), np.array(loop["vmrss_bytes"], float)
    later = steps >= rep.thresholds.warmup_steps  # end to end over the same steps
    theirs = float((rss[later][-1] - rss[later][0]) / (steps[later][-1] - steps[later][0]))
    g = growth[0] if growth else {}
    return {"ranks_named": [f["ranks"] for f in growth],
            "rate_mib_per_step": round(g.get("rate_bytes_per_step", 0) / MiB, 3),
            "loop_vmrss_slope_mib_per_step": round(theirs / MiB, 3),
            "error_pct": round(100 * (g.get("rate_bytes_per_step", 0) / theirs - 1), 2),
            "forecast_steps": g.get("forecast_steps"), "capacity_bytes": g.get("capacity_bytes"),
            "samples": int(len(rep.table.memory)) if rep.table.memory is not None else 0}


def oom(tmp: str) -> dict:
    import gpuscope

    out = os.path.join(tmp, "oom")
    _torchrun("memory.py", "--run-dir", out, "--oom-rank", "1", "--oom-at", "12", "--steps", "40")
    rep = gpuscope.analyze(out)
    found = [f for f in (rep.memory.findings if rep.memory else []) if f["kind"] == "out_of_memory"]
    f = found[0] if found else {}
    return {"ranks": f.get("ranks"), "step": f.get("step"), "asked_bytes": f.get("asked_bytes"),
            "stopped_waiting": f.get("stopped_waiting"), "text": f.get("text", "")}


def tokens(tmp: str) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import gpuscope
    from tokens import BATCH, SEQ, VOCAB, language_model

    out = os.path.join(tmp, "tokens")
    proc = _torchrun("tokens.py", "--run-dir", out, "--steps", "40")
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    rep = gpuscope.analyze(out)
    t = rep.throughput.to_dict()  # as the JSON has it
    skip = rep.thresholds.warmup_steps
    theirs = 0.0
    for r in range(2):
        loop = json.load(open(os.path.join(out, f"loop-rank{r}.json")))
        theirs += sum(loop["samples"][skip:]) / sum(loop["step_s"][skip:])
    model = language_model()
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    with FlopCounterMode(display=False) as fc:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x.reshape(-1)).backward()
    return {"samples_per_s": t["samples_per_s"], "loop_samples_per_s": round(theirs, 2),
            "error_pct": round(100 * (t["samples_per_s"] / theirs - 1), 2),
            "tokens_per_s": t.get("tokens_per_s"), "flops_per_step": t.get("flops_per_step"),
            "flop_counter_here": int(fc.get_total_flops()), "mfu_pct": t.get("mfu_pct")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "memory.json"))
    args = ap.parse_args()
    runs = {"leak": [], "oom": [], "tokens": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, fn in (("leak", leak), ("oom", oom), ("tokens", tokens)):
                d = os.path.join(tmp, f"{name}{i}")
                os.makedirs(d)
                runs[name].append(fn(d))
                print(name, json.dumps(runs[name][-1]), flush=True)
    doc = {"commit": commit(), "cpu_count": os.cpu_count(), "runs": args.runs, **runs,
           "leak_error_pct_median": statistics.median(r["error_pct"] for r in runs["leak"]),
           "tokens_error_pct_median": statistics.median(r["error_pct"] for r in runs["tokens"])}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
