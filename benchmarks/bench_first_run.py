"""A newcomer's first command: `make demo` on a fresh clone, its wall time and the size of the
`.venv` it leaves (with torch's share), pip's cache off so every wheel is fetched as on a new
machine.

    python benchmarks/bench_first_run.py [--repo .] [--busy N]

Clones the repository's HEAD into a temporary folder, runs `make demo` there, and writes
benchmarks/results/first_run.json; scripts/make_performance_doc.py puts the figures in the
README's quickstart. `--busy N`: the same again with N other processes spinning on the cores the
whole time (a newcomer's machine busy with other work), kept under "busy" beside the quiet run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_bytes(path: str) -> int:
    """Bytes the files under `path` take on disk (du's count: blocks, links once)."""
    seen, total = set(), 0
    for top, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(top, f))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def first_run(repo: str, busy: int = 0) -> dict:
    """`make demo` on a fresh clone of `repo`'s HEAD: its time, the .venv it leaves, the load;
    `busy`: that many processes spinning beside it the whole time."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                            capture_output=True, text=True, check=True).stdout.strip()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(busy)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            clone = os.path.join(tmp, "gpuscope")
            subprocess.run(["git", "clone", "-q", repo, clone], check=True)
            env = dict(os.environ, PIP_NO_CACHE_DIR="1")
            env.pop("VIRTUAL_ENV", None)
            load = [os.getloadavg()[0]]  # what else the machine ran: the time depends on it
            t0 = time.perf_counter()
            got = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True,
                                 text=True)
            seconds = time.perf_counter() - t0
            load.append(os.getloadavg()[0])
            if got.returncode:
                raise SystemExit(got.stdout[-2000:] + got.stderr[-2000:])
            venv = os.path.join(clone, ".venv")
            site = next(os.path.join(top, "site-packages") for top, dirs, _ in os.walk(venv)
                        if "site-packages" in dirs)
            verdict = next(x for x in got.stdout.splitlines() if x.startswith("Verdict:"))
            return {"commit": commit, "cores": os.cpu_count(), "seconds": round(seconds, 1),
                    "venv_bytes": tree_bytes(venv),
                    "torch_bytes": tree_bytes(os.path.join(site, "torch")),
                    "verdict": verdict, "pip_cache": False,
                    "load": [round(min(load), 1), round(max(load), 1)],
                    **({"busy_processes": busy} if busy else {})}
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=ROOT)
    ap.add_argument("--busy", type=int, default=0,
                    help="also run it with this many processes spinning beside it")
    args = ap.parse_args()
    result = first_run(args.repo)
    if args.busy:
        result["busy"] = first_run(args.repo, args.busy)
    out = os.path.join(ROOT, "benchmarks", "results", "first_run.json")
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
