"""Recording overhead on training loops shaped like other people's code, timed by the loops
themselves: each workload runs with gpuscope and with it switched off (GPUSCOPE_DISABLE=1, the
same code path a user would switch), side by side.

The workloads are tests/workloads/cases.py (a nanoGPT-style loop with 4 micro-steps per
optimizer step, DDP no_sync accumulation, FSDP2, the DDP tutorial's tiny model) and
tests/workloads/trainers.py (transformers' Trainer and Lightning's Trainer with gpuscope's
one-line callback), 2 ranks under torchrun (gloo, CPU). Every one of them notes perf_counter at
each micro-step itself; gpuscope's numbers are not used here.

Runs are interleaved: each round runs every workload without and with gpuscope, the order of
the pair alternating from round to round, so that this VM's drift hits both alike. Per run: the
steady-state wall time per micro-step (warm-up micro-steps left out), the slower rank's; per
workload: the median over runs of each variant, and the median of the rounds' paired ratios.
The four short loops get 3x the rounds (ROUNDS_FACTOR): their short runs are noisier.

    python benchmarks/bench_overhead_cases.py [--rounds 4] [--only nanogpt,hf]
    # on a GPU machine: each rank on a GPU (NCCL; gloo when ranks share one), runs 4x longer
    python benchmarks/bench_overhead_cases.py --device cuda --nproc 1 --longer 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from measured import commit  # noqa: E402  (benchmarks/measured.py)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from gpuscope.run_format import FILE_SUFFIX  # noqa: E402

CASES = os.path.join(ROOT, "tests", "workloads", "cases.py")
TRAINERS = os.path.join(ROOT, "tests", "workloads", "trainers.py")

#: name -> (script, its arguments, warm-up micro-steps left out, what it is)
WORKLOADS = {
    "nanogpt": (CASES, ["--case", "nanogpt", "--steps", "24"], 8,
                "nanoGPT-style GPT, top-level loop, 4 micro-steps per optimizer step"),
    "no_sync": (CASES, ["--case", "no_sync", "--steps", "120"], 8,
                "DDP MLP, 8 micro-steps per optimizer step under no_sync()"),
    "fsdp2": (CASES, ["--case", "fsdp2", "--steps", "40"], 4,
              "FSDP2 (fully_shard per layer) on a wide MLP"),
    "tutorial": (CASES, ["--case", "tutorial", "--epochs", "30"], 8,
                 "pytorch/examples' DDP tutorial: Linear(20, 1), DataLoader, batch 32"),
    "hf": (TRAINERS, ["--trainer", "hf", "--steps", "48", "--accum", "2"], 4,
           "transformers Trainer, tiny GPT-2, accumulation 2, GpuscopeCallback"),
    "lightning": (TRAINERS, ["--trainer", "lightning", "--steps", "400"], 4,
                  "Lightning Trainer, DDP strategy, MLP, GpuscopeCallback"),
}

#: the short runs (loops of 2-8 ms, a few seconds each) swing far more from run to run on 2
#: shared cores (one set of 4 tutorial rounds: 0.57-2.36; Lightning's 4 rounds gave a median of
#: 1.13 where 12 gave 0.97): they get this many times the rounds, and then a 95% confidence
#: interval of their median can be given
ROUNDS_FACTOR = {"no_sync": 3, "tutorial": 3, "hf": 3, "lightning": 3}


def micro_steps(out: str) -> list[list[float]]:
    """Each rank's micro-step durations (s) as the loop timed them."""
    ranks = []
    for name in sorted(os.listdir(out)):
        if name.startswith("timings-rank") and name.endswith(".json"):
            with open(os.path.join(out, name)) as fh:
                d = json.load(fh)
            if "micro_s" in d:
                ranks.append(d["micro_s"])
            else:  # the trainers note the end of each micro-step
                marks = d["micro_end_s"]
                ranks.append([b - a for a, b in zip(marks, marks[1:])])
    return ranks


