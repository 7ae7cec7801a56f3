"""Soak: kill 2-rank recorded runs with SIGKILL at random points, then analyse what is left.

    python scripts/soak.py --runs 30            # the figure in docs/performance.md (~3 min on 2 cores)
    python scripts/soak.py --runs 4 --seed 1    # quicker

Each run is one of four kinds of kill, in turn, at a random moment within it:
  first-step  as soon as the rank files exist (header written, the first rows not yet);
  mid-run     after a random 5-300 steps, wherever the writer is (often mid-flush);
  close       in the last steps or while the recording closes (a 60-step run);
  tensorboard with TensorBoard scalars on, once their event files exist.
Both ranks are killed together (one process group). A run passes when its run dir analyses (or,
killed before any row was written, gives one GpuscopeError saying no steps were recorded), every
cut rank is reported cut, and each rank lost at most one flush interval of steps: the steps
printed as finished minus the steps on disk <= flush_rows (RecordOptions' default).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "tests", "workloads", "soak_train.py")
KINDS = ("first-step", "mid-run", "close", "tensorboard")
sys.path.insert(0, ROOT)
from gpuscope.record.options import RecordOptions  # noqa: E402

FLUSH_ROWS = RecordOptions().flush_rows  # the recorder's default: what a kill may lose at most


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recorded_steps(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.startswith(b"[") and line.endswith(b"\n"))
    except OSError:
        return 0


def _has_end(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return any(line.startswith(b'{"end"') for line in fh)
    except OSError:
        return False


def soak_once(kind: str, seed: int, where: str) -> dict:
    """One run killed the `kind` way; returns what was found (`ok` says whether it passed)."""
    import gpuscope

    rng = random.Random(seed)
    run = os.path.join(where, "run")
    steps = 60 if kind == "close" else 100000
    port = str(_free_port())
    procs, last = [], [-1, -1]
    extra = ["--tensorboard"] if kind == "tensorboard" else []
    for rank in (0, 1):
        env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, PYTHONPATH=ROOT)
        procs.append(subprocess.Popen(
            [sys.executable, TRAIN, "--run-dir", run, "--steps", str(steps)] + extra, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            process_group=0 if rank == 0 else procs[0].pid))

    def follow(rank: int) -> None:
        for line in procs[rank].stdout:
            if line.strip().isdigit():
                last[rank] = int(line)

    readers = [threading.Thread(target=follow, args=(r,), daemon=True) for r in (0, 1)]
    for t in readers:
        t.start()
    files = [os.path.join(run, f"rank-0000{r}.gpuscope.jsonl") for r in (0, 1)]
    target = rng.randint(5, 300)
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            if any(p.poll() is not None for p in procs) and kind != "close":
                break
            if kind == "first-step" and all(os.path.exists(f) for f in files):
                break
            if kind == "mid-run" and min(last) >= target:
                break
            if kind == "close" and min(last) >= steps - 1:  # the last step is done
                time.sleep(rng.uniform(0, 0.005))  # the close itself takes a few ms
                break
            if kind == "tensorboard" and os.path.isdir(os.path.join(run, "tensorboard")) \
                    and min(last) >= 20:
                time.sleep(rng.uniform(0, 0.2))
                break
            time.sleep(0.001)
    finally:
        try:
            os.killpg(procs[0].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in procs:
            p.wait(timeout=30)
        for t in readers:
            t.join(timeout=5)
    out = {"kind": kind, "seed": seed, "finished": list(last),
           "on_disk": [_recorded_steps(f) for f in files], "killed": [p.returncode for p in procs]}
    lost = [f + 1 - d for f, d in zip(last, out["on_disk"])]
    out["lost"] = lost
    problems = []
    if max(lost) > FLUSH_ROWS:
        problems.append(f"lost {max(lost)} steps (more than one flush of {FLUSH_ROWS})")
    try:
        rep = gpuscope.analyze(run)
        d = rep.to_dict()
        out["steps_analysed"] = d["steps_analysed"]
        cut = [w for w in d["warnings"] if "no end record" in w]
        ended = [f for f in files if _has_end(f)]  # closed before the kill: not cut
        out["closed"] = len(ended)
        if len(cut) + len(ended) < 2:
            problems.append(f"the cut is not reported: {d['warnings']}")
    except gpuscope.GpuscopeError as exc:
        out["error"] = str(exc)
        nothing = ("no steps" in str(exc) or "wrote nothing" in str(exc)
                   or "recorded no" in str(exc))
        if max(out["on_disk"]) > 0 or not nothing:
            problems.append(f"analysis failed: {exc}")
    except Exception as exc:  # noqa: BLE001 - anything else is a failure of gpuscope
        problems.append(f"{type(exc).__name__}: {exc}")
    out["ok"] = not problems
    out["problems"] = problems
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    results = []
    t0 = time.perf_counter()
    for i in range(args.runs):
        kind = KINDS[i % len(KINDS)]
        where = tempfile.mkdtemp(prefix="gpuscope-soak-")
        try:
            r = soak_once(kind, args.seed * 1000 + i, where)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        results.append(r)
        print(f"{i + 1:3d} {kind:12s} finished {r['finished']} on disk {r['on_disk']} "
              f"lost {r['lost']} closed {r.get('closed', 0)} "
              f"{'ok' if r['ok'] else 'FAIL ' + '; '.join(r['problems'])}",
              flush=True)
    good = sum(r["ok"] for r in results)
    print(f"{good}/{len(results)} killed runs analysed as required "
          f"({time.perf_counter() - t0:.0f} s; most steps lost by a rank: "
          f"{max(max(r['lost']) for r in results)})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": len(results), "ok": good, "results": results}, fh, indent=1)
    return 0 if good == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
