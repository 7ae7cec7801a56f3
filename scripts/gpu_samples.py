"""Copy the CUDA runs that scripts/gpu_check.sh made into sample_traces/cuda/, with a manifest.

    python scripts/gpu_samples.py GPU_RESULTS_DIR      # the folder gpu_runs.tgz was unpacked in

Takes `cuda_data` (1 rank, NCCL) and `cuda_imbalanced_gloo` (2 ranks on one GPU, gloo): each a
gpuscope run dir and the torch.profiler traces of the same run. The machine they ran on is read
from summary.txt beside the tarball when it is there. Never edit the copies by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

RUNS = {"cuda_data": ("data", "data-bound", "1 rank, NCCL, a Dataset that sleeps 2 ms per sample"),
        "cuda_imbalanced_gloo": ("imbalanced", "imbalanced",
                                 "2 ranks on one GPU, gloo; rank 1 runs an extra matmul loop")}


def main() -> None:
    import gpuscope

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--summary", help="gpu_check.sh's summary.txt (default: beside results)")
    ap.add_argument("--out", default=os.path.join(ROOT, "sample_traces", "cuda"))
    args = ap.parse_args()
    summary = args.summary or os.path.join(args.results, "..", "summary.txt")
    machine = open(summary).read().splitlines()[:2] if os.path.exists(summary) else []
    scenarios = {}
    for run, (name, expected, what) in RUNS.items():
        dst = os.path.join(args.out, name)
        shutil.rmtree(dst, ignore_errors=True)
        for src in ("record", "kineto"):
            shutil.copytree(os.path.join(args.results, run, src), os.path.join(dst, src))
        got = {src: gpuscope.analyze(os.path.join(dst, src)).verdict.label
               for src in ("record", "kineto")}
        scenarios[name] = {"expected": expected, **got, "run": what}
        print(name, scenarios[name])
    with open(os.path.join(args.out, "MANIFEST.json"), "w") as fh:
        json.dump({"generated_by": "scripts/gpu_check.sh, then scripts/gpu_samples.py",
                   "machine": machine, "steps": 40, "scenarios": scenarios}, fh, indent=2)


if __name__ == "__main__":
    main()
