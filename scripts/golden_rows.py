"""The recorder's record files on the test workloads, reduced to what does not depend on timing:
the golden comparison of issue 42 (the recorder rebuilt, its rows unchanged).

Each workload (tests/workloads/: DDP, no_sync, FSDP2, the loop's own all-reduce, nanoGPT-style
accumulation, pipeline, DTensor on a device mesh, experts, HF Trainer, Lightning) runs under
torchrun on CPU (gloo); of each rank's record file this keeps, per row, its step, whether it
synchronized gradients, the sample count it noted and the names of the parts it holds beyond
the fixed columns; per run, each collective key's number of calls, the header's fixed facts
(columns, comm_key, comm_timing), the kinds of side records and their deterministic content
(all-to-all rows per step). Times are left out, and so is which flush wrote a side record:
they differ from run to run.

    python scripts/golden_rows.py --out FILE [--only NAME,...]   # with this checkout's code
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
W = os.path.join(ROOT, "tests", "workloads")

#: name -> (ranks, script, arguments)
WORKLOADS = {
    "ddp": (2, "cases.py", ["--case", "tutorial", "--epochs", "1"]),
    "no_sync": (2, "cases.py", ["--case", "no_sync", "--steps", "4"]),
    "fsdp2": (2, "cases.py", ["--case", "fsdp2", "--steps", "4"]),
    "allreduce": (2, "cases.py", ["--case", "allreduce", "--steps", "6"]),
    "nanogpt": (2, "cases.py", ["--case", "nanogpt", "--steps", "3"]),
    "pipeline": (2, "parallel.py", ["--case", "pipeline"]),
    "mesh": (4, "mesh.py", ["--steps", "6"]),
    "experts": (2, "experts.py", ["--steps", "8"]),
    "hf": (2, "trainers.py", ["--trainer", "hf", "--steps", "6"]),
    "lightning": (2, "trainers.py", ["--trainer", "lightning", "--steps", "6"]),
}
#: header facts that do not change from run to run
HEADER = ("columns", "comm_key", "comm_timing", "format", "world_size", "rank")


def run(name: str, out: str) -> str:
    n, script, args = WORKLOADS[name]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(n), os.path.join(W, script), "--out", out,
                           *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
    return os.path.join(out, "record")


def shape(record_dir: str) -> dict:
    """What a run dir's record files hold, timing aside."""
    out = {}
    for path in sorted(glob.glob(os.path.join(record_dir, "*.gpuscope.jsonl"))):
        lines = [json.loads(x) for x in open(path) if x.strip()]
        header = lines[0]
        columns = header["columns"]
        rows, calls, side = [], {}, {}
        for obj in lines[1:]:
            if isinstance(obj, list):
                d = dict(zip(columns, obj))
                extra = obj[len(columns)] if len(obj) > len(columns) else {}
                if "_comm" in extra:
                    for key, v in extra["_comm"].items():
                        calls[key] = calls.get(key, 0) + v[2]
                elif d.get("n_comm"):  # all of it the header's comm_key's (run_format.py)
                    calls[header["comm_key"]] = calls.get(header["comm_key"], 0) + d["n_comm"]
                rows.append({"step": d["step"], "synced": d.get("synced"),
                             "samples": extra.get("_samples", -1),
                             "parts": sorted(k for k in extra if not k.startswith("_"))})
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    side.setdefault(k, [])
                    if k == "routing":  # per step; which flush carried it is timing
                        side[k] += [[st, r] for st, r in zip(v["steps"], v["rows"])]
        out[os.path.basename(path)] = {
            "header": {k: header.get(k) for k in HEADER},
            "rows": rows, "calls": calls,
            "side": {k: (v if k == "routing" else len(v) > 0) for k, v in sorted(side.items())}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated workload names")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
    got = {}
    for name in names:
        with tempfile.TemporaryDirectory() as d:
            try:
                got[name] = shape(run(name, d))
            except RuntimeError as exc:
                got[name] = {"error": str(exc)[-500:]}
        print(name, "error" if "error" in got[name] else f"{len(got[name])} rank file(s)",
              flush=True)
    with open(args.out, "w") as fh:
        json.dump(got, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
