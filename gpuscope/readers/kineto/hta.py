"""HTA-compatible GPU time breakdown of one rank (the definitions HTA 0.5 uses).

1. Device events are those with a stream (kernels, memcpy, memset). When the job has two or more
   ProfilerStep ranges, keep only device events launched before the last step starts (its
   kernels may be cut off), as HTA does by default.
2. kernel_time = end of the last kept device event - start of the first.
3. idle = kernel_time - |union of all kept device events|
   compute = |union of compute kernels|;  non_compute = kernel_time - compute - idle.
4. comm_overlap = |union(compute) ∩ union(communication)| / |union(communication)|.
When timestamps are floats (ns resolution), HTA rounds each event inward to whole µs (start up,
end down) before all of this; so does this function, to agree with it.
Unlike HTA, `hip*` kernels are not taken for communication.
"""

from __future__ import annotations

import numpy as np

from ...report import GpuBreakdown
from . import spans
from .events import COMM, COMPUTE, STEP, RankEvents


def launched_before_last_step(ev: RankEvents) -> np.ndarray:
    """Mask of device events whose launch lies before the start of the rank's last step."""
    step_starts = ev.host_start[ev.host_kind == STEP]
    if step_starts.size == 0:
        return np.ones(ev.dev_kind.size, dtype=bool)
    last = step_starts.max()
    early = ev.launch_corr[ev.launch_ts < last]
    return np.isin(ev.dev_corr, early)


def gpu_breakdown(ev: RankEvents, drop_last_step: bool) -> GpuBreakdown | None:
    if ev.dev_kind.size == 0:
        return None
    keep = launched_before_last_step(ev) if drop_last_step else np.ones(ev.dev_kind.size, bool)
    if not keep.any():
        return None
    kind, start, end = ev.dev_kind[keep], ev.dev_start[keep], ev.dev_end[keep]
    if ev.float_ts:
        start = -(-start // 1000) * 1000
        end = end // 1000 * 1000
    busy = spans.merge(start, end)
    if busy[0].size == 0:  # only kernels shorter than the µs grid
        return None
    kernel_time = int(busy[1][-1] - busy[0][0])
    if kernel_time <= 0:
        return None
    idle = kernel_time - spans.length(busy)
    comp = spans.merge(start[kind == COMPUTE], end[kind == COMPUTE])
    comm = spans.merge(start[kind == COMM], end[kind == COMM])
    compute = spans.length(comp)
    comm_len = spans.length(comm)
    return GpuBreakdown(
        idle_pct=round(100 * idle / kernel_time, 2),
        compute_pct=round(100 * compute / kernel_time, 2),
        non_compute_pct=round(100 * (kernel_time - compute - idle) / kernel_time, 2),
        kernel_time_us=round(kernel_time / 1000, 1),
        comm_overlap_pct=round(100 * spans.overlap(comp, comm) / comm_len, 2) if comm_len else None)