def longer(args: list[str], factor: int) -> list[str]:
    """The workload's arguments with its --steps / --epochs multiplied by factor."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in ("--steps", "--epochs"):
            out[i + 1] = str(int(out[i + 1]) * factor)
    return out


def run_once(name: str, record: bool, tmp: str, opts) -> float:
    """Steady-state seconds per micro-step of one run: the slower rank's mean."""
    script, args, warm, _ = WORKLOADS[name]
    args = longer(args, opts.longer) + (["--device", opts.device] if opts.device != "cpu" else [])
    out = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("GPUSCOPE_DISABLE", None)
    if not record:
        env["GPUSCOPE_DISABLE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(opts.nproc), script, *args, "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode:
        sys.exit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    ranks = micro_steps(out)
    rec_dir = os.path.join(out, "record")
    recorded = os.path.isdir(rec_dir) and any(f.endswith(FILE_SUFFIX) for f in os.listdir(rec_dir))
    if recorded != record:  # the switch did not do what it says: the comparison would be void
        sys.exit(f"{name}: expected {'a' if record else 'no'} recording in {out}")
    if len(ranks) != opts.nproc or min(len(r) for r in ranks) <= warm:
        sys.exit(f"{name}: timings missing in {out}")
    return max(statistics.fmean(r[warm:]) for r in ranks)




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "overhead_cases.json"))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc_per_node)")
    ap.add_argument("--longer", type=int, default=1, help="multiply each run's steps by this")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        sys.exit(f"unknown workload(s): {sorted(unknown)}; known: {sorted(WORKLOADS)}")
    runs: dict[str, dict[bool, list[float]]] = {n: {False: [], True: []} for n in names}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds * max(ROUNDS_FACTOR.get(n, 1) for n in names)):
            for name in names:
                if i >= args.rounds * ROUNDS_FACTOR.get(name, 1):
                    continue
                for record in ((False, True) if i % 2 == 0 else (True, False)):
                    runs[name][record].append(run_once(name, record, tmp, args))
                w, o = runs[name][True][-1], runs[name][False][-1]
                print(f"round {i + 1}/{args.rounds * ROUNDS_FACTOR.get(name, 1)} {name}: {o * 1e3:.2f} ms without, "
                      f"{w * 1e3:.2f} ms with", flush=True)
    result = {"rounds": args.rounds, "ranks": args.nproc, "device": args.device,
              "backend": "gloo" if args.device == "cpu" else "nccl (one GPU per rank), else gloo",
              "steps_factor": args.longer, "cpu_count": os.cpu_count(), "commit": commit(),
              "seconds": round(time.perf_counter() - t0, 1),
              "workloads": {}}
    print(f"\n{'workload':<10} {'without':>9} {'with':>9} {'ratio':>6}  paired ratios")
    for name in names:
        without, with_ = runs[name][False], runs[name][True]
        paired = [w / o for w, o in zip(with_, without)]
        med_o, med_w = statistics.median(without), statistics.median(with_)
        result["workloads"][name] = {
            "what": WORKLOADS[name][3],
            "rounds": len(paired),
            "micro_step_ms_without": round(med_o * 1e3, 3),
            "micro_step_ms_with": round(med_w * 1e3, 3),
            "ratio_of_medians": round(med_w / med_o, 4),
            "paired_ratio_median": round(statistics.median(paired), 4),
            "paired_ratios": [round(p, 4) for p in paired],
            "runs_ms_without": [round(x * 1e3, 3) for x in without],
            "runs_ms_with": [round(x * 1e3, 3) for x in with_],
        }
        print(f"{name:<10} {med_o * 1e3:8.2f}ms {med_w * 1e3:8.2f}ms {med_w / med_o:6.3f}  "
              f"{min(paired):.3f}-{max(paired):.3f} (median {statistics.median(paired):.3f})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
