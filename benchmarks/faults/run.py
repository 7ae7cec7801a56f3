"""The fault benchmark: real training runs with a known rank slowed by a known amount, each read by
gpuscope from its record and from its torch.profiler traces, scored against the injection and the
loop's own clock (benchmarks/faults/score.py).

    python benchmarks/faults/run.py                      # the whole table (`make bench-faults`)
    python benchmarks/faults/run.py --quick              # one row per kind, 2 ranks (the CI subset)
    python benchmarks/faults/run.py --only ddp:4 --kinds forward,comm --seed 3

For each configuration (parallelism x ranks) a control runs first: its step is the base the
faults are sized on (a fraction of the step drawn per row, 5% to 100%) and the step a fixed
run should return to; a second control runs last, and the estimate of each row is scored
against the two controls' mean. The slowed rank is drawn at random (seeded). Results go to
benchmarks/results/faults.json (`--out`); docs/accuracy.md's fault tables are written from it
(scripts/accuracy.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from design import CONFIGS, KINDS  # noqa: E402,F401  (KINDS: tests/test_faults.py reads it here)
from measured import commit  # noqa: E402  (benchmarks/measured.py)
from score import score, truth  # noqa: E402
from tables import brief, write  # noqa: E402
from train import ACCUM  # noqa: E402

FRACTIONS = (0.05, 0.1, 0.25, 0.5, 1.0)
STEPS = 24
WORKERS = 2


def applies(kind: str, parallel: str, world: int) -> bool:
    if kind == "comm":
        return parallel not in ("fsdp2", "pipeline")  # a DDP comm hook
    if kind == "two" and parallel == "pipeline":
        return False  # both replicas of one stage slowed is a heavy stage, not two stragglers
    if kind == "two":
        return world >= 3  # two of two slowed is nobody slowed
    return True


def train(out: str, parallel: str, world: int, fault: str, ranks: list, ms: float,
          workers: int = 0, timeout: float = 600) -> float:
    """One training run into `out`; its wall seconds. Raises CalledProcessError on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={world}", os.path.join(HERE, "train.py"), "--out", out,
           "--parallel", parallel, "--fault", fault, "--ranks", ",".join(map(str, ranks)),
           "--ms", f"{ms:.3f}", "--workers", str(workers), "--steps", str(STEPS)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return time.perf_counter() - t0


def reports(out: str) -> dict:
    """{source: JSON report} of one run: its record and its traces."""
    import gpuscope

    got = {}
    for source, sub in (("record", "record"), ("kineto", "kineto")):
        try:
            got[source] = gpuscope.analyze(os.path.join(out, sub)).to_dict()
        except Exception as exc:  # scored as wrong, with the reason
            got[source] = {"error": f"{type(exc).__name__}: {exc}"}
    return got


def plan(configs, kinds, rng: random.Random, quick: bool) -> list[dict]:
    """The rows: per configuration a control, each kind with a drawn rank and fraction, a
    control again."""
    rows = []
    for parallel, world in configs:
        todo = [k for k in kinds if k != "control" and applies(k, parallel, world)]
        rows.append({"parallel": parallel, "world": world, "kind": "control"})
        for kind in todo:
            ranks = sorted(rng.sample(range(world), 2 if kind == "two" else 1))
            frac = 0.5 if quick else rng.choice(FRACTIONS)
            rows.append({"parallel": parallel, "world": world, "kind": kind, "ranks": ranks,
                         "fraction": frac})
        rows.append({"parallel": parallel, "world": world, "kind": "control"})
    return rows


