"""RecordOptions: every option of `gpuscope.record()`, in one frozen, documented dataclass.

`record(run_dir, model, **options)` builds one from its keywords (an unknown keyword is a
TypeError, as a misspelt argument should be); `record(run_dir, model, options=RecordOptions(...))`
takes one whole. `clock` is the recorder's own clock (integer nanoseconds, monotonic): tests
inject one to drive the flush timer without sleeping.
"""

from __future__ import annotations

import os
import time
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Callable


def _enabled_by_env() -> bool:
    return os.environ.get("GPUSCOPE_DISABLE", "") in ("", "0")


#: `gpuscope try`'s trials (trial.py): where a trial records, instead of the run dir the code
#: names, and after how many micro-steps (rec.step() calls) it ends
RUN_DIR_ENV, STOP_AFTER_ENV = "GPUSCOPE_RUN_DIR", "GPUSCOPE_STOP_AFTER"


def trial_run_dir(run_dir) -> str:
    """The run dir to record into: $GPUSCOPE_RUN_DIR when set, else the code's."""
    return os.environ.get(RUN_DIR_ENV) or os.fspath(run_dir)


def stop_after() -> int | None:
    """$GPUSCOPE_STOP_AFTER as a count of micro-steps, None when unset or not a count."""
    value = os.environ.get(STOP_AFTER_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def opt(default, doc: str, **kw):
    """A field of RecordOptions with its meaning, which help() shows (options_help)."""
    return field(default=default, metadata={"doc": doc}, **kw)


@dataclass(frozen=True)
class RecordOptions:
    flush_rows: int = opt(64, "rows are summed and handed to the writer thread every flush_rows "
                              "steps (a kill loses at most these) ...")
    flush_s: float = opt(1.0, "... or once the oldest unwritten step is flush_s seconds old")
    time_optimizer: bool = opt(True, "time optimizer.step() (torch's global optimizer hooks)")
    tensorboard: bool = opt(False, "per-step scalars for TensorBoard's Scalars tab, written on a "
                                   "thread of their own")
    telemetry: bool = opt(True, "NVML sampling of utilization, memory, power, clocks and energy "
                                "(off by itself without a driver)")
    telemetry_hz: float = opt(5.0, "NVML samples per second (1 to 10)")
    memory: bool = opt(True, "the process's resident set and, on CUDA, the allocator's peaks, "
                             "retries and out-of-memory errors: after each of the first 64 "
                             "steps, then per flush (memory.py)")
    flops_per_step: float | None = opt(None, "FLOPs of one micro-step on one rank (forward, "
                                             "backward, optimizer), for FLOP/s and MFU")
    count_flops: bool = opt(False, "... or count them once, on micro-step 2, with torch's "
                                   "FlopCounterMode (flops.py)")
    peak_flops: float | None = opt(None, "the device's peak FLOP/s for MFU, where gpuscope's "
                                         "table does not know it")
    price_per_gpu_hour: float | None = opt(None, "what a GPU hour costs: the report prices each "
                                                 "bottleneck per 1,000 steps")
    device_timing: bool | None = opt(None, "CUDA-event timing of the device's work; None: on "
                                           "when the model is on a CUDA device")
    modules: bool | tuple | list | None = opt(None, "time the forward of these modules per "
                                                   "step (names as model.get_submodule takes "
                                                   "them; True: the model's direct children): "
                                                   "which module a straggler's excess is in "
                                                   "(modules.py); off by default")
    enabled: bool | None = opt(None, "None: on unless the environment sets GPUSCOPE_DISABLE=1")
    live_every: int = opt(0, "live diagnosis every N steps (0: off): the ranks exchange their "
                             "sums, rank 0 logs a line")
    on_diagnosis: Callable[[dict], None] | None = opt(None, "called on rank 0 with each live "
                                                            "diagnosis (a dict)")
    live_log: bool = opt(True, "log the live line on rank 0")
    live_timeout_s: float = opt(60.0, "a rank that answers no live exchange for this long is "
                                      "given up on")
    stall_watch: bool = opt(True, "a thread of the recorder's notices steps that stop coming: "
                                  "writes the rows made so far, then, past stall_s, where the "
                                  "training thread is (stall.py)")
    stall_s: float | None = opt(None, "seconds without a step before a stall is written; None: "
                                      "max(10, 20x the median step), 300 before the 2nd step")
    clock: Callable[[], int] = opt(time.perf_counter_ns, "the recorder's clock, integer ns; "
                                   "tests inject one", repr=False, compare=False)

    def resolved_enabled(self) -> bool:
        return _enabled_by_env() if self.enabled is None else bool(self.enabled)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, base: "RecordOptions | None", kw: dict) -> "RecordOptions":
        """`base` (or the defaults) with the keywords set; an unknown keyword is a TypeError
        that names the nearest options, and says where the knobs come from (a newcomer's
        `record(..., batch_size=8)` is not an option)."""
        unknown = sorted(set(kw) - set(cls.names()))
        if unknown:
            import difflib

            near = sorted({m for k in unknown for m in difflib.get_close_matches(k, cls.names())})
            raise TypeError(
                f"gpuscope.record() has no option {', '.join(map(repr, unknown))}"
                + (f" (did you mean {', '.join(near)}?)" if near else "")
                + ": the knobs (batch size, workers, accumulation) are read from rec.data(loader)"
                " and the model, or given by rec.note_knobs({...}); every option: "
                "help(gpuscope.RecordOptions)")
        if base is None:
            return cls(**kw)
        return replace(base, **kw) if kw else base


def options_help() -> str:
    """Every option, its default and what it does (RecordOptions' and record()'s help())."""
    rows = []
    for f in fields(RecordOptions):
        default = f.default if f.default is not MISSING else f.default_factory.__name__
        rows.append(f"    {f.name} (default {default!r}): {f.metadata.get('doc', '')}")
    return "Options:\n\n" + "\n".join(rows)


RecordOptions.__doc__ = ("Every option of gpuscope.record(), frozen: record(run_dir, model, "
                         "**options) builds one from keywords (an unknown one is a TypeError), "
                         "or pass one as options=RecordOptions(...).\n\n" + options_help())
