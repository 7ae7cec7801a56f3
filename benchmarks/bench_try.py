"""Does `gpuscope try` settle what the model cannot? Trials, a repeat, and estimates after one
calibrating trial, against re-runs.

    python benchmarks/bench_try.py [--cases demo-data,nanogpt,...] [--pairs 2] [--keep DIR]

Per case (2 ranks, gloo, CPU), one command line with the knobs as {placeholders}, the same for
every run, so BEFORE, AFTER and the trials differ only in the values filled in:
1. BEFORE_0 is run and analysed; its top suggestion the command can set is the change applied
   (or the one a case names).
2. `gpuscope try BEFORE_0 --top 3 --precision 10 -- COMMAND` (2 rounds, more while a repeat's
   gain is not known within +-10%, up to 6 and 240 s of added rounds) with a calibration file of
   the case's own (the calibrating trial), then the same `try` again with calibration off and as
   many rounds (the repeat): does the repeat name the same best, and does its gain fall inside
   the first's interval?
3. AFTER_i and BEFORE_i+1 alternate --pairs times; each AFTER is scored against the mean of the
   estimates its neighbours BEFORE_i and BEFORE_i+1 give, the model's (calibration off) and the
   calibrated one (the case's file): the point within 15% of the re-run, the re-run inside the
   range, the range useful (within +-25% of its point).
Each run is ended by the recorder after a fixed count of optimizer steps ($GPUSCOPE_STOP_AFTER),
and measured as `gpuscope try` measures (the report's step, warm-up left out, on BEFORE's
basis); nanoGPT's own per-iteration clock is kept beside it.
Programs: the demo's scenarios; nanoGPT's train.py (public_nanogpt.py) and pytorch/examples'
minGPT-ddp (public_mingpt.py, needs hydra-core), each fetched at a pinned commit and edited only
to run on a CPU and to record.
Results: benchmarks/results/try.json and the table printed (markdown). `--keep DIR --rescore`
estimates a finished run's kept runs again with the checkout's analysis (nothing runs again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpuscope  # noqa: E402
import public_mingpt as mingpt  # noqa: E402
import public_nanogpt as nanogpt  # noqa: E402
from try_tables import table  # noqa: E402
from gpuscope import trials  # noqa: E402
from gpuscope.errors import GpuscopeError  # noqa: E402

PY, WORLD = sys.executable, 2
RUN = (PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD))
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
STEPS = 69  # optimizer steps a BEFORE or AFTER run records: 5 of warm-up (as try leaves out)
#: and 64 measured, two of the demo's 32-batch epochs


def demo(scenario: str, batch: int) -> dict:
    return {"program": "gpuscope demo", "cwd": None,
            "command": [*RUN, "-m", "gpuscope.demo.train", "--scenario", scenario, "--steps",
                        "100000", "--num-workers", "{num_workers}", "--batch-size",
                        "{batch_size}", "--sync-every", "{sync_frequency}"],
            "base": {"num_workers": 0, "batch_size": batch, "sync_frequency": 1}}


def nanogpt_case(accum: int) -> dict:
    """nanoGPT counts gradient_accumulation_steps over all ranks: {sync_frequency*2}."""
    return {"program": "nanoGPT", "cwd": "nanoGPT", "prepare": nanogpt.prepare,
            "command": [*RUN, "train.py", *" ".join(nanogpt.BASE).split(),
                        "--batch_size={batch_size}", "--block_size=16",
                        f"--gradient_accumulation_steps={{sync_frequency*{WORLD}}}",
                        "--max_iters=100000"],
            "base": {"batch_size": 2, "sync_frequency": accum}}


def mingpt_case(batch: int) -> dict:
    return {"program": "pytorch/examples minGPT-ddp", "cwd": "minGPT", "prepare": mingpt.prepare,
            "command": [*RUN, "main.py", *mingpt.BASE, "data_config.truncate=0.05",
                        "trainer_config.batch_size={batch_size}",
                        "trainer_config.data_loader_workers={num_workers}"],
            "base": {"batch_size": batch, "num_workers": 0}}


CASES = {
    "demo-data": demo("data", 16),
    "demo-comm": demo("comm", 2),
    "demo-comm-batch": {**demo("comm", 2), "apply": "batch_size"},
    "nanogpt": nanogpt_case(1),
    "nanogpt-batch": {**nanogpt_case(1), "apply": "batch_size"},
    "nanogpt-accum": nanogpt_case(2),
    "mingpt": mingpt_case(2),
}


def run(case: dict, values: dict, out: str, tmp: str) -> str:
    """One run of the case's command with `values`, STEPS optimizer steps; its run dir."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cwd = os.path.join(tmp, case["cwd"]) if case["cwd"] else None
    if cwd and not os.path.isdir(cwd):
        case["prepare"](cwd)
    every = values.get("sync_frequency", 1)
    env = dict(ENV, GPUSCOPE_RUN_DIR=os.path.join(out, "record"),
               GPUSCOPE_STOP_AFTER=str(STEPS * every), GPUSCOPE_CALIBRATION="off")
    cmd = trials.filled(case["command"], values)
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    with open(os.path.join(out, "stdout.txt"), "w") as fh:
        fh.write(proc.stdout)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return os.path.join(out, "record")


