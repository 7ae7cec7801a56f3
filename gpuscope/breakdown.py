"""GpuBreakdown: HTA's GPU time breakdown of one rank, as the trace reader gives it and a report
shows it (its own module: the run table and the report both hold it, and neither imports the
other's module for it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuBreakdown:
    """HTA-compatible GPU time breakdown of one rank, % of kernel time (Kineto GPU input)."""

    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    kernel_time_us: float
    comm_overlap_pct: float | None   # None without communication kernels

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GpuBreakdown":
        return cls(**d)
