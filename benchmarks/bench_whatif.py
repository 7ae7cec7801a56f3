"""Do gpuscope's estimates hold? Apply each case's top suggestion, re-run, and compare.

    python benchmarks/bench_whatif.py [--pairs 3] [--cases data,comm,...] [--keep DIR] [--reuse]

For every case (2 ranks, gloo, CPU): train BEFORE, analyse it, take the top suggestion (or the one a
case names), translate its proposed value into the training's own flag, and train AFTER; BEFORE
and AFTER alternate, BEFORE first and last (B0 A0 B1 A1 ... B_pairs), so the machine's drift falls
on both. Each AFTER is scored on its own: the mean of the estimates its neighbours BEFORE_i and
BEFORE_i+1 give for the change against AFTER_i's step, on BEFORE's basis (its micro-steps per
optimizer step, its batch). The measured step is the program's own
clock where it has one (nanoGPT prints its time per iteration), else `gpuscope compare`'s.

Cases: the demo's scenarios (gpuscope/demo/train.py); from tests/workloads/cases.py, an FSDP2
run; `comm-batch` applies the comm scenario's batch-size suggestion and `accum` the accumulation
suggestion on a run that already accumulates 4 micro-steps; nanoGPT's train.py at a pinned
commit, edited only to run on a CPU and to record (benchmarks/public_nanogpt.py).
Scored per pair: the point within 15% of the re-run, the re-run inside the stated range, and the
range useful (within +-25% of its point).
Results: benchmarks/results/whatif.json and the table printed (markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import gpuscope  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import public_nanogpt as nanogpt  # noqa: E402
from whatif_tables import rows_table  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
DEMO = ("-m", "gpuscope.demo.train")
CASES_PY = (os.path.join(ROOT, "tests", "workloads", "cases.py"),)

NANOGPT = ("nanoGPT/train.py",)
PROGRAMS = {DEMO: "gpuscope demo", CASES_PY: "tests/workloads", NANOGPT: "nanoGPT"}
WORLD = 2
NG = " ".join(nanogpt.BASE).split()

#: name -> (program, BEFORE args, the suggestion's knob to apply or None for the top one)
#: demo runs of 70 steps span two epochs of 32 full batches and a half one (its size tells how
#: compute grows with the batch) and the workers' restart between epochs
CASES = {
    "data": (DEMO, ("--scenario", "data", "--steps", "70"), None),
    "comm": (DEMO, ("--scenario", "comm", "--steps", "70"), None),
    "comm-batch": (DEMO, ("--scenario", "comm", "--steps", "70"), "batch_size"),
    "imbalanced": (DEMO, ("--scenario", "imbalanced", "--steps", "70"), None),
    "accum": (DEMO, ("--scenario", "comm", "--steps", "140", "--sync-every", "4"), None),
    "fsdp": (CASES_PY, ("--case", "fsdp2", "--steps", "12"), None),
    # nanoGPT (public_nanogpt.py): a micro-batch of 2 x 16 tokens, each rank synchronizing
    # every micro-step (gradient_accumulation_steps counts over the 2 ranks)
    "nanogpt-comm": (NANOGPT, (*NG, "--batch_size=2", "--block_size=16",
                               "--gradient_accumulation_steps=2", "--max_iters=40"), None),
    "nanogpt-batch": (NANOGPT, (*NG, "--batch_size=2", "--block_size=16",
                                "--gradient_accumulation_steps=2", "--max_iters=40"),
                      "batch_size"),
    "nanogpt-accum": (NANOGPT, (*NG, "--batch_size=2", "--block_size=16",
                                "--gradient_accumulation_steps=4", "--max_iters=30"), None),
}


def after_args(prog: tuple, before: tuple, sug) -> tuple | None:
    """The BEFORE command line with the suggestion applied, or None when it cannot be."""
    args = list(before)

    def setflag(flag: str, value) -> None:
        if flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args.extend([flag, str(value)])

    demo = prog == DEMO
    knob, proposed = sug.knob, str(sug.proposed)
    if knob == "num_workers" and demo:
        setflag("--num-workers", proposed)
    elif knob == "batch_size":
        setflag("--batch-size" if demo else "--batch", proposed)
    elif knob == "sync_frequency":
        k = int(re.findall(r"\d+", proposed)[-1])
        if demo:
            setflag("--sync-every", k)
            steps = int(args[args.index("--steps") + 1])
            setflag("--steps", max(steps, 6 * k))  # enough whole cycles after warm-up
        else:
            setflag("--accum", k)
    elif knob == "straggler" and demo:
        setflag("--extra-ms", 0)
    elif knob == "reshard_after_forward" and not demo:
        args.append("--no-reshard")
    else:
        return None
    return tuple(args)


REUSE = False  # --reuse: keep run dirs that --keep already holds for the same command line


def train(prog: tuple, args: tuple, out: str) -> str:
    """Run one training under torchrun; returns its run dir (stdout kept in out/stdout.txt)."""
    stamp, line = os.path.join(out, "args.json"), list(prog + args)
    run_dir = os.path.join(out, "record")
    if REUSE and os.path.exists(stamp) and json.load(open(stamp)) == line:
        return run_dir
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env, cwd, extra = ENV, None, ()
    if prog == DEMO:
        extra = ("--run-dir", run_dir)
    elif prog == NANOGPT:
        cwd = os.path.join(os.path.dirname(out), "nanoGPT")
        if not os.path.exists(os.path.join(cwd, "train.py")):
            nanogpt.prepare(cwd)
        env = dict(ENV, GPUSCOPE_RUN_DIR=run_dir)
        prog = ("train.py",)
    else:
        extra = ("--out", out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(WORLD), *prog, *args, *extra]
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "stdout.txt"), "w") as fh:
        fh.write(proc.stdout)
    with open(stamp, "w") as fh:
        json.dump(line, fh)
    return run_dir


def compare(before: str, after: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        proc = subprocess.run([sys.executable, "-m", "gpuscope", "compare", before, after,
                               "--json", fh.name, "-q"], capture_output=True, text=True, env=ENV)
        if proc.returncode not in (0, 3):
            sys.exit(f"gpuscope compare failed: {proc.stderr}")
        return json.load(open(fh.name))


def step_ms(run_dir: str, micro_per_row: float) -> float:
    """Mean time per step of BEFORE's shape (its micro-steps per row)."""
    rep = gpuscope.analyze(run_dir)
    t = [s.step_ns / max(s.micro_steps, 1) for s in rep.steps]
    return float(np.mean(t)) / 1e6 * micro_per_row


