"""The recorder's CUDA calls per micro-step, counted through a fake of the CUDA seams
(benchmarks/cuda_seam.py): the GPU path's gate, kept beside the instruction count
(bench_instructions.py) because a GPU is rarely at hand. A call into torch.cuda costs
microseconds on a real device (an Event.record() that looks the current stream up builds a
Stream object each time; the allocator's statistics are a dict of ~160 entries), so the count is
what a change to record/ must not raise; tests/test_cuda_calls.py fails when it does.

    python benchmarks/bench_cuda_calls.py [--steps 192]   ->   benchmarks/results/cuda_calls.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_seam import calls_per_step  # noqa: E402
from measured import commit  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cuda_calls.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=192)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    got = calls_per_step(args.steps)
    got["commit"] = commit()
    with open(args.out, "w") as fh:
        json.dump(got, fh, indent=2)
        fh.write("\n")
    print(json.dumps(got, indent=2))


if __name__ == "__main__":
    main()
