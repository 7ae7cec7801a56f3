"""Regenerate sample_traces/parallel/: a pipeline and a hybrid (data x pipeline) run on CPU/gloo,
recorded by gpuscope and profiled by torch.profiler at the same time
(tests/workloads/parallel.py under torchrun).

    python scripts/make_parallel_samples.py [--out sample_traces/parallel]

pipeline/  2 stages with torch.distributed.pipelining (ScheduleGPipe, 4 micro-batches); stage 1
           holds 6 layers, stage 0 two: pipeline-bound, stage 1 (rank 1) the slowest
hybrid/    4 ranks as 2 replicas x 2 stages, each stage's gradients all-reduced over its
           data-parallel group; rank 3 has 10 ms more device time per forward: imbalanced,
           rank 3 named in its data-parallel group (1, 3)
mesh2d/    4 ranks on a 2 x 2 DeviceMesh (tests/workloads/mesh.py --model block): FSDP2 over
           `dp`, tensor + sequence parallel over `tp` (the plan of pytorch/examples'
           fsdp_tp_example): communication by mesh dimension; exposed communication is most of
           each step on 2 shared cores (comm- or jitter-bound: the waiting moves between ranks)

Layers sleep for their "device time" (1 ms per layer and micro-batch forward, 2 ms backward) so
the stages run side by side as on separate GPUs. Never edit these files by hand; rerun this.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WORKLOADS = os.path.join("tests", "workloads")
DEVICE_MS = ["--device-ms", "1"]
SAMPLES = {
    "pipeline": {"nproc": 2, "workload": "parallel.py",
                 "args": ["--case", "pipeline", "--layers", "2,6", *DEVICE_MS],
                 "expected": "pipeline-bound", "stragglers": [], "slowest_rank": 1},
    "hybrid": {"nproc": 4, "workload": "parallel.py",
               "args": ["--case", "hybrid", "--slow-rank", "3", *DEVICE_MS],
               "expected": "imbalanced", "stragglers": [3], "slowest_rank": 3},
    "mesh2d": {"nproc": 4, "workload": "mesh.py", "args": ["--model", "block"], "steps": 8,
               "expected": ["comm-bound", "jitter-bound"], "stragglers": [],
               "slowest_rank": None, "dims": ["dp", "tp"]},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "sample_traces", "parallel"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", nargs="*", help="regenerate these samples, keep the others")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import gpuscope

    manifest = os.path.join(args.out, "MANIFEST.json")
    summary = {}
    if args.only and os.path.exists(manifest):
        with open(manifest) as fh:
            summary = json.load(fh)["samples"]
    for name, spec in SAMPLES.items():
        if args.only and name not in args.only:
            continue
        base = os.path.join(args.out, name)
        shutil.rmtree(base, ignore_errors=True)
        workload = os.path.join(WORKLOADS, spec["workload"])
        steps = spec.get("steps", args.steps)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(spec["nproc"]), os.path.join(ROOT, workload),
               *spec["args"], "--out", base, "--steps", str(steps), "--profile"]
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       stdout=subprocess.DEVNULL)
        for f in os.listdir(base):  # the workload's own timing is for tests, not a sample
            if f.startswith("timings-rank"):
                os.remove(os.path.join(base, f))
        got = {}
        for src in ("record", "kineto"):
            rep = gpuscope.analyze(os.path.join(base, src))
            got[src] = {"verdict": rep.verdict.label, "stragglers": rep.straggler_ranks,
                        "slowest_rank": rep.pipeline.slowest_rank if rep.pipeline else None}
            if rep.comm_by_group:
                got[src]["dims"] = sorted({g.dim for g in rep.comm_by_group if g.dim})
                got[src]["holds_back"] = (rep.layout.get("mesh") or {}).get("holds_back")
        sizes = [os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(base) for f in fs]
        summary[name] = {**{k: spec[k] for k in ("expected", "stragglers", "slowest_rank",
                                                 "dims") if k in spec},
                         "command": " ".join(["torchrun", "--nproc_per_node", str(spec["nproc"]),
                                              workload, *spec["args"], "--steps", str(steps),
                                              "--profile"]),
                         **got, "largest_file_bytes": max(sizes)}
        print(name, summary[name], flush=True)
    with open(manifest, "w") as fh:
        json.dump({"generated_by": "scripts/make_parallel_samples.py", "steps": args.steps,
                   "samples": summary}, fh, indent=2)


if __name__ == "__main__":
    main()
