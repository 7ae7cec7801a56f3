"""The recorder's memory records (record/memory.py) read into one table, checked on the way.

`RunTable.memory` has one row per (rank, step) where something was sampled (MEMORY_COLUMNS).
Recorded runs: each of the run's young steps and the step that closed each flush after them, with
the process's resident set then, and the device's peaks over the steps since the previous sample (`device_first_step` .. `step`) with the
allocator's running totals of retries and OOMs. Profiler traces with profile_memory=True
(readers/kineto/memory_steps.py): every profiled step, the device allocator's peaks in it and
the CPU allocator's (`host_alloc_bytes`). What was not sampled is NaN, never 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .validate import MAX_STEP, is_int

MAX_BYTES = 1 << 60
MEMORY_COLUMNS = ("rank", "step", "rss_bytes", "device_first_step", "device_peak_bytes",
                  "device_reserved_bytes", "alloc_retries", "ooms", "host_alloc_bytes")
CAPACITY_KEYS = ("host_total_bytes", "host_limit_bytes", "device_total_bytes",
                 "device_limit_bytes", "device_usable_bytes")


def memory_ok(m) -> bool:
    """A memory side record's body, as record/memory.py writes it."""
    if not isinstance(m, dict):
        return False
    steps, rss = m.get("steps", []), m.get("rss_bytes", [])
    if not (isinstance(steps, list) and isinstance(rss, list) and len(steps) == len(rss)
            and all(is_int(s, 0, MAX_STEP) for s in steps)
            and all(is_int(b, 0, MAX_BYTES) for b in rss)):
        return False
    dev = m.get("device")
    return dev is None or (isinstance(dev, list) and all(
        isinstance(w, list) and len(w) == 6 and all(is_int(v, 0, MAX_STEP) for v in w[:2])
        and w[0] <= w[1] and all(is_int(v, 0, MAX_BYTES) for v in w[2:])
        for w in device_windows(m)))


def device_windows(m: dict) -> list:
    """A memory record's device windows: a list of them, or one (older files)."""
    dev = m.get("device")
    if not dev:
        return []
    return dev if isinstance(dev[0], list) else [dev]


def capacity_of(header: dict) -> dict:
    """What the rank's machine can hold (bytes), from its header; keys absent where unknown."""
    cap = header.get("memory")
    if not isinstance(cap, dict):
        return {}
    return {k: cap[k] for k in CAPACITY_KEYS if is_int(cap.get(k), 1, MAX_BYTES)}


def memory_frame(parts: list[tuple[int, list[dict]]]) -> pd.DataFrame | None:
    """One table from each rank's memory records (already checked by memory_ok)."""
    rows = []
    for rank, records in parts:
        by_step: dict[int, list] = {}
        for m in records:
            for s, b in zip(m.get("steps", []), m.get("rss_bytes", [])):
                by_step.setdefault(s, [rank, s, b] + [np.nan] * 6)[2] = b
            for dev in device_windows(m):
                row = by_step.setdefault(dev[1], [rank, dev[1], np.nan] + [np.nan] * 6)
                row[3:8] = dev[0], *dev[2:]
        rows += [by_step[s] for s in sorted(by_step)]
    if not rows:
        return None
    out = pd.DataFrame(rows, columns=list(MEMORY_COLUMNS))
    out[["rank", "step"]] = out[["rank", "step"]].astype("int64")
    return out
