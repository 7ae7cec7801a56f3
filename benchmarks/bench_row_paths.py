"""The two ways a recorded micro-step becomes its row, side by side on the same micro-steps:
rows.build's FAST path (plain_row: the common shape straight from its events) against its GENERAL
path (interpret pairs the events into intervals, sum_steps sums them), which every other shape
takes. The micro-steps are a real recording's: bench_overhead's tiny DDP model
(Linear(8, 8), SGD, gloo, one rank), 640 micro-steps captured at the recorder's flushes.

Each path makes the rows of all of them, 20 times a round, 7 rounds; the figure is each path's
best round per micro-step (the loop is pure Python on lists held in memory: the fastest round is
the one the machine disturbed least), and the rows of both are checked equal first.

    python benchmarks/bench_row_paths.py [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import timeit

from measured import commit  # noqa: E402  (benchmarks/measured.py)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)


def captured(n: int) -> list:
    """The event tuples of `n` recorded micro-steps (events.take's), as the flushes saw them."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import gpuscope
    from gpuscope.record import recorder

    torch.set_num_threads(1)
    d = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    batches, build = [], recorder.build

    def keep(pending, shift):
        batches.append(copy.deepcopy(pending))
        return build(pending, shift)

    recorder.build = keep
    try:
        with gpuscope.record(os.path.join(d, "run"), model=model) as rec:
            for b in rec.data([x] * n):
                opt.zero_grad()
                model(b).sum().backward()
                opt.step()
                rec.step()
    finally:
        recorder.build = build
        dist.destroy_process_group()
    return [item for batch in batches for item in batch]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=640)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "row_paths.json"))
    args = ap.parse_args()
    from gpuscope.record.rows import FAST, GENERAL, build, plain_row

    items = captured(args.steps)
    plain = sum(plain_row(it, 0) is not None for it in items)
    fast = lambda: build(items, 0, FAST)  # noqa: E731
    general = lambda: build(items, 0, GENERAL)  # noqa: E731
    assert fast().rows == general().rows, "the two paths disagree"
    per = {name: min(timeit.repeat(fn, number=20, repeat=7)) / 20 / len(items) * 1e6
           for name, fn in (("plain_row", fast), ("general", general))}
    result = {"commit": commit(), "python": sys.version.split()[0], "micro_steps": len(items),
              "plain_shape": plain, "us_per_micro_step": {k: round(v, 3) for k, v in per.items()},
              "saved_us_per_micro_step": round(per["general"] - per["plain_row"], 3)}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result))
    os._exit(0)  # leave without the interpreter's teardown (gloo's threads)


if __name__ == "__main__":
    main()
