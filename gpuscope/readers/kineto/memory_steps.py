"""Memory per profiled step from the allocator's "[memory]" instants (profile_memory=True).

Each instant carries the allocator's total allocated and reserved bytes after it. A step's peak
is the largest total inside its window, or the total it started with when nothing was allocated
in it. Device allocators (CUDA, ROCm, ...) give `device_peak_bytes` / `device_reserved_bytes`;
the CPU allocator `host_alloc_bytes` (what torch's CPU allocator holds, not the resident set).
Rows in readers/memory_records.MEMORY_COLUMNS; retries and OOMs are not in traces (NaN).
"""

from __future__ import annotations

import numpy as np

CPU = 0


def _peaks(ts: np.ndarray, vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo, hi): the largest value inside, or the last one before it; NaN if none."""
    order = np.argsort(ts, kind="stable")
    ts, vals = ts[order], vals[order].astype(np.float64)
    a = np.searchsorted(ts, lo, "left")
    b = np.searchsorted(ts, hi, "left")
    out = np.full(len(lo), np.nan)
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
        inside = vals[x:y].max() if y > x else -1.0
        before = vals[x - 1] if x > 0 else -1.0
        best = max(inside, before)
        out[i] = best if best >= 0 else np.nan
    return out


def memory_rows(ev, rank: int, rows: list[dict]) -> list[list]:
    """MEMORY_COLUMNS rows (plus host_alloc_bytes last) for one rank's steps."""
    if not ev.mem_ts.size or not rows:
        return []
    steps = np.array([r["step"] for r in rows], np.int64)
    lo = np.array([r["start_ns"] for r in rows], np.int64)
    hi = lo + np.array([r["step_ns"] for r in rows], np.int64)
    dev = ev.mem_dev != CPU
    nan = np.full(len(rows), np.nan)
    d_alloc = _peaks(ev.mem_ts[dev], ev.mem_alloc[dev], lo, hi) if dev.any() else nan
    d_res = _peaks(ev.mem_ts[dev], ev.mem_reserved[dev], lo, hi) if dev.any() else nan
    h_alloc = _peaks(ev.mem_ts[~dev], ev.mem_alloc[~dev], lo, hi) if (~dev).any() else nan
    out = []
    for i, s in enumerate(steps.tolist()):
        if np.isnan(d_alloc[i]) and np.isnan(h_alloc[i]):
            continue
        first = float(s) if not np.isnan(d_alloc[i]) else np.nan
        out.append([rank, s, np.nan, first, d_alloc[i], d_res[i], np.nan, np.nan, h_alloc[i]])
    return out
