"""The fault benchmark past what one machine trains: run dirs of 128, 1,024 and 10,000 ranks written
by the recorder's own writer (as benchmarks/bench_scale.py writes them), a synchronous DDP job
whose ranks all leave each step's all-reduce together, with the same kinds of fault as
train.py applied to the drawn rank's timings (or two ranks', or rotating), at 2% of the step
and above; scored by score.py like the trained rows.

    python benchmarks/faults/many.py [--sizes 128,1024,10000] [--steps 48] [--seed 0]
    (make bench-faults: 128 and 1,024 ranks x 48 steps, 10,000 x 24)

Adds its rows to benchmarks/results/faults.json (`--out`), replacing the generated ones of the
same sizes there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from measured import commit  # noqa: E402
from score import score  # noqa: E402
from tables import brief, write  # noqa: E402

from gpuscope.record.writer import RecordWriter  # noqa: E402
from gpuscope.run_format import SCHEMA, STEP_COLUMNS  # noqa: E402

KINDS = ("control", "data", "forward", "backward", "optimizer", "between", "intermittent",
         "two", "rotating")
FRACTIONS = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
#: the phase each kind adds its time to
PHASE = {"data": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt",
         "between": "other", "intermittent": "fwd", "two": "fwd", "rotating": "fwd"}
BASE_MS = 80.0
FLUSH_ROWS = 16


def timings(ranks: int, steps: int, seed: int) -> dict:
    """Each rank's phases per step (ns), drawn once: the same numbers with and without a
    fault."""
    rng = np.random.default_rng(seed)
    shape = (ranks, steps)
    return {"data": rng.integers(1_000_000, 3_000_000, shape),
            "fwd": rng.normal(20e6, 1e6, shape).astype(np.int64),
            "bwd": rng.normal(40e6, 2e6, shape).astype(np.int64),
            "opt": rng.integers(2_000_000, 2_500_000, shape),
            "other": rng.integers(300_000, 900_000, shape),
            "transfer": rng.integers(15_000_000, 18_000_000, steps),
            "jitter": rng.integers(0, 2_000_000, steps)}


def added(kind: str, ranks: int, steps: int, slowed: list, ns: int) -> np.ndarray:
    """ns each rank's fault adds per step."""
    out = np.zeros((ranks, steps), np.int64)
    if kind == "control":
        return out
    if kind == "rotating":
        out[np.arange(steps) % ranks, np.arange(steps)] = ns
        return out
    for r in slowed:
        out[r] = ns
    if kind == "intermittent":
        out[:, np.arange(steps) % 5 != 2] = 0
    return out


def synchronous(t: dict, extra: np.ndarray, phase: str | None) -> dict:
    """The job's steps: every rank's busy time (its phases, the fault in its phase), then the
    all-reduce that no rank leaves before the last arrives; each rank's exposed communication is
    its wait plus the transfer."""
    parts = {k: t[k].copy() for k in ("data", "fwd", "bwd", "opt", "other")}
    if phase is not None:
        parts[phase] = parts[phase] + extra
    busy = sum(parts.values())
    step = busy.max(axis=0) + t["transfer"] + t["jitter"]
    exposed = step[None, :] - busy
    return {**parts, "busy": busy, "step": np.broadcast_to(step, busy.shape), "exposed": exposed}


