"""HTA's own GPU kernel breakdown of each folder of ../shared/traces/hta, as the reference a
gpuscope kernel view is checked against (issue 41): `TraceAnalysis.get_gpu_kernel_breakdown`
of HolisticTraceAnalysis 0.5.0 (MIT licence), run in its own venv (benchmarks/.venv-hta, made
by benchmarks/bench_vs_hta.py), with every kernel listed (duration_ratio 1, no "others").

    python scripts/hta_kernel_reference.py [--out tests/fixtures/hta_kernel_breakdown.json]

Per folder: the kernel types' time (µs, HTA's COMPUTATION / COMMUNICATION / MEMORY and their
overlaps) and per rank and kernel name its sum, max, min and mean (µs) and kernel type; a folder
HTA cannot load is recorded with its error. Written by HTA, not by gpuscope: the file is data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "traces", "hta")
HTA_PY = os.path.join(ROOT, "benchmarks", ".venv-hta", "bin", "python")

_RUN = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
try:
    a = TraceAnalysis(trace_dir=sys.argv[1])
    types, kernels = a.get_gpu_kernel_breakdown(visualize=False, duration_ratio=1.0,
                                                num_kernels=1_000_000)
except Exception as exc:  # noqa: BLE001 - recorded: HTA's own limits are part of the reference
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}))
    sys.exit(0)
print(json.dumps({
    "types": {r["kernel_type"]: float(r["sum"]) for r in types.to_dict("records")},
    "kernels": [{"rank": int(r["rank"]), "name": r["name"], "type": r["kernel_type"],
                 "sum_us": float(r["sum (us)"]), "max_us": float(r["max (us)"]),
                 "min_us": float(r["min (us)"]), "mean_us": float(r["mean (us)"])}
                for r in kernels.to_dict("records")]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures",
                                                  "hta_kernel_breakdown.json"))
    args = ap.parse_args()
    if not os.path.exists(HTA_PY):
        sys.exit(f"{HTA_PY} is missing: run python benchmarks/bench_vs_hta.py once to make it")
    version = subprocess.run([HTA_PY, "-c", "import importlib.metadata as m; "
                              "print(m.version('HolisticTraceAnalysis'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    out = {"hta_version": version, "folders": {}}
    for name in sorted(os.listdir(SHARED)):
        folder = os.path.join(SHARED, name)
        if not os.path.isdir(folder):
            continue
        got = subprocess.run([HTA_PY, "-c", _RUN, folder], capture_output=True, text=True,
                             timeout=600)
        lines = got.stdout.strip().splitlines()
        out["folders"][name] = json.loads(lines[-1]) if lines else {
            "error": got.stderr.strip().splitlines()[-1][:300] if got.stderr.strip() else "?"}
        print(name, "error" if "error" in out["folders"][name] else
              f"{len(out['folders'][name]['kernels'])} kernels", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
