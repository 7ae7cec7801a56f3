"""gpuscope's figures on Trainers and parallel layouts against independent timing, and its
estimates against the run that makes the change.

    python benchmarks/bench_parallel.py [--repeats 2]

1. transformers' Trainer and Lightning's Trainer (tests/workloads/trainers.py, 2 ranks, gloo),
   with and without accumulation: gpuscope's mean optimizer step against a plain callback's
   perf_counter at every micro-step end.
2. pipeline (tests/workloads/parallel.py, torch.distributed.pipelining, 2 stages, 4
   micro-batches, layers 2 + 6): the repartition gpuscope suggests, its estimated step against
   the median step of the run with layers 4 + 4.
3. hybrid 2 x 2 with rank 3 slowed: the straggler suggestion's estimate against the median step
   of the same run without the slow rank.
Each run is repeated; results land in benchmarks/results/parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import gpuscope  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def torchrun(nproc: int, script: str, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(nproc), os.path.join(ROOT, script), *args],
                          env=ENV, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{script} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def trainer_case(trainer: str, accum: int, tmp: str) -> dict:
    out = os.path.join(tmp, f"{trainer}{accum}")
    os.makedirs(out)
    torchrun(2, "tests/workloads/trainers.py", "--trainer", trainer, "--accum", str(accum),
             "--out", out)
    rep = gpuscope.analyze(os.path.join(out, "record"))
    ours, theirs = [], []
    for r in rep.ranks:
        marks = np.array(json.load(open(os.path.join(out, f"timings-rank{r.rank}.json")))
                         ["micro_end_s"]) * 1e3
        micro = np.diff(marks)
        n = (len(micro) + 1) // accum * accum - 1
        cycles = np.r_[np.nan, micro[:n]].reshape(-1, accum)[1:].sum(axis=1)
        ours.append(r.step_ns / 1e6)
        theirs.append(float(cycles.mean()))
    return {"gpuscope_step_ms": round(float(np.mean(ours)), 2),
            "perf_counter_step_ms": round(float(np.mean(theirs)), 2),
            "ratio": round(float(np.mean(ours) / np.mean(theirs)), 4),
            "verdict": rep.verdict.label}


def parallel_run(tmp: str, name: str, nproc: int, *args: str):
    out = os.path.join(tmp, name)
    torchrun(nproc, "tests/workloads/parallel.py", "--out", out, "--steps", "16",
             "--device-ms", "1", *args)
    rep = gpuscope.analyze(os.path.join(out, "record"))
    return rep, float(np.median([s.step_ns for s in rep.steps])) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    results: dict = {"trainers": {}, "pipeline_repartition": [], "hybrid_straggler": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for trainer in ("hf", "lightning"):
                for accum in (1, 4):
                    r = trainer_case(trainer, accum, os.path.join(tmp, f"t{i}"))
                    results["trainers"].setdefault(f"{trainer} accum {accum}", []).append(r)
                    print(trainer, accum, r, flush=True)
            t = os.path.join(tmp, f"p{i}")
            before, step_before = parallel_run(t, "2_6", 2, "--case", "pipeline", "--layers", "2,6")
            top = before.suggestions[0]
            _, step_after = parallel_run(t, "4_4", 2, "--case", "pipeline", "--layers", "4,4")
            r = {"verdict": before.verdict.label, "slowest_rank": before.pipeline.slowest_rank,
                 "suggestion": f"{top.knob}: {top.proposed}", "step_ms": round(step_before, 1),
                 "estimated_ms": round(top.estimated_step_ms, 1),
                 "measured_4_4_ms": round(step_after, 1),
                 "error": round(top.estimated_step_ms / step_after - 1, 3)}
            results["pipeline_repartition"].append(r)
            print("pipeline", r, flush=True)
            slow, step_slow = parallel_run(t, "hyb_slow", 4, "--case", "hybrid", "--slow-rank", "3")
            _, step_even = parallel_run(t, "hyb_even", 4, "--case", "hybrid")
            top = slow.suggestions[0]
            r = {"verdict": slow.verdict.label, "stragglers": slow.straggler_ranks,
                 "group": slow.stragglers[0].group if slow.stragglers else [],
                 "suggestion": f"{top.knob}: {top.current}", "step_ms": round(step_slow, 1),
                 "estimated_ms": round(top.estimated_step_ms, 1),
                 "measured_without_slow_rank_ms": round(step_even, 1),
                 "error": round(top.estimated_step_ms / step_even - 1, 3)}
            results["hybrid_straggler"].append(r)
            print("hybrid", r, flush=True)
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "parallel.json"), "w") as fh:
        json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
