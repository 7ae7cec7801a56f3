"""Issue 41's checks on a real GPU: tests/workloads/extra_op.py on CUDA, two ranks sharing GPU 0
over gloo, rank 1 running torch.linalg.svd once a step (timed by perf_counter between two
synchronizes). Three runs: profiled with the op, profiled without it, recorded with
record(modules=True) (module times from CUDA events). Prints one JSON line per check with the
figures, and exits non-zero when a check fails.

    python scripts/gpu_ops.py --out DIR [--size 1024] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
EXTRA_OP = os.path.join(ROOT, "tests", "workloads", "extra_op.py")


def run(out: str, extra_rank: int, size: int, device: str, *more: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         EXTRA_OP, "--out", out, "--extra-rank", str(extra_rank), "--size", str(size),
         "--device", device, *more], capture_output=True, text=True, timeout=180)
    if proc.returncode:
        raise SystemExit(f"{out}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    return out


def own_ms(out: str) -> float:
    with open(os.path.join(out, "extra-rank1.json")) as fh:
        return 1e3 * float(np.mean(json.load(fh)["extra_s"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="cpu: the same checks without a GPU")
    args = ap.parse_args()
    import gpuscope
    from gpuscope.analyze.compare import compare

    failed = []

    def check(name: str, ok: bool, **figures) -> None:
        print(json.dumps({"check": name, "ok": bool(ok), **figures}, default=str), flush=True)
        if not ok:
            failed.append(name)

    with_op = run(os.path.join(args.out, "with"), 1, args.size, args.device)
    without = run(os.path.join(args.out, "without"), -1, args.size, args.device)
    recorded = run(os.path.join(args.out, "recorded"), 1, args.size, args.device, "--record")

    rep = gpuscope.analyze(os.path.join(with_op, "kineto"))
    mine = own_ms(with_op)
    ops = rep.ops
    r1 = next(r for r in ops.ranks if r["rank"] == 1)
    r0 = next(r for r in ops.ranks if r["rank"] == 0)
    svd = next((o for o in r1.get("ops", []) if o["name"] == "aten::linalg_svd"), None)
    check("svd_on_rank1", svd is not None and not any(
        o["name"] == "aten::linalg_svd" for o in r0.get("ops", [])),
        own_ms=round(mine, 3), svd=svd,
        top_kernels_rank1=r1.get("kernels", [])[:4])
    s = next((s for s in rep.stragglers if s.rank == 1), None)
    top = s.ops[0] if s is not None and s.ops else None
    check("straggler_rank1_named_by_op", top is not None and top["only_here"] and (
        top["name"] == "aten::linalg_svd" or top["kind"] == "kernel"),
        straggler=None if s is None else {"rank": s.rank, "ops": s.ops[:3]},
        verdict=rep.verdict.label, own_ms=round(mine, 3))
    kb = ops.get("kernel_breakdown") or {}
    if args.device == "cuda":  # HTA's kernel breakdown: GPU kernels only
        check("kernel_breakdown", bool(kb), kernel_breakdown=kb)
    c = compare(gpuscope.analyze(os.path.join(without, "kineto")), rep)
    check("compare_names_the_op", bool(c.ops) and any(
        o["change"] == "appeared" and ("svd" in o["name"].lower() or o["kind"] == "kernel")
        for o in c.ops[:3]), compare_ops=c.ops[:4])

    rec = gpuscope.analyze(os.path.join(recorded, "record"))
    mine = own_ms(recorded)
    rr1 = next(r for r in rec.ops.ranks if r["rank"] == 1)
    mods = {m["name"]: m for m in rr1.get("modules", [])}
    ext = mods.get("extra", {}).get("per_step_ms")
    check("modules_on_cuda_events", set(mods) == {"body", "extra", "head"} and ext is not None
          and 0.5 * mine <= ext <= 1.5 * mine + 1.0
          and (args.device != "cuda" or "gpu_ms" in mods["extra"]), own_ms=round(mine, 3), modules=mods)
    s = next((s for s in rec.stragglers if s.rank == 1), None)
    top = s.ops[0] if s is not None and s.ops else None
    check("recorded_straggler_traced_to_module",
          top is not None and (top["kind"], top["name"]) == ("module", "extra"),
          straggler=None if s is None else {"rank": s.rank, "ops": s.ops[:3]},
          verdict=rec.verdict.label)
    print(json.dumps({"failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
