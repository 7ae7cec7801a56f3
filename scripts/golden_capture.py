"""torchrun's entry point for scripts/golden_cases.py: runs a workload script with the
recorder's row builder watched, appending each flush's events (rows.build's arguments) and
what it made of them to $GPUSCOPE_GOLDEN_OUT/rank-<RANK>.jsonl.

    torchrun ... scripts/golden_capture.py WORKLOAD.py [its arguments]
"""

import json
import os
import runpy
import sys

from gpuscope.record import recorder

OUT = os.environ["GPUSCOPE_GOLDEN_OUT"]
_build = recorder.build


def watched_build(taken, shift, path="fast"):
    built = _build(taken, shift, path)
    if shift:  # a flush (the profiler watch's look at the steps not flushed yet has shift 0)
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(OUT, f"rank-{rank}.jsonl"), "a") as fh:
            fh.write(json.dumps({"shift": shift, "items": taken, "rows": built.rows,
                                 "routed": built.routed, "forwards": built.forwards}) + "\n")
    return built


recorder.build = watched_build
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