def nanogpt_after(args: tuple, sug) -> tuple | None:
    """nanoGPT's flags for a suggestion: its gradient_accumulation_steps counts micro-steps over
    all ranks (train.py divides it by the world size)."""
    if sug.knob == "sync_frequency":
        k = int(re.findall(r"\d+", str(sug.proposed))[-1])
        gas = nanogpt.flag(args, "gradient_accumulation_steps")
        per_rank = k * gas // WORLD // max(gas // WORLD, 1)
        iters = max(nanogpt.WARMUP_ITERS + 6, 8 * 32 // max(per_rank, 1))
        return nanogpt.set_flag(nanogpt.set_flag(args, "gradient_accumulation_steps",
                                                 per_rank * WORLD), "max_iters", iters)
    if sug.knob == "batch_size":
        return nanogpt.set_flag(args, "batch_size", int(sug.proposed))
    return None


def pair_estimate(run_dir: str, knob: str, proposed: str):
    """The estimate BEFORE's report gives for the change applied (the same knob and value)."""
    rep = gpuscope.analyze(run_dir)
    s = next((s for s in rep.suggestions if s.knob == knob and str(s.proposed) == proposed), None)
    if s is None:
        return None
    lo, hi = s.estimated_step_ms_range or (s.estimated_step_ms, s.estimated_step_ms)
    return s.estimated_step_ms, lo, hi


def truth_ms(prog: tuple, before: tuple, after: tuple, out: str, micro_before: float) -> float | None:
    """An independent clock where the program has one (nanoGPT's own per-iteration time), on
    BEFORE's basis: the time of BEFORE's micro-steps per optimizer step and BEFORE's batch."""
    if prog != NANOGPT:
        return None
    t = nanogpt.iteration_ms(open(os.path.join(out, "stdout.txt")).read())
    if not t:
        return None
    micro_after = nanogpt.flag(after, "gradient_accumulation_steps") / WORLD
    per_micro = float(np.mean(t)) / micro_after
    ratio = nanogpt.flag(before, "batch_size") / nanogpt.flag(after, "batch_size")
    return per_micro * ratio * micro_before


def run_case(name: str, pairs: int, tmp: str) -> dict:
    """BEFORE and AFTER alternated, BEFORE first and last (B0 A0 B1 A1 ... B_n): each AFTER_i is
    scored against the mean of the estimates its two neighbours BEFORE_i and BEFORE_i+1 give, so
    that a machine drifting across the pair falls on both sides."""
    prog, before, knob = CASES[name]
    b0 = train(prog, before, os.path.join(tmp, f"{name}-before-0"))
    rep = gpuscope.analyze(b0)
    sugs = [s for s in rep.suggestions if knob is None or s.knob == knob]
    row = {"case": name, "program": PROGRAMS[prog], "verdict": rep.verdict.label,
           "before_args": " ".join(before)}
    if not sugs:
        row["suggestion"] = None
        return row
    sug = sugs[0]
    args = nanogpt_after(before, sug) if prog == NANOGPT else after_args(prog, before, sug)
    row.update(knob=sug.knob, current=str(sug.current), proposed=str(sug.proposed))
    if args is None:
        row["applied"] = False
        return row
    micro = float(np.median([s.micro_steps for s in rep.steps]))
    row.update(applied=True, after_args=" ".join(args), pairs=[])
    befores, afters = [b0], []
    for i in range(pairs):
        out = os.path.join(tmp, f"{name}-after-{i}")
        afters.append((train(prog, args, out), out))
        befores.append(train(prog, before, os.path.join(tmp, f"{name}-before-{i + 1}")))
    for i, (a, out) in enumerate(afters):
        ests = [pair_estimate(b, sug.knob, str(sug.proposed)) for b in befores[i:i + 2]]
        ests = [e for e in ests if e is not None]
        pred = next((p for p in compare(befores[i], a)["predictions"]
                     if p["knob"] == sug.knob), None)
        if not ests or pred is None:
            row["pairs"].append({"estimate": None, "note": "BEFORE did not suggest it again"
                                 if not ests else "compare did not see the change"})
            continue
        point, lo, hi = (float(np.mean(x)) for x in zip(*ests))
        clock = truth_ms(prog, before, args, out, micro)
        m = clock if clock is not None else pred["measured_ms"]
        row["pairs"].append({
            "before_ms": round(float(np.mean([step_ms(b, micro) for b in befores[i:i + 2]])), 2),
            "estimates": len(ests), "estimated_ms": round(point, 2),
            "range_ms": [round(lo, 2), round(hi, 2)], "measured_ms": round(m, 2),
            "measured_by": "program's clock" if clock is not None else "gpuscope compare",
            "gpuscope_measured_ms": round(pred["measured_ms"], 2),
            "error_pct": round(100 * (point - m) / m, 1), "in_range": lo <= m <= hi,
            "useful": lo >= 0.75 * point and hi <= 1.25 * point})
    done = [p for p in row["pairs"] if p.get("estimate", True) is not None]
    if done:
        row["within_15"] = sum(abs(p["error_pct"]) <= 15 for p in done)
        row["in_range"] = sum(p["in_range"] for p in done)
        row["useful"] = sum(p["useful"] for p in done)
        row["scored"] = len(done)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3,
                    help="BEFORE and AFTER runs alternated this many times per case")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--keep", metavar="DIR", help="keep the run dirs here")
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep: reuse the runs already there (re-estimate, no re-training)")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "whatif.json"))
    args = ap.parse_args()
    global REUSE
    REUSE = args.reuse and bool(args.keep)
    tmp = args.keep or tempfile.mkdtemp(prefix="gpuscope-whatif-")
    rows = []
    t0 = time.time()
    for name in args.cases.split(","):
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_case(name, args.pairs, tmp))
    print("\n".join(rows_table(rows)))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        json.dump({"pairs": args.pairs, "commit": commit, "seconds": round(time.time() - t0), "cpus": os.cpu_count(),
                   "torch": __import__("torch").__version__, "cases": rows}, fh, indent=2)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
