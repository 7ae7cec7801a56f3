"""HTA-compatible GPU time breakdown of one rank (the definitions HTA 0.5 uses).

1. Device events are those with a stream (kernels, memcpy, memset). When the job has two or more
   ProfilerStep ranges, keep only device events launched before the last step starts (its
   kernels may be cut off), as HTA does by default.
2. kernel_time = end of the last kept device event - start of the first.
3. idle = kernel_time - |union of all kept device events|
   compute = |union of compute kernels|;  non_compute = kernel_time - compute - idle.
4. comm_overlap = |union(compute) ∩ union(communication)| / |union(communication)|.
Several profiling sessions of one process: each file is measured alone and the times summed.
When timestamps are floats (ns resolution), HTA rounds each event inward to whole µs (start up,
end down) before all of this; so does this function, to agree with it.
Unlike HTA, `hip*` kernels are not taken for communication.
"""

from __future__ import annotations

import numpy as np

from ...breakdown import GpuBreakdown
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


def _totals(ev: RankEvents, drop_last_step: bool) -> tuple[int, int, int, int, int] | None:
    """(kernel_time, idle, compute, comm overlapped by compute, comm) in ns of one trace file."""
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
    comp = spans.merge(start[kind == COMPUTE], end[kind == COMPUTE])
    comm = spans.merge(start[kind == COMM], end[kind == COMM])
    return (kernel_time, kernel_time - spans.length(busy), spans.length(comp),
            spans.overlap(comp, comm), spans.length(comm))


def gpu_breakdown(ev: RankEvents, drop_last_step: bool) -> GpuBreakdown | None:
    return gpu_breakdown_of([(ev, drop_last_step)])


def gpu_breakdown_of(files: list[tuple[RankEvents, bool]]) -> GpuBreakdown | None:
    """The breakdown of one rank from its trace files (several profiling sessions of one
    process): each file's times worked out alone, then summed, so the time between two sessions
    is not taken for idle."""
    got = [t for t in (_totals(ev, drop) for ev, drop in files) if t is not None]
    if not got:
        return None
    kernel_time, idle, compute, overlap, comm_len = (sum(x) for x in zip(*got))
    return GpuBreakdown(
        idle_pct=round(100 * idle / kernel_time, 2),
        compute_pct=round(100 * compute / kernel_time, 2),
        non_compute_pct=round(100 * (kernel_time - compute - idle) / kernel_time, 2),
        kernel_time_us=round(kernel_time / 1000, 1),
        comm_overlap_pct=round(100 * overlap / comm_len, 2) if comm_len else None)
