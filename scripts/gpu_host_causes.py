"""Issue 70's own traces on a real GPU: one small CUDA loop per cause of host-bound time, each
profiled by torch.profiler (with Python stacks) in its own process and read by gpuscope, against
what was injected:

    item      a sum of a tensor's elements with .item() on each: a sync per element
    cpu       the same with .cpu() on each (GPUPuzzlers' first sum)
    cpu_math  the same after one copy of the whole tensor to the CPU: no kernel in the loop
    tiny      4,096 one-element adds on the GPU: launch-bound, no sync
    startup   the process's first matmul (cuBLAS's first use) then small ones, no step markers

One JSON line per case: what gpuscope said (verdict, first suggestion, its words, the step) and
whether it names the cause injected; exits non-zero when one does not. Each case's trace is kept
under OUT/CASE/ for the corpus.

    python scripts/gpu_host_causes.py --out DIR [--device cpu: the loops, not the checks]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: the loop each case profiles, run as `python -c` in a fresh process (startup: its first call)
LOOP = r"""
import sys, torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
case, out, device = sys.argv[1:4]
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
x = torch.rand(4096, device=device)

def item_sum(t):
    total = 0.0
    for i in range(t.shape[0]):
        total += t[i].item()
    return total

def cpu_sum(t):
    total = 0.0
    for i in range(t.shape[0]):
        total += t[i].cpu()
    return total

def cpu_math_sum(t):
    total, on_cpu = 0.0, t.cpu()
    for i in range(on_cpu.shape[0]):
        total += on_cpu[i]
    return total

def tiny_sum(t):
    total = torch.zeros(1, device=t.device)
    for i in range(t.shape[0]):
        total += t[i]
    return total

if case == "startup":  # the first matmul of the process, then small ones: one profiled window
    a, b = torch.rand(1024, 1024, device=device), torch.rand(32, 32, device=device)
    with profile(activities=acts, with_stack=True,
                 on_trace_ready=tensorboard_trace_handler(out)) as prof:
        a @ a
        for _ in range(60):
            b @ b
        if device == "cuda":
            torch.cuda.synchronize()
    sys.exit(0)
fn = {"item": item_sum, "cpu": cpu_sum, "cpu_math": cpu_math_sum, "tiny": tiny_sum}[case]
fn(x)  # warm: the libraries' first use is not the loop
with profile(activities=acts, with_stack=True, schedule=schedule(wait=0, warmup=1, active=4),
             on_trace_ready=tensorboard_trace_handler(out)) as prof:
    for _ in range(5):
        fn(x)
        if device == "cuda":
            torch.cuda.synchronize()
        prof.step()
"""

#: per case: what gpuscope must say (in the first suggestion's words, or the warnings)
EXPECT = {
    "item": ("host_syncs", ["Tensor.item()", "aten::item"]),
    "cpu": ("host_syncs", ["Tensor.cpu()", "aten::to"]),
    "cpu_math": (None, ["the step holds no GPU kernel"]),
    "tiny": ("host_overhead", ["launches a step"]),
    "startup": ("host_overhead", ["one-off host work"]),
}


def profile_case(case: str, out: str, device: str) -> None:
    shutil.rmtree(out, ignore_errors=True)  # one trace per case: a rerun's, not beside an old one
    os.makedirs(out)
    proc = subprocess.run([sys.executable, "-c", LOOP, case, out, device], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode:
        raise SystemExit(f"{case}: rc {proc.returncode}\n{proc.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: run the loops, skip the checks")
    ap.add_argument("--only", nargs="*", default=list(EXPECT))
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import gpuscope

    failed = []
    for case in args.only:
        out = os.path.join(args.out, case)
        profile_case(case, out, args.device)
        rep = gpuscope.analyze(out)
        d = rep.to_dict()
        top = d["suggestions"][0] if d["suggestions"] else None
        words = " ".join([f"{top['current']} {top['why']}" if top else ""] + d["warnings"])
        knob, needs = EXPECT[case]
        ok = (top["knob"] if top else None) == knob and all(n in words for n in needs)
        line = {"case": case, "ok": ok, "device": args.device, "verdict": d["verdict"],
                "top": top["knob"] if top else None,
                "current": top["current"] if top else None,
                "step_ms": d["ranks"][0]["step_ms"] if d["ranks"] else None,
                "warnings": d["warnings"]}
        print(json.dumps(line), flush=True)
        if not ok and args.device == "cuda":
            failed.append(case)
    print(json.dumps({"failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