def estimate(run_dir: str, knob: str, proposed, calibration: str) -> tuple | None:
    """(point, low, high, what sets its range) BEFORE's report gives for knob -> proposed, with
    `calibration`: the clauses of the suggestion's why that speak of its range."""
    os.environ["GPUSCOPE_CALIBRATION"] = calibration
    try:
        rep = gpuscope.analyze(run_dir)
    finally:
        os.environ.pop("GPUSCOPE_CALIBRATION", None)
    s = next((s for s in rep.suggestions if s.knob == knob
              and trials.setting(s.proposed) == proposed), None)
    if s is None:
        return None
    lo, hi = s.estimated_step_ms_range or (s.estimated_step_ms,) * 2
    said = [c for c in s.why.split("; ") if "calibrated on this host" in c
            or "re-run's noise" in c]
    return s.estimated_step_ms, lo, hi, "; ".join(said)


def try_run(case: dict, report: str, out: str, calibration: str, tmp: str,
            rounds: list[str]) -> dict:
    """`gpuscope try REPORT --top 3 ROUNDS -- COMMAND`, its JSON."""
    cwd = os.path.join(tmp, case["cwd"]) if case["cwd"] else None
    js = out + ".json"
    cmd = [PY, "-m", "gpuscope", "try", report, "--top", "3", *rounds, "--out", out, "--json",
           js, "-q", "--", *case["command"]]
    t0 = time.time()
    proc = subprocess.run(cmd, env=dict(ENV, GPUSCOPE_CALIBRATION=calibration), cwd=cwd,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode not in (0, 3):
        sys.exit(f"gpuscope try failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    got = json.load(open(js))
    got["seconds"] = round(time.time() - t0)
    return got


def repeat_check(first: dict, second: dict) -> dict:
    """Does the repeat name the same best, and fall inside the first's spread (the step of
    each candidate, and each gain)?"""
    def rows(t):
        return {r["label"]: r for r in t.get("trials") or []}
    a, b = rows(first), rows(second)
    best = lambda rs: next((k for k, r in rs.items() if r.get("best")), None)  # noqa: E731
    held = {}
    for label, r in a.items():
        o = b.get(label)
        if not o or r.get("gain_pct_range") is None or o.get("gain_pct") is None:
            continue
        lo, hi = r["gain_pct_range"]  # hi None: no upper end
        held[label] = {"gain_pct": r["gain_pct"], "range": [lo, hi],
                       "repeat_gain_pct": o["gain_pct"],
                       "held": lo <= o["gain_pct"] <= (float("inf") if hi is None else hi)}
    return {"best": best(a), "repeat_best": best(b), "same_best": best(a) == best(b),
            "gains": held}


def score(est: tuple, measured: float, why: str = "") -> dict:
    point, lo, hi = est
    return {"range_why": why,"estimated_ms": round(point, 2), "range_ms": [round(lo, 2), round(hi, 2)],
            "error_pct": round(100 * (point - measured) / measured, 1),
            "within_15": abs(point - measured) <= 0.15 * measured,
            "in_range": lo <= measured <= hi,
            "useful": lo >= 0.75 * point and hi <= 1.25 * point}


def own_clock(case: dict, out: str, values: dict, base: dict) -> float | None:
    """nanoGPT's own time per iteration (rank 0's print), on BEFORE's basis: per its
    micro-steps per optimizer step and its batch."""
    if case["program"] != "nanoGPT":
        return None
    t = nanogpt.iteration_ms(open(os.path.join(out, "stdout.txt")).read())
    if not t:
        return None
    per_micro = float(np.median(t)) / values["sync_frequency"]
    return per_micro * base["sync_frequency"] * base["batch_size"] / values["batch_size"]


def run_case(name: str, pairs: int, tmp: str, rounds: list[str]) -> dict:
    case = CASES[name]
    base = dict(case["base"])
    b0 = run(case, base, os.path.join(tmp, f"{name}-before-0"), tmp)
    report = gpuscope.analyze(b0).to_dict()
    row = {"case": name, "program": case["program"], "verdict": report["verdict"],
           "command": " ".join(case["command"][len(RUN):]), "base": base}
    try:
        plan = trials.make_plan(report, case["command"], base=base)
    except GpuscopeError as exc:
        row["nothing_to_try"] = str(exc)
        return row
    # the change applied: the case's knob ("apply"), else try's first, the report's top one
    top = next((c for c in plan.candidates[1:] if c.knob == case.get("apply")),
               plan.candidates[1])
    row.update(knob=top.knob, proposed=top.values[top.knob],
               not_in_command=plan.not_in_command)
    cal = os.path.join(tmp, f"{name}-calibration.json")
    if os.path.exists(cal):
        os.remove(cal)
    first = try_run(case, b0, os.path.join(tmp, f"{name}-try-1"), cal, tmp, rounds)
    # the repeat: as many rounds as the first ran
    second = try_run(case, b0, os.path.join(tmp, f"{name}-try-2"), "off", tmp,
                     ["--repeats", str(first["repeats"])])
    row["try"] = {"first": first["trials"], "repeat": second["trials"],
                  "rounds": [first["repeats"], second["repeats"]],
                  "seconds": [first["seconds"], second["seconds"]],
                  **repeat_check(first, second)}
    befores, afters = [b0], []
    values = {**base, top.knob: top.values[top.knob]}
    for i in range(pairs):
        out = os.path.join(tmp, f"{name}-after-{i}")
        afters.append((run(case, values, out, tmp), out))
        befores.append(run(case, base, os.path.join(tmp, f"{name}-before-{i + 1}"), tmp))
    row["pairs"] = []
    before_ms = [trials.measured_step(b, plan, trials.Candidate("before", base))[0]
                 for b in befores]
    for i, (a, out) in enumerate(afters):
        measured, failed = trials.measured_step(a, plan, trials.Candidate("after", values,
                                                                           top.knob))
        near = [b for b in before_ms[i:i + 2] if b]
        p = {"measured_ms": round(measured, 2) if measured else None, "failed": failed,
             "before_ms": round(float(np.mean(near)), 2) if near else None,
             "own_clock_ms": own_clock(case, out, values, base)}
        p.update(scores(befores[i:i + 2], top.knob, top.values[top.knob], cal, measured))
        row["pairs"].append(p)
    return row


def scores(befores: list[str], knob: str, value, cal: str, measured: float | None) -> dict:
    """The model's and the calibrated estimate of knob -> value, each the mean of what the
    BEFOREs around an AFTER give, scored against its measured step."""
    out = {}
    for kind, where in (("model", "off"), ("calibrated", cal)):
        ests = [e for e in (estimate(b, knob, value, where) for b in befores) if e is not None]
        if ests and measured:
            out[kind] = score(tuple(float(np.mean([e[i] for e in ests])) for i in range(3)),
                              measured, ests[0][3])
    return out


def rescore(path: str, tmp: str) -> None:
    """The estimates of a finished benchmark's kept runs (--keep DIR) made again by this
    checkout's analysis, against the same measured re-runs and calibration files: nothing is
    run again."""
    d = json.load(open(path))
    for row in d["cases"]:
        name = row["case"]
        t = row.get("try")
        if t and all("rounds_ms" in r for r in t["first"] + t["repeat"]):
            t["first"], t["repeat"] = _regained(t["first"]), _regained(t["repeat"])
            t.update(repeat_check({"trials": t["first"]}, {"trials": t["repeat"]}))
        cal = os.path.join(tmp, f"{name}-calibration.json")
        for i, p in enumerate(row.get("pairs", [])):
            befores = [os.path.join(tmp, f"{name}-before-{j}", "record") for j in (i, i + 1)]
            for kind in ("model", "calibrated"):
                p.pop(kind, None)
            p.update(scores(befores, row["knob"], row["proposed"], cal, p.get("measured_ms")))
    d["rescored_by"] = _commit()
    with open(path, "w") as fh:
        json.dump(d, fh, indent=2)
    print("\n".join(table(d["cases"])))


def _regained(rows: list[dict]) -> list[dict]:
    """A try's rows with their gains' intervals made again by this checkout from each round's
    step (rounds_ms)."""
    cands = [trials.Candidate(r["label"], {}, r["knob"], steps_ms=list(r["rounds_ms"]))
             for r in rows]
    return [{**r, **{k: v for k, v in new.items() if k.startswith("gain")}}
            for r, new in zip(rows, trials.summary(cands))]


def _commit() -> str:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--keep", metavar="DIR", help="keep the runs here")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "try.json"))
    ap.add_argument("--rescore", action="store_true", help="with --keep: estimate the kept runs "
                    "of --json again with this checkout (runs nothing)")
    ap.add_argument("--precision", type=float, default=10.0, metavar="PCT",
                    help="the calibrating try's --precision (10; 0: its 2 rounds only)")
    ap.add_argument("--max-repeats", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=240.0, help="the calibrating try's "
                    "--budget-s for the rounds --precision adds (240)")
    args = ap.parse_args()
    if args.rescore:
        return rescore(args.json, args.keep)
    need = mingpt.missing()
    names = [n for n in args.cases.split(",") if not (need and n.startswith("mingpt"))]
    if need and len(names) < len(args.cases.split(",")):
        print(f"skipping minGPT-ddp: {need}", file=sys.stderr)
    tmp = args.keep or tempfile.mkdtemp(prefix="gpuscope-try-")
    os.makedirs(tmp, exist_ok=True)
    rows, t0 = [], time.time()
    rounds = ["--precision", f"{args.precision:g}", "--max-repeats", str(args.max_repeats),
              "--budget-s", f"{args.budget_s:g}"] if args.precision else []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_case(name, args.pairs, tmp, rounds))
        print("\n".join(table(rows[-1:])[2:]), file=sys.stderr, flush=True)
    print("\n".join(table(rows)))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"commit": _commit(), "pairs": args.pairs, "seconds": round(time.time() - t0),
                   "try_rounds": " ".join(rounds) or "--repeats 2",
                   "cpus": os.cpu_count(), "load": os.getloadavg(), "cases": rows}, fh, indent=2)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
