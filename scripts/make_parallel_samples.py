"""Regenerate sample_traces/parallel/: a pipeline and a hybrid (data x pipeline) run on CPU/gloo,
recorded by gpuscope and profiled by torch.profiler at the same time
(tests/workloads/parallel.py under torchrun).

    python scripts/make_parallel_samples.py [--out sample_traces/parallel]

pipeline/  2 stages with torch.distributed.pipelining (ScheduleGPipe, 4 micro-batches); stage 1
           holds 6 layers, stage 0 two: pipeline-bound, stage 1 (rank 1) the slowest
hybrid/    4 ranks as 2 replicas x 2 stages, each stage's gradients all-reduced over its
           data-parallel group; rank 3 has 10 ms more device time per forward: imbalanced,
           rank 3 named in its data-parallel group (1, 3)

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
WORKLOAD = os.path.join(ROOT, "tests", "workloads", "parallel.py")
SAMPLES = {
    "pipeline": {"nproc": 2, "args": ["--case", "pipeline", "--layers", "2,6"],
                 "expected": "pipeline-bound", "stragglers": [], "slowest_rank": 1},
    "hybrid": {"nproc": 4, "args": ["--case", "hybrid", "--slow-rank", "3"],
               "expected": "imbalanced", "stragglers": [3], "slowest_rank": 3},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "sample_traces", "parallel"))
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import gpuscope

    summary = {}
    for name, spec in SAMPLES.items():
        base = os.path.join(args.out, name)
        shutil.rmtree(base, ignore_errors=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(spec["nproc"]), WORKLOAD, *spec["args"], "--out", base,
               "--steps", str(args.steps), "--device-ms", "1", "--profile"]
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
        sizes = [os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(base) for f in fs]
        summary[name] = {**{k: spec[k] for k in ("expected", "stragglers", "slowest_rank")},
                         "command": " ".join(["torchrun", "--nproc_per_node", str(spec["nproc"]),
                                              "tests/workloads/parallel.py", *spec["args"],
                                              "--device-ms", "1", "--profile"]),
                         **got, "largest_file_bytes": max(sizes)}
        print(name, summary[name], flush=True)
    with open(os.path.join(args.out, "MANIFEST.json"), "w") as fh:
        json.dump({"generated_by": "scripts/make_parallel_samples.py", "steps": args.steps,
                   "samples": summary}, fh, indent=2)


if __name__ == "__main__":
    main()