def fault_args(row: dict, base_ms: float) -> tuple[str, list, float, int]:
    """(train.py's fault, ranks, ms, workers) of a row sized on the control's step."""
    kind = row["kind"]
    if kind == "control":
        return "control", [], 0.0, 0
    ms = row["fraction"] * base_ms
    if row.get("parallel") == "accum" and kind not in ("optimizer", "between", "comm"):
        ms /= ACCUM  # added in each micro-step: the fraction is of the optimizer step
    if kind == "two":
        return "forward", row["ranks"], ms, 0
    if kind == "data_workers":
        return "data", row["ranks"], ms, WORKERS
    return kind, row["ranks"], ms, 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one row per kind, 2 ranks, DDP")
    ap.add_argument("--only", help="configurations, e.g. ddp:2,accum:2")
    ap.add_argument("--kinds", help="comma-separated kinds (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "faults.json"))
    ap.add_argument("--keep", metavar="DIR", help="keep every run's files here")
    ap.add_argument("--rescore", metavar="FILE", help="score the rows of a results file again "
                    "from the reports it keeps, by today's score.py (no training)")
    args = ap.parse_args()
    if args.rescore:
        with open(args.rescore) as fh:
            doc = json.load(fh)
        for row in doc["rows"]:
            if "reports" in row:
                row["scores"] = {src: ({"right": False, "error": rep["error"]} if "error" in rep
                                       else score(row["kind"], row["truth"], rep,
                                                  row.get("control_step_ms")))
                                 for src, rep in row["reports"].items()}
        write(doc, args.rescore)
        for line in summary_lines(doc["rows"]):
            print(line)
        return
    configs = CONFIGS[:1] if args.quick else CONFIGS
    if args.only:
        configs = tuple((p, int(w)) for p, w in (c.split(":") for c in args.only.split(",")))
    kinds = tuple(args.kinds.split(",")) if args.kinds else KINDS
    rng = random.Random(args.seed)
    rows = plan(configs, kinds, rng, args.quick)
    t0 = time.perf_counter()
    base: dict = {}      # (parallel, world) -> the first control's step ms
    controls: dict = {}  # (parallel, world) -> control steps ms
    done = []
    for i, row in enumerate(rows):
        key = (row["parallel"], row["world"])
        fault, ranks, ms, workers = fault_args(row, base.get(key, 0.0))
        tmp = tempfile.mkdtemp(prefix="gpuscope-fault-")
        try:
            try:
                row["seconds"] = round(train(tmp, row["parallel"], row["world"], fault, ranks,
                                             ms, workers), 1)
            except subprocess.CalledProcessError as exc:
                row["failed"] = (exc.stderr or "")[-2000:]
                print(f"{i:3d} {key} {row['kind']}: the training failed", flush=True)
                done.append(row)
                continue
            t = truth(tmp)
            row.update(ms=round(ms, 3), workers=workers, truth=t)
            if row["kind"] == "control":
                controls.setdefault(key, []).append(t["step_ms"])
                base.setdefault(key, t["step_ms"])
            row["reports"] = reports(tmp)
            if args.keep:
                shutil.copytree(tmp, os.path.join(args.keep, f"{i:03d}-{row['parallel']}"
                                                  f"{row['world']}-{row['kind']}"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        done.append(row)
        print(f"{i:3d} {key} {row['kind']:12s} ranks {row.get('ranks', [])} "
              f"{row.get('ms', 0):7.2f} ms: step {t['step_ms']:.1f} ms", flush=True)
    # scored once both controls of a configuration are in
    for row in done:
        if "reports" not in row:
            continue
        key = (row["parallel"], row["world"])
        ctl = statistics.fmean(controls[key]) if controls.get(key) else None
        row["control_step_ms"] = None if ctl is None else round(ctl, 3)
        row["scores"] = {src: ({"right": False, "error": rep["error"]} if "error" in rep
                               else score(row["kind"], row["truth"], rep, ctl))
                         for src, rep in row["reports"].items()}
        row["reports"] = {src: brief(rep) for src, rep in row["reports"].items()}
    doc = {"commit": commit(), "seed": args.seed, "steps": STEPS, "cpu_count": os.cpu_count(),
           "seconds": round(time.perf_counter() - t0, 1), "rows": done}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    write(doc, args.out)
    for line in summary_lines(done):
        print(line)


def summary_lines(rows: list) -> list[str]:
    """Per kind and source: right / rows, and the cause, excess and estimate checks."""
    out = []
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind and "scores" in r]
        if not mine:
            continue
        parts = []
        for src in ("record", "kineto"):
            sc = [r["scores"][src] for r in mine if src in r["scores"]]
            if not sc:
                continue
            cell = f"{src} {sum(bool(s.get('right')) for s in sc)}/{len(sc)}"
            for check in ("cause", "excess", "estimate"):
                got = [s.get(check) for s in sc if s.get(check) is not None]
                if got:
                    cell += f" {check} {sum(got)}/{len(got)}"
            parts.append(cell)
        out.append(f"{kind:13s} " + " | ".join(parts))
    return out


if __name__ == "__main__":
    main()
