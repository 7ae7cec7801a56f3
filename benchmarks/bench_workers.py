"""What a DataLoader worker process costs, per batch: the figure behind the num_workers rule.

A worker hides a batch's load time from the training loop, but each batch then travels from the
worker to the loop (pickled index, collated tensors through shared memory) and the worker starts
once per epoch. With loading that costs nothing, the per-batch difference between num_workers=1
and 0 is that overhead. Measured for a few batch sizes, steady state (after the first batch) and
start-up (the first batch) apart. And what the training thread itself pays to take a batch that
2 workers have ready, while it works 5 ms a batch (`training_thread_ms_per_batch_2_workers`):
the worker's overhead above limits how fast a worker delivers; this one adds to the step.

    python benchmarks/bench_workers.py [--batches 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Ready(Dataset):
    """Samples that cost nothing to load: only the worker's own overhead is left."""

    def __init__(self, n: int, dim: int):
        self.x = torch.randn(n, dim)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


def per_batch(workers: int, batch: int, dim: int, batches: int) -> tuple[float, float]:
    """(first batch s, median steady-state s per batch)."""
    loader = DataLoader(Ready(batch * batches, dim), batch_size=batch, num_workers=workers)
    times = []
    t = time.perf_counter()
    for _ in loader:
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return times[0], statistics.median(times[1:])


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def handover(workers: int, batch: int, dim: int, batches: int, work_ms: float) -> float:
    """What the training thread pays per batch to take one that workers have ready: a loop
    spinning `work_ms` per batch (longer than a worker needs for one), over a DataLoader with
    `workers` workers, against the same loop over batches already in a list; median s per
    batch, the difference."""
    loader = DataLoader(Ready(batch * batches, dim), batch_size=batch, num_workers=workers,
                        persistent_workers=workers > 0)
    ready = [b for _, b in zip(range(batches), loader)]  # also starts the workers
    def per(it):
        times, t = [], time.perf_counter()
        for _ in it:
            _spin(work_ms / 1e3)
            now = time.perf_counter()
            times.append(now - t)
            t = now
        return statistics.median(times[5:])

    with_loader = per(loader)
    plain = per(ready)
    return with_loader - plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "workers.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for batch, dim in ((16, 64), (64, 1024), (256, 4096)):
        bytes_ = batch * dim * 4
        first0, steady0 = per_batch(0, batch, dim, args.batches)
        first1, steady1 = per_batch(1, batch, dim, args.batches)
        h = handover(2, batch, dim, args.batches, 5.0)
        rows.append({"batch_bytes": bytes_, "steady_ms_workers_0": round(steady0 * 1e3, 4),
                     "steady_ms_workers_1": round(steady1 * 1e3, 4),
                     "overhead_ms_per_batch": round((steady1 - steady0) * 1e3, 4),
                     "first_batch_ms_workers_1": round(first1 * 1e3, 2),
                     "training_thread_ms_per_batch_2_workers": round(h * 1e3, 4)})
        print(json.dumps(rows[-1]), flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"cpu_count": os.cpu_count(), "torch": torch.__version__, "rows": rows}, fh,
                  indent=2)


if __name__ == "__main__":
    main()
