"""Recording overhead: the same 2-rank DDP run with and without gpuscope, side by side.

Runs are interleaved (without, with, without, with, ...) so that machine drift hits both alike;
the figure is the ratio of median step times over all steps of all runs (warm-up steps dropped).
A second, noise-free figure: the recorder's own cost per step (data wrapper + hooks + step()),
timed in a tight loop in one process, against the median step time.

    python benchmarks/bench_overhead.py [--scenario compute] [--runs 5] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpuscope.demo.launch import run_training  # noqa: E402


def step_times(path: str, record: bool, warmup: int) -> list[float]:
    out = []
    with open(path) as fh:
        for line in fh:
            d = json.loads(line)
            if d["record"] == record:
                out += d["step_s"][warmup:]
    return out


def recorder_cost_per_step(n: int = 20000) -> float:
    """Seconds per step that the recorder itself adds: data wrapper, a phase, step()."""
    import gpuscope

    with tempfile.TemporaryDirectory() as d:
        data = list(range(n))
        t = time.perf_counter()
        for _ in data:
            pass
        base = time.perf_counter() - t
        with gpuscope.record(d) as rec:
            t = time.perf_counter()
            for _ in rec.data(data):
                rec.step()
            spent = time.perf_counter() - t
    return (spent - base) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="compute")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "overhead.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        timings = os.path.join(tmp, "timings.jsonl")
        for i in range(args.runs):
            for record in (False, True):
                extra = ("--timings", timings) + (() if record else ("--no-record",))
                run_training(args.scenario, os.path.join(tmp, f"run{i}"), args.steps, 2,
                             extra=extra)
                print(f"run {i + 1}/{args.runs} {'with' if record else 'without'} gpuscope",
                      flush=True)
        without = step_times(timings, False, args.warmup)
        with_ = step_times(timings, True, args.warmup)
    med_without, med_with = statistics.median(without), statistics.median(with_)
    per_step = recorder_cost_per_step()
    result = {
        "scenario": args.scenario, "runs_each": args.runs, "steps_per_run": args.steps,
        "ranks": 2, "median_step_ms_without": round(med_without * 1e3, 3),
        "median_step_ms_with": round(med_with * 1e3, 3),
        "ratio_with_over_without": round(med_with / med_without, 4),
        "overhead_pct": round((med_with / med_without - 1) * 100, 2),
        "recorder_cost_us_per_step": round(per_step * 1e6, 2),
        "recorder_cost_pct_of_step": round(per_step / med_without * 100, 3),
        "cpu_count": os.cpu_count(),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
