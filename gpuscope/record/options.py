"""RecordOptions: every option of `gpuscope.record()`, in one frozen, documented dataclass.

`record(run_dir, model, **options)` builds one from its keywords (an unknown keyword is a
TypeError, as a misspelt argument should be); `record(run_dir, model, options=RecordOptions(...))`
takes one whole. `clock` is the recorder's own clock (integer nanoseconds, monotonic): tests
inject one to drive the flush timer without sleeping.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from typing import Callable


def _enabled_by_env() -> bool:
    return os.environ.get("GPUSCOPE_DISABLE", "") in ("", "0")


@dataclass(frozen=True)
class RecordOptions:
    #: rows are summed and handed to the writer thread every `flush_rows` steps ...
    flush_rows: int = 64
    #: ... or once the oldest unwritten step is `flush_s` seconds old
    flush_s: float = 1.0
    #: time optimizer.step() (a hook on every optimizer the model's parameters belong to)
    time_optimizer: bool = True
    #: per-step scalars for TensorBoard's Scalars tab, written on a thread of their own
    tensorboard: bool = False
    #: NVML sampling of utilization, memory, power and clocks (off by itself without a driver)
    telemetry: bool = True
    telemetry_hz: float = 5.0
    #: memory after every step (the process's resident set) and, on CUDA, the allocator's
    #: peaks, retries and out-of-memory errors per flush (memory.py)
    memory: bool = True
    #: FLOPs of one micro-step on one rank (forward, backward, optimizer), for FLOP/s and MFU
    flops_per_step: float | None = None
    #: ... or count them once, on micro-step 2, with torch's FlopCounterMode (flops.py)
    count_flops: bool = False
    #: the device's peak FLOP/s for MFU, where gpuscope's table does not know it
    peak_flops: float | None = None
    #: what a GPU hour costs: the report prices each bottleneck per 1,000 steps
    price_per_gpu_hour: float | None = None
    #: CUDA-event timing of the device's work; None: on when the model is on a CUDA device
    device_timing: bool | None = None
    #: None: on unless the environment sets GPUSCOPE_DISABLE=1
    enabled: bool | None = None
    #: live diagnosis every N steps (0: off): the ranks exchange their sums, rank 0 logs a line
    live_every: int = 0
    #: called on rank 0 with each live diagnosis (a dict)
    on_diagnosis: Callable[[dict], None] | None = None
    #: log the live line on rank 0
    live_log: bool = True
    #: a rank that answers no live exchange for this long is given up on
    live_timeout_s: float = 60.0
    #: the recorder's clock, integer ns (time.perf_counter_ns); tests inject one
    clock: Callable[[], int] = field(default=time.perf_counter_ns, repr=False, compare=False)

    def resolved_enabled(self) -> bool:
        return _enabled_by_env() if self.enabled is None else bool(self.enabled)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
