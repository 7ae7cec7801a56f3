"""`gpuscope.record`: per-rank step timings taken inside the training loop.

The hot path only takes host timestamps (``time.perf_counter_ns``) and appends to lists; at
``step()`` a handful of intervals are summed into one row that goes to an append-only file.
No device synchronization, no collective. Any error inside gpuscope is logged once and
recording degrades; it never reaches the training loop.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

from ._log import logger, warn_once
from .dist import detect_placement
from .knobs import batch_size_of, loader_knobs, model_knobs, process_knobs
from .record_format import SCHEMA, STEP_COLUMNS, RecordWriter, rank_file_name
from .step_row import sum_step

_now = time.perf_counter_ns
_cpu = time.thread_time_ns

#: phase names that count as communication (blocking, host-visible) when used with rec.phase()
COMM_PHASES = {"comm", "communication", "allreduce", "all_reduce", "all_gather", "reduce_scatter",
               "broadcast", "barrier", "send", "recv"}
_FIXED = {"forward": "forward_ns", "backward": "backward_ns", "optimizer": "optimizer_ns"}


class Recorder:
    """Context manager returned by :func:`record`. See DESIGN.md for the contract."""

    def __init__(self, run_dir, model=None, *, flush_rows: int = 16, flush_s: float = 1.0,
                 time_optimizer: bool = True, tensorboard: bool = False,
                 telemetry: bool = True, telemetry_hz: float = 5.0,
                 device_timing: bool | None = None, enabled: bool | None = None):
        if enabled is None:
            enabled = os.environ.get("GPUSCOPE_DISABLE", "") in ("", "0")
        self.run_dir = os.fspath(run_dir)
        self.model = model
        self.enabled = enabled
        self._flush_rows = flush_rows
        self._flush_s = flush_s
        self._flush_ns = int(flush_s * 1e9)
        self._raw: list = []
        self._time_optimizer = time_optimizer
        self._writer: RecordWriter | None = None
        self._tensorboard = tensorboard
        self._telemetry = telemetry
        self._telemetry_hz = telemetry_hz
        self._sampler = None
        self._device_timing = device_timing
        self._dev = None         # DeviceTimer when the model trains on a CUDA device
        self._tb = None          # BackgroundScalars, created on first flush when tensorboard=True
        self._handles: list = []
        self._comm_timer = None
        self._knobs: dict = {}
        self._batch_size_known = False
        self.placement = None
        self.steps = 0
        self.warnings: list[str] = []
        self._reset_step(None)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Recorder":
        if not self.enabled:
            return self
        try:
            self._open()
        except Exception as exc:
            self._fail("open", exc)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self._close(crashed=exc_type is not None)
        except Exception as err:
            self._fail("close", err)
        return False  # never swallow the training loop's own exception

    def _open(self) -> None:
        self.placement = p = detect_placement()
        self._t0_perf = _now()
        self._t0_unix = time.time_ns()
        self._knobs = {"world_size": p.world_size, **process_knobs(p.local_world_size)}
        if self.model is not None:
            self._knobs.update(model_knobs(self.model))
            self._install_model_hooks(self.model)
        if self._time_optimizer and "torch" in sys.modules:
            self._install_optimizer_hooks()
        gpu: dict = {}
        if self._wants_device_timing():
            from . import cuda_timing

            self._dev = cuda_timing.DeviceTimer(cuda_timing.backend_factory())
            if self._comm_timer is not None:
                self._comm_timer.device = self._dev
            gpu["device_timing"] = "cuda_events"
        if self._telemetry:
            from .nvml import Sampler

            self._sampler = Sampler(p.local_rank, self._telemetry_hz).start()
            gpu.update(self._sampler.device or {"telemetry": f"off: {self._sampler.reason}"})
        header = {"schema": SCHEMA, "rank": p.rank, "local_rank": p.local_rank,
                  "world_size": p.world_size, "host": p.host, "pid": os.getpid(),
                  "placement_source": p.source, "start_unix_ns": self._t0_unix,
                  "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
                  "comm_timing": self._comm_timing_mode(), "knobs": self._knobs, "gpu": gpu}
        path = os.path.join(self.run_dir, rank_file_name(p.rank))
        self._writer = RecordWriter(path, header)

    def _close(self, crashed: bool) -> None:
        if self._writer is None:
            return
        if self._raw:
            self._flush_rows_now()
        self._flush_side_channels(final=True)
        end: dict = {"steps": self.steps, "crashed": crashed, "end_unix_ns": self._unix(_now())}
        if self._dev is not None:
            try:
                import torch

                end["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            except Exception:
                pass
        if self._comm_timer is not None:
            from .ddp_timing import ddp_logging_summary

            self._comm_timer.detach()
            end["ddp_logging"] = ddp_logging_summary(self.model)
            end["comm_hook"] = self._comm_timer.hook_name
        if self._tensorboard:
            self._flush_tensorboard([], close=True)
        if self.warnings:
            end["warnings"] = self.warnings
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._handles.clear()
        writer, self._writer = self._writer, None
        writer.close(end)

    def _wants_device_timing(self) -> bool:
        if self._device_timing is not None:
            return bool(self._device_timing)
        return str(self._knobs.get("device", "")).startswith("cuda")

    def _flush_side_channels(self, final: bool = False) -> None:
        """Device times of finished steps and NVML samples, written beside the step rows."""
        if self._writer is None:
            return
        if self._dev is not None:
            try:
                rows = self._dev.resolve(wait=final)
                if rows:
                    self._writer.add_meta({"device": rows})
            except Exception as exc:
                warn_once("device-timing", "gpuscope: device timing off: %r", exc)
                self._dev = None
        if self._sampler is not None:
            samples = self._sampler.drain()
            if samples:
                self._writer.add_meta({"nvml": samples})
            if final:
                self._sampler.stop()

    def _comm_timing_mode(self) -> str:
        if self._comm_timer is not None and self._comm_timer.active:
            return "ddp_comm_hook"
        if self._comm_timer is not None:
            return "ddp_logging"
        return "phases"

    # ----------------------------------------------------------------- hooks
    def _install_model_hooks(self, model) -> None:
        from .ddp_timing import DDPCommTimer, is_ddp

        if is_ddp(model):
            self._comm_timer = DDPCommTimer(model, self._on_comm)
            if not self._comm_timer.install():
                self.warnings.append(self._comm_timer.reason)
        if hasattr(model, "register_forward_pre_hook"):
            self._handles.append(model.register_forward_pre_hook(self._on_forward_start))
            self._handles.append(model.register_forward_hook(self._on_forward_end))

    def _install_optimizer_hooks(self) -> None:
        try:
            from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                               register_optimizer_step_pre_hook)
        except Exception:
            return
        self._handles.append(register_optimizer_step_pre_hook(self._on_opt_start))
        self._handles.append(register_optimizer_step_post_hook(self._on_opt_end))

    def _on_forward_start(self, module, args):
        t = _now()
        self._mark_start(t)
        self._fwd_t0 = t

    def _on_forward_end(self, module, args, output):
        t = _now()
        if self._fwd_t0 is not None:
            self._phases.append(("forward", self._fwd_t0, t))
            self._fwd_t0 = None
            self._fwd_end = t

    def _on_opt_start(self, optimizer, args, kwargs):
        t = _now()
        self._mark_start(t)
        self._opt_t0 = t

    def _on_opt_end(self, optimizer, args, kwargs):
        if self._opt_t0 is not None:
            self._phases.append(("optimizer", self._opt_t0, _now()))
            self._opt_t0 = None

    def _on_comm(self, bucket_index: int, launch_ns: int, done_ns: int) -> None:
        self._comm.append((launch_ns, done_ns))  # list.append is atomic under the GIL

    # ----------------------------------------------------------------- public API
    def data(self, iterable):
        """Yield from `iterable`, timing how long each batch takes to arrive."""
        if self.enabled:
            try:
                self._note_knobs(loader_knobs(iterable))
            except Exception as exc:
                self._fail("data", exc)
        it = iter(iterable)
        while True:
            c0 = _cpu()
            t0 = _now()
            try:
                item = next(it)
            except StopIteration:
                return
            t1 = _now()
            if self.enabled:
                if self._step_start is None:
                    self._step_start = t0
                self._data_ns += t1 - t0
                self._data_cpu_ns += _cpu() - c0
                if self._dev is not None:
                    self._dev.batch_ready()
                if not self._batch_size_known:
                    self._learn_batch_size(item)
            yield item

    @contextmanager
    def phase(self, name: str, kind: str | None = None):
        """Time a named part of the step. kind: "compute" (default) or "comm" (blocking)."""
        t0 = _now()
        self._mark_start(t0)
        try:
            yield self
        finally:
            t1 = _now()
            if kind is None:
                kind = "comm" if name.lower() in COMM_PHASES else "compute"
            if kind == "comm":
                self._comm_phases.append((t0, t1))
            else:
                self._phases.append((name, t0, t1))

    def step(self) -> None:
        """Close the current step and start the next one."""
        now = _now()
        if not self.enabled:
            return
        try:
            if self._step_start is not None:
                if self._dev is not None:
                    self._dev.step_end(self.steps)
                comm, self._comm = self._comm, []
                # the raw intervals only: rows are summed in batches, off the per-step path
                self._raw.append((self.steps, self._step_start, now, self._data_ns,
                                  self._data_cpu_ns, self._phases, self._comm_phases, comm,
                                  self._fwd_end))
                self.steps += 1
                if len(self._raw) >= self._flush_rows or now - self._raw[0][1] >= self._flush_ns:
                    self._flush_rows_now()
        except Exception as exc:
            self._fail("step", exc)
        self._reset_step(now)

    def _flush_rows_now(self) -> None:
        raw, self._raw = self._raw, []
        rows = [sum_step(*r, start_unix=self._unix(r[1])) for r in raw]
        if self._writer is not None:
            self._writer.add_rows(rows)
        if self._tensorboard:
            self._flush_tensorboard(rows)
        self._flush_side_channels()

    # ----------------------------------------------------------------- internals
    def _mark_start(self, t: int) -> None:
        if self._step_start is None:
            self._step_start = t

    def _reset_step(self, start) -> None:
        self._step_start = start
        self._data_ns = 0
        self._data_cpu_ns = 0
        self._phases: list = []
        self._comm_phases: list = []
        if not hasattr(self, "_comm"):
            self._comm: list = []
        self._fwd_t0 = None
        self._fwd_end = None
        self._opt_t0 = None

    def _unix(self, perf_ns: int) -> int:
        return self._t0_unix + (perf_ns - self._t0_perf)


    def _flush_tensorboard(self, rows: list, close: bool = False) -> None:
        """Per-step scalars for TensorBoard, in batches; a failure only turns them off."""
        try:
            if self._tb is None and rows:
                from .tb_scalars import BackgroundScalars

                rank = self.placement.rank if self.placement else 0
                self._tb = BackgroundScalars(self.run_dir, rank)
            if self._tb is not None:
                tb = self._tb
                if rows:
                    tb.write(rows)
                if close:
                    tb.close()
                if close or tb.error is not None:
                    self._tb = None
                if tb.error is not None:
                    raise tb.error
        except Exception as exc:
            warn_once("tensorboard", "gpuscope: TensorBoard scalars disabled: %r", exc)
            self.warnings.append(f"TensorBoard scalars disabled: {exc!r}")
            self._tensorboard = False

    def _learn_batch_size(self, item) -> None:
        self._batch_size_known = True
        try:
            if self._knobs.get("batch_size") is None:
                bs = batch_size_of(item)
                if bs is not None:
                    self._note_knobs({"batch_size": bs})
        except Exception as exc:
            self._fail("batch", exc)

    def _note_knobs(self, knobs: dict) -> None:
        knobs = {k: v for k, v in knobs.items() if self._knobs.get(k) != v}
        if not knobs:
            return
        self._knobs.update(knobs)
        if "batch_size" in knobs and knobs["batch_size"] is not None:
            self._batch_size_known = True
        if self._writer is not None:
            self._writer.add_meta({"knobs": knobs, "at_step": self.steps})

    def _fail(self, where: str, exc: Exception) -> None:
        """Log once, stop recording, keep the training loop running."""
        warn_once(f"recorder-{where}", "gpuscope: recording disabled after an internal error in %s: %r",
                  where, exc, exc_info=True)
        self.warnings.append(f"internal error in {where}: {exc!r}")
        self.enabled = False
        if self._comm_timer is not None:
            self._comm_timer.detach()
        if self._sampler is not None:
            self._sampler.stop()
        if self._writer is not None:
            try:
                self._writer.close({"steps": self.steps, "crashed": False,
                                    "recorder_error": f"{where}: {exc!r}"})
            except Exception:
                pass
            self._writer = None


def record(run_dir, model=None, **options) -> Recorder:
    """Record per-rank step timings into `run_dir`::

        with gpuscope.record("runs/exp1", model=ddp_model) as rec:
            for batch in rec.data(loader):
                ...
                rec.step()
    """
    return Recorder(run_dir, model, **options)


__all__ = ["Recorder", "record", "logger"]
