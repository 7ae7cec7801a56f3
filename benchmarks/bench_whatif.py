"""Do gpuscope's estimates hold? Apply each case's top suggestion, re-run, and compare.

    python benchmarks/bench_whatif.py [--repeats 2] [--cases data,comm,...] [--keep DIR]

For every case (2 ranks, gloo, CPU): train BEFORE, analyse it, take the top suggestion (or the one a
case names), translate its proposed value into the training's own flag, train AFTER, and read the
predicted against the measured step time off `gpuscope compare BEFORE AFTER --json`. Each run is
repeated: the spread between repeats of one setting is the noise the error sits next to.

Cases: the demo's scenarios (gpuscope/demo/train.py) and, from tests/workloads/cases.py, an FSDP2
run; `comm-batch` applies the comm scenario's batch-size suggestion and `accum` the accumulation
suggestion on a run that already accumulates 4 micro-steps.
Results: benchmarks/results/whatif.json and the table printed (markdown, for the README).
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

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
DEMO = ("-m", "gpuscope.demo.train")
CASES_PY = (os.path.join(ROOT, "tests", "workloads", "cases.py"),)

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
    """Run one training under torchrun; returns its run dir."""
    stamp = os.path.join(out, "args.json")
    if REUSE and os.path.exists(stamp) and json.load(open(stamp)) == list(prog + args):
        return os.path.join(out, "record")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if prog == DEMO:
        run_dir, extra = os.path.join(out, "record"), ("--run-dir", os.path.join(out, "record"))
    else:
        run_dir, extra = os.path.join(out, "record"), ("--out", out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *prog, *args, *extra]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(stamp, "w") as fh:
        json.dump(list(prog + args), fh)
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


def spread_pct(values: list[float]) -> float:
    return 100 * (max(values) - min(values)) / np.mean(values) if len(values) > 1 else 0.0


def run_case(name: str, repeats: int, tmp: str) -> dict:
    prog, before, knob = CASES[name]
    befores = [train(prog, before, os.path.join(tmp, f"{name}-before-{i}")) for i in range(repeats)]
    rep = gpuscope.analyze(befores[0])
    sugs = [s for s in rep.suggestions if knob is None or s.knob == knob]
    row = {"case": name, "verdict": rep.verdict.label, "before_args": " ".join(before)}
    if not sugs:
        row["suggestion"] = None
        return row
    sug = sugs[0]
    args = after_args(prog, before, sug)
    row.update(knob=sug.knob, current=str(sug.current), proposed=str(sug.proposed),
               estimated_ms=round(sug.estimated_step_ms, 2),
               range_ms=[round(x, 2) for x in sug.estimated_step_ms_range or ()])
    if args is None:
        row["applied"] = False
        return row
    afters = [train(prog, args, os.path.join(tmp, f"{name}-after-{i}")) for i in range(repeats)]
    micro = float(np.median([s.micro_steps for s in rep.steps]))
    cmps = [compare(befores[0], a) for a in afters]
    preds = [next((p for p in c["predictions"] if p["knob"] == sug.knob), None) for c in cmps]
    if any(p is None for p in preds):
        row["applied"] = False
        row["note"] = "compare did not see the knob change"
        return row
    measured = [p["measured_ms"] for p in preds]
    before_ms = [step_ms(b, micro) for b in befores]
    lo, hi = sug.estimated_step_ms_range or (sug.estimated_step_ms, sug.estimated_step_ms)
    m = float(np.mean(measured))
    row.update(applied=True, after_args=" ".join(args), before_ms=round(float(np.mean(before_ms)), 2),
               measured_ms=round(m, 2), measured_each=[round(x, 2) for x in measured],
               error_pct=round(100 * (sug.estimated_step_ms - m) / m, 1),
               errors_each=[p["error_pct"] for p in preds],
               in_range=all(lo <= x <= hi for x in measured),
               range_pct=round(100 * (hi - lo) / 2 / ((hi + lo) / 2), 1),
               noise_before_pct=round(spread_pct(before_ms), 1),
               noise_after_pct=round(spread_pct(measured), 1))
    row["holds"] = abs(row["error_pct"]) <= 15 or (row["in_range"] and row["range_pct"] <= 25)
    return row


def table(rows: list[dict]) -> str:
    out = ["| case | suggestion | before | estimated (range) | measured after | error | "
           "in range | repeat noise | holds |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if not r.get("applied"):
            what = (f"{r['knob']} {r['current']} -> {r['proposed']}" if r.get("knob")
                    else "none")
            out.append(f"| {r['case']} | {what} | | | not applied | | | | |")
            continue
        rng = r["range_ms"] or [r["estimated_ms"]] * 2
        out.append(
            f"| {r['case']} | {r['knob']}: {r['current']} -> {r['proposed']} | "
            f"{r['before_ms']:.1f} ms | {r['estimated_ms']:.1f} ms ({rng[0]:.1f}-{rng[1]:.1f}) | "
            f"{r['measured_ms']:.1f} ms ({', '.join(f'{x:.1f}' for x in r['measured_each'])}) | "
            f"{r['error_pct']:+.1f}% | {'yes' if r['in_range'] else 'no'} | "
            f"before {r['noise_before_pct']:.0f}%, after {r['noise_after_pct']:.0f}% | "
            f"{'yes' if r['holds'] else 'NO'} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
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
        rows.append(run_case(name, args.repeats, tmp))
    print(table(rows))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"repeats": args.repeats, "seconds": round(time.time() - t0), "cpus": os.cpu_count(),
                   "torch": __import__("torch").__version__, "cases": rows}, fh, indent=2)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
