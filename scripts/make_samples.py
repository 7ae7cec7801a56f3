"""Regenerate sample_traces/: the four demo scenarios, each a real 2-rank gloo DDP run on CPU,
recorded by gpuscope and profiled by torch.profiler at the same time.

    python scripts/make_samples.py [--out sample_traces] [--steps 16]

Each scenario folder holds `record/` (the gpuscope run dir) and `kineto/` (gzip traces, two
profiler cycles of 5 steps per rank). Never edit these files by hand; rerun this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

# generated reports are the models' own: what `gpuscope try` kept on this machine stays out
os.environ["GPUSCOPE_CALIBRATION"] = "off"

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpuscope.demo.launch import run_training  # noqa: E402
from gpuscope.demo import NPROC, SCENARIOS  # noqa: E402

#: the label each scenario is built for (the balanced one trains one rank, as the demo does:
#: two ranks sharing two cores trade lateness, jitter-bound; gpuscope.demo.NPROC)
EXPECTED = {"data": "data-bound", "comm": "comm-bound", "imbalanced": "imbalanced",
            "compute": "compute-bound"}



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "sample_traces"))
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--only", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    import gpuscope

    manifest = os.path.join(args.out, "MANIFEST.json")
    summary = {}
    if os.path.exists(manifest):  # the scenarios not made again keep their lines
        with open(manifest) as fh:
            summary = json.load(fh).get("scenarios", {})
    for scenario in args.only:
        base = os.path.join(args.out, scenario)
        shutil.rmtree(base, ignore_errors=True)
        run_training(scenario, os.path.join(base, "record"), args.steps, nproc=NPROC[scenario],
                     profile_dir=os.path.join(base, "kineto"))
        got = {src: gpuscope.analyze(os.path.join(base, src)).verdict.label
               for src in ("record", "kineto")}
        sizes = {f: os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(base)
                 for f in files}
        summary[scenario] = {"expected": EXPECTED[scenario], "ranks": NPROC[scenario], **got,
                             "largest_file_bytes": max(sizes.values())}
        print(scenario, summary[scenario], flush=True)
    with open(manifest, "w") as fh:
        json.dump({"generated_by": "scripts/make_samples.py", "steps": args.steps,
                   "scenarios": summary}, fh, indent=2)


if __name__ == "__main__":
    main()