def write(path: str, job: dict, ranks: int, steps: int) -> None:
    t0 = 1_790_000_000_000_000_000
    step = job["step"][0]
    start = t0 + np.concatenate([[0], np.cumsum(step)[:-1]])
    for rank in range(ranks):
        head = {"schema": SCHEMA, "rank": rank, "local_rank": rank % 8, "world_size": ranks,
                "host": f"node{rank // 8:05d}", "pid": 1000 + rank, "placement_source": "env",
                "run_id": "faults", "recording": 1, "start_unix_ns": t0,
                "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
                "comm_timing": "ddp_comm_hook+collectives",
                "knobs": {"world_size": ranks, "backend": "nccl", "device": "cuda",
                          "model": "DistributedDataParallel", "param_dtype": "bfloat16"}}
        writer = RecordWriter(path, rank)
        writer.MAX_PENDING = steps // FLUSH_ROWS + 8
        writer.write_header(head)
        writer.add_meta({"knobs": {"loader": "DataLoader", "num_workers": 4, "batch_size": 16},
                         "at_step": 0})
        p = {k: job[k][rank] for k in ("data", "fwd", "bwd", "opt", "other", "exposed")}
        compute = p["fwd"] + p["bwd"] + p["opt"]
        comm = p["exposed"]  # all of it exposed: the all-reduce after backward
        cols = np.column_stack([np.arange(steps), start, step, p["data"], compute, comm,
                                p["exposed"], p["other"], p["fwd"], p["bwd"], p["opt"],
                                np.ones(steps, np.int64), p["data"] // 10,
                                np.ones(steps, np.int64), p["other"]]).tolist()
        rows = [row + [{"_comm": {"all_reduce:ddp": [c, c, 1]}}]
                for row, c in zip(cols, comm.tolist())]
        for i in range(0, steps, FLUSH_ROWS):
            writer.add_rows(rows[i:i + FLUSH_ROWS])
        writer.close({"steps": steps, "crashed": False, "end_unix_ns": int(start[-1] + step[-1])})
        assert writer.error is None and writer.dropped == 0, (writer.error, writer.dropped)


def row(ranks: int, steps: int, kind: str, rng: random.Random, seed: int, work: str) -> dict:
    slowed = sorted(rng.sample(range(ranks), 2 if kind == "two" else 1)) \
        if kind not in ("control", "rotating") else []
    frac = rng.choice(FRACTIONS) if kind != "control" else 0.0
    ns = int(frac * BASE_MS * 1e6)
    t = timings(ranks, steps, seed)
    job = synchronous(t, added(kind, ranks, steps, slowed, ns), PHASE.get(kind))
    clean = synchronous(t, np.zeros((ranks, steps), np.int64), None)
    extra = added(kind, ranks, steps, slowed, ns)
    truth = {"fault": kind, "slowed": slowed, "ms": ns / 1e6, "world": ranks,
             "parallel": "generated", "workers": 4,
             "added_ms": {r: float(extra[r, 1:].mean()) / 1e6 for r in set(slowed) | {0}},
             "step_ms": float(job["step"][0, 1:].mean()) / 1e6,
             "local_ms": {r: float(job["busy"][r, 1:].mean()) / 1e6 for r in range(ranks)},
             "data_ms": {r: float(job["data"][r, 1:].mean()) / 1e6 for r in range(ranks)}}
    control_ms = float(clean["step"][0, 1:].mean()) / 1e6
    path = os.path.join(work, f"{ranks}-{kind}")
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    write(path, job, ranks, steps)
    import gpuscope

    t1 = time.perf_counter()
    rep = gpuscope.analyze(path).to_dict()
    seconds = time.perf_counter() - t1
    shutil.rmtree(path, ignore_errors=True)
    return {"parallel": "generated", "world": ranks, "kind": kind, "ranks": slowed,
            "fraction": frac, "ms": ns / 1e6, "truth": truth, "control_step_ms": control_ms,
            "seconds": round(time.perf_counter() - t0, 1), "analyse_s": round(seconds, 2),
            "scores": {"record": score(kind, truth, rep, control_ms)},
            "steps": steps, "reports": {"record": brief(rep)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,1024,10000")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "faults.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="gpuscope-many-")
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for kind in args.kinds.split(","):
                r = row(size, args.steps, kind, rng, args.seed, work)
                rows.append(r)
                s = r["scores"]["record"]
                print(f"{size:6d} {kind:12s} ranks {r['ranks']} {r['ms']:6.1f} ms: "
                      f"{'right' if s['right'] else 'WRONG'} {s['verdict']} {s['named']} "
                      f"{s['probable']} ({r['analyse_s']} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"rows": []}
    if os.path.exists(args.out):
        with open(args.out) as fh:
            doc = json.load(fh)
    sizes = {int(s) for s in args.sizes.split(",")}
    doc["rows"] = [r for r in doc.get("rows", []) if r.get("parallel") != "generated"
                   or r["world"] not in sizes] + rows
    doc["generated"] = {"commit": commit(), "seed": args.seed}
    write(doc, args.out)


if __name__ == "__main__":
    main()
