"""`gpuscope.record`: per-rank step timings taken inside the training loop.

The hot path only takes host timestamps (``time.perf_counter_ns``) and appends to lists; rows are
summed every few steps and go to an append-only file. No device synchronization, no collective.

Lifecycle (lifecycle.py: one state and the table of what moves it): ``start()`` (or entering
the ``with`` block) opens the file and installs the hooks; ``stop()`` (or leaving it) writes what
is left and tears everything down. SIGTERM is taken by sigterm.py's guard; the stall watcher
reads the recorder through watched.py, and both ways out write one end record (_end_record). Every way out - a clean
stop, an exception in training, an error inside gpuscope, the interpreter exiting without
``stop()`` - goes through the one teardown: the sinks closed in one loop, last opened first
(sinks.py: device times, NVML, DataParallel, memory, live diagnosis, TensorBoard, the profiler
watch, the FLOP counter, the precision probe, the stall watcher), then the hooks removed, then
the file closed. Per-step state is kept only while recording is active, so a disabled or failed
recorder holds nothing. Any error inside gpuscope is logged once and recording stops; it never
reaches the training loop.

The recorder is a container: the hooks append events to its StepLog, step() takes them and calls
the sinks that listen, a flush makes the rows (rows.build) and hands them to every sink, and the
options are read from its one frozen RecordOptions.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time
from contextlib import contextmanager

from .._log import warn_once
from ..run_format import COMM_KEY, SCHEMA, STEP_COLUMNS
from .events import StepLog
from .hooks import Hooks
from .lifecycle import State, next_state
from .knobs import batch_knobs, batch_size_of, loader_knobs, model_knobs, process_knobs
from .options import RecordOptions, options_help, stop_after, trial_run_dir
from .placement import detect_placement, job_id
from .rows import build
from .sigterm import SigtermGuard
from .sinks import (Closing, DataParallelTimes, DeviceTimes, FlopCounting, LiveDiagnosis,
                    ModuleTimes, RoutingSink, Sink, Telemetry, TensorBoardScalars)
from .writer import RecordWriter

_cpu = time.thread_time_ns
#: the training thread's CPU time in a fetch is read (two system calls, ~1 us each on a VM, where
#: the clock is ~70 ns) on the first fetch, on each after one that waited this long, and on one in
#: CPU_SAMPLE_EVERY of the rest: how much of a fast fetch was CPU work decides nothing
CPU_TIMED_WAIT_NS = 20_000
CPU_SAMPLE_EVERY = 16

#: phase names that count as communication (blocking, host-visible) when used with rec.phase()
COMM_PHASES = {"comm", "communication", "allreduce", "all_reduce", "all_gather", "reduce_scatter",
               "broadcast", "barrier", "send", "recv"}

class TrialEnd(SystemExit):
    """A `gpuscope try` trial's end (Recorder._end_trial): exit status 0."""


class Recorder:
    """Returned by :func:`record`: a context manager, or ``start()`` / ``stop()``. See DESIGN.md."""

    def __init__(self, run_dir, model=None, options: RecordOptions | None = None, **kw):
        """`options`: a RecordOptions; keywords set its fields one by one (record()'s way)."""
        o = RecordOptions.of(options, kw)
        self.options = o
        self.run_dir = trial_run_dir(run_dir)  # a `gpuscope try` trial's, else the code's
        self.model = model
        self.enabled = o.resolved_enabled()
        self.path: str | None = None  # this recording's rank file, once started
        self.placement = None
        self.steps = 0
        self._stop_after = stop_after()  # a trial ends after this many micro-steps
        self.warnings: list[str] = []
        self.state = State.NEW   # lifecycle.py: what start() and stop() may do
        #: the hot path's one flag: True while steps are recorded (RUNNING, enabled, opened);
        #: per-step state is kept only while it is
        self._active = False
        self._writer: RecordWriter | None = None
        self._hooks: Hooks | None = None
        #: the side channels (sinks.py), in the order opened: flushed, called at each step's end
        #: (those that listen) and closed in one loop each
        self._sinks: list[Sink] = []
        # made of the sinks by _rewire whenever one comes or goes, never set elsewhere:
        self._listeners: tuple = ()  # the sinks step() calls (Sink.listens)
        self._dev = None         # the DeviceTimer: the data wrapper marks fetches on it
        self._live = None        # live.Live: step() starts its exchange every live_every steps
        self._mesh_checked = False  # the model's DeviceMesh dimensions looked for (once)
        self._memory_at_error: dict = {}
        self._log = StepLog(o.clock)  # the micro-step being recorded: its events
        self._knobs: dict = {}
        self._batch_seen = False
        self._first_batch = None
        #: micro-steps not flushed yet: rows.build's items. A deque: the training thread
        #: appends, a flush (the training thread's, or the stall watcher's once steps stop
        #: coming) takes what it counted from the left, under _flush_lock
        self._raw: collections.deque = collections.deque()
        self._flush_lock = threading.Lock()
        self._flush_at = 0       # when the oldest of them is flush_s old (clock ns)
        self._micro = 0          # micro-steps since the last optimizer step
        self.live_summaries: list[dict] = []  # rank 0: the live diagnoses, in order
        self._t0_perf: int | None = None  # when the recording opened: the clock's ...
        self._t0_unix: int | None = None  # ... and the unix time then
        #: why training ended, where the end record says (_end_record): its error, where it
        #: was raised, and a SIGTERM that stopped it (the training thread's or the watcher's)
        self._error: str | None = None
        self._error_where: dict | None = None
        self._terminated: str | None = None
        self._terminated_where: dict | None = None
        self._sigterm = SigtermGuard(lambda: self.state is State.STOPPING, self._on_sigterm)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> "Recorder":
        """Start recording (once); returns self. Never raises into training."""
        if not self._move("start"):
            warn_once("recorder-restart", "gpuscope: a recorder starts once; create a new one "
                                          "with gpuscope.record() for another recording")
            return self
        if not self.enabled:
            return self
        try:
            self._open()
            self._active = self._log.active = True
            atexit.register(self._at_exit)
            self._sigterm.install()
        except Exception as exc:
            self._fail("open", exc)
        return self

    def stop(self, crashed: bool = False) -> None:
        """Write what is left and tear down; safe to call more than once."""
        if not self._move("stop"):
            return
        end = None
        try:
            if self._active:
                end = self._finish(crashed)
        except Exception as exc:
            self._fail("close", exc)
        finally:
            self._teardown(end)
            self._move("closed")
            self._sigterm.take_pending()  # one that came in while closing: now taken

    def _move(self, event: str) -> bool:
        """The lifecycle's move for `event` (lifecycle.TRANSITIONS); False where the state
        does not take it."""
        state = next_state(self.state, event)
        if state is None:
            return False
        self.state = state
        return True

    @property
    def active(self) -> bool:
        """True while steps are being recorded."""
        return self._active

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and not issubclass(exc_type, TrialEnd):
            self._note_error(exc_type, exc, tb)
        self.stop(crashed=exc_type is not None)
        return False  # never swallow the training loop's own exception

    def _note_error(self, exc_type, exc, tb) -> None:
        """Which error ended training (told apart from a peer's failure when analysed), where it
        was raised, and what memory held then (an OOM's post-mortem)."""
        try:
            self._error = f"{exc_type.__name__}: {exc}"[:400]
        except Exception:
            self._error = getattr(exc_type, "__name__", "an exception")
        for sink in self._sinks:
            try:
                self._memory_at_error.update(sink.at_error() or {})
            except Exception:
                pass
        self._error_where = self._where_raised(tb)
        self._add_collectives(self._error_where, "error")

    def _add_collectives(self, w: dict | None, when: str) -> None:
        """What a stall record holds besides where: the collectives issued per group, and from
        the Flight Recorder (dumped beside the record) the oldest one not completed and the last
        one issued (a collective a peer's death failed reads as completed: its kind is still
        known)."""
        if w is None or "torch.distributed" not in sys.modules:
            return
        try:
            from .stall import dump_flight_recorder, sequence_numbers

            w["groups"] = sequence_numbers()
            fr = dump_flight_recorder(self.path, when) or {}
            pending = fr.get("pending") or []
            if pending and "kind" not in w:
                w["waits_on"] = {k: pending[0][k] for k in ("kind", "group", "seq", "sizes")}
            if fr.get("last"):
                w["last_issued"] = fr["last"]
        except Exception:
            pass

    def _where_raised(self, tb, frame=None) -> dict | None:
        """Where training was when it raised (stall.where on the traceback's innermost frame,
        `at` the innermost frame of the user's code the exception passed through), or when a
        signal came (`frame`): a collective that failed on a lost peer names its kind, group
        and number."""
        try:
            if (tb is None and frame is None) or not self._active:
                return None
            from .stall import is_user_file, where, wrapper_codes

            at = None
            while tb is not None:
                code = tb.tb_frame.f_code
                if is_user_file(code.co_filename):
                    at = f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} ({code.co_name})"
                if tb.tb_next is None:
                    break
                tb = tb.tb_next
            out = where(self._log, tb.tb_frame if tb is not None else frame,
                        wrapper_codes(Recorder.time_fetches.__code__), self._unix)
            out["stack"] = out["stack"][:12]
            if at is not None:
                out["at"] = at
            return out
        except Exception:
            return None

    def _where_signalled(self, frame) -> dict | None:
        """Where training was when a signal came, with what a stall record holds: the
        collectives issued per group, and the oldest one the Flight Recorder has not seen
        complete (dumped beside the record: a job stopped while it hung is told from them)."""
        w = self._where_raised(None, frame)
        self._add_collectives(w, "sigterm")
        return w

    def _on_sigterm(self, frame) -> None:
        """A SIGTERM came to the training thread while recording (sigterm.SigtermGuard): the
        recording is closed with where it came; the default action then ends the process."""
        self._terminated = "SIGTERM"
        self._terminated_where = self._where_signalled(frame)
        self.stop()

    def _at_exit(self) -> None:
        """The interpreter is exiting and stop() was never called (start() without stop()): an
        exception that ended the program (the interpreter keeps it as sys.last_value) is noted
        as `with` notes it."""
        exc = getattr(sys, "last_value", None)
        if exc is not None and self.state is State.RUNNING and self._active:
            self._note_error(type(exc), exc, getattr(sys, "last_traceback", None))
        self.stop(crashed=exc is not None)

    def _open(self) -> None:
        self.placement = p = detect_placement()
        o = self.options
        # the file first: nothing is hooked into training unless the recording can be written
        self._writer = RecordWriter(self.run_dir, p.rank)
        self.path = self._writer.path
        self._t0_perf = o.clock()
        self._t0_unix = time.time_ns()
        self._knobs = {"world_size": p.world_size, **process_knobs(p.local_world_size)}
        if self.model is not None:
            self._knobs.update(model_knobs(self.model))
        if o.flops_per_step:
            self._knobs.update(flops_per_step=float(o.flops_per_step), flops_source="given")
        if o.peak_flops:
            self._knobs["peak_flops"] = float(o.peak_flops)
        if o.price_per_gpu_hour:
            self._knobs["price_per_gpu_hour"] = float(o.price_per_gpu_hour)
        if "torch" not in sys.modules:
            self._without_torch()
        self._hooks = Hooks(self._log, self.model, o.time_optimizer)
        self._hooks.install()
        self.warnings += self._hooks.warnings
        self._open_precision_probe()
        from .profiler_facts import ProfilerWatch, profiling_probe

        probe = profiling_probe()
        if probe is not None:
            self._add_sink(ProfilerWatch(probe, self._knobs, self._note_knobs,
                                         lambda: build(list(self._raw), 0).rows))
        if self._hooks.collectives is not None:
            self._add_sink(RoutingSink())
        gpu = self._open_device_channels()
        capacity = self._open_memory() if o.memory else {}
        if o.telemetry:
            from .nvml import Sampler

            sampler = Sampler(p.local_rank, o.telemetry_hz, now=lambda: self._unix(o.clock()),
                              clock=o.clock).start()
            self._add_sink(Telemetry(sampler))
            gpu.update(sampler.device or {"telemetry": f"off: {sampler.reason}"})
        if (o.live_every or 0) > 0:
            self._start_live(p)
        if o.count_flops and not o.flops_per_step:
            from .flops import FlopCount

            self._add_sink(FlopCounting(FlopCount(at=2), self._note_knobs))
        if gpu.get("device_timing") and "name" not in gpu:
            try:
                import torch

                gpu["name"] = torch.cuda.get_device_name(self._cuda_index())
            except Exception:
                pass
        if o.tensorboard:
            name = os.path.basename(self.path or "rank").split(".", 1)[0]
            self._add_sink(TensorBoardScalars(self.run_dir, name))
        self._write_header(p, gpu, capacity)
        if o.stall_watch:  # what a hang or a death leaves: where each rank was
            self._start_stall_watch(p)
            self._watch_fatal()

    def _open_device_channels(self) -> dict:
        """DataParallel's replicas, the device's own times and the chosen modules' forwards:
        what the header's "gpu" says of them."""
        gpu: dict = {}
        if self._knobs.get("parallel") == "DataParallel":
            from .dataparallel import DataParallelTimer

            dp = DataParallelTimer(self.model, now=self.options.clock)
            if dp.install():
                self._add_sink(DataParallelTimes(dp))
        if self._wants_device_timing():
            from . import cuda_timing

            # events for the steps between two resolves (a flush): five a step, and a few more
            dev = cuda_timing.DeviceTimer(cuda_timing.backend_factory(),
                                          pool_size=5 * min(self.options.flush_rows, 256) + 8)
            self._add_sink(DeviceTimes(dev))
            if self._hooks.ddp is not None:
                self._hooks.ddp.device = dev
            gpu["device_timing"] = "cuda_events"
        if self.options.modules and self.model is not None:
            self._open_modules(self.options.modules)
        return gpu

    def _write_header(self, p, gpu: dict, capacity: dict) -> None:
        """The rank file's first line: who, where, the clock, the columns, the knobs so far."""
        o = self.options
        self._writer.write_header({
            "schema": SCHEMA, "rank": p.rank, "local_rank": p.local_rank,
            "world_size": p.world_size, "host": p.host, "pid": os.getpid(),
            "placement_source": p.source, "run_id": job_id(),
            "recording": self._writer.recording, "start_unix_ns": self._t0_unix,
            "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
            "comm_timing": self._comm_timing_mode(), "comm_key": COMM_KEY,
            "knobs": self._knobs, "gpu": gpu,
            "memory": capacity,
            # rows reach the file every `rows` steps or `s` seconds: what a kill can lose
            "flush": {"rows": o.flush_rows, "s": float(o.flush_s)}})

    def _open_precision_probe(self) -> None:
        """The dtype the model's maths runs in (autocast, TF32), read once inside its forward
        (precision.py): MFU's peak follows it."""
        from .hooks import timed_module

        module = timed_module(self.model) if self.model is not None else None
        if module is None or "torch" not in sys.modules:
            return
        from .precision import PrecisionProbe

        device = str(self._knobs.get("device", "cpu")).split(":", 1)[0]
        probe = PrecisionProbe(module, device, self._note_knobs)
        self._add_sink(Closing("precision probe", probe.remove))

    def _open_memory(self) -> dict:
        """The memory sink (memory.py) and what this machine can hold, for the header."""
        from . import memory
        from .memory import MemorySink, host_capacity, host_rss

        capacity = host_capacity()
        device = None
        if self._wants_device_timing():
            try:
                device = memory.device_factory(self._cuda_index())
                capacity["device_total_bytes"] = device.total_bytes()
                limits = getattr(device, "limits", None)
                if limits is not None:
                    capacity.update(limits())
            except Exception as exc:
                self.warnings.append(f"device memory not sampled: {exc!r}"[:300])
                device = None
        rss = host_rss()
        if rss is not None or device is not None:
            self._add_sink(MemorySink(rss, device))
        return capacity

    def _cuda_index(self):
        dev = str(self._knobs.get("device", ""))
        return int(dev.split(":", 1)[1]) if dev.startswith("cuda:") else None

    def _finish(self, crashed: bool) -> dict:
        """Flush the last rows and side channels; the end record."""
        if self._raw:
            self._flush_rows_now()
        self._flush_sinks(None, final=True)

        end = self._end_record(crashed)
        if self._dev is not None:
            try:
                import torch

                end["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            except Exception:
                pass
        self._end_of_hooks(end)
        self._close_sinks()  # before the end record: what failed to close is in its warnings
        if self._writer is not None and self._writer.dropped:
            self.warnings.append(f"{self._writer.dropped} line(s) dropped while writes to the "
                                 "run dir stalled")
        if self.warnings:
            end["warnings"] = self.warnings
        return end

    def _end_record(self, crashed: bool, blocked: bool = False) -> dict:
        """The end record's facts of how training ended, one builder for both ways out: the
        training thread's close (_finish adds what the hooks and sinks learnt) and the stall
        watcher's, which writes it while training is blocked in native code (`blocked`)."""
        end: dict = {"steps": self.steps, "crashed": crashed,
                     "end_unix_ns": self._unix(self.options.clock())}
        if self._terminated:
            end["terminated"] = self._terminated
            if self._terminated_where:
                end["terminated_where"] = self._terminated_where
        if blocked:
            end["blocked"] = True
        if crashed and self._error:
            end["error"] = self._error
            if self._error_where:
                end["error_where"] = self._error_where
        if crashed and self._memory_at_error:
            end["memory_at_error"] = self._memory_at_error
        return end

    def _end_of_hooks(self, end: dict) -> None:
        """What the hooks learnt for the end record: DDP's own logging and comm hook, the
        collectives launched on a stream gpuscope could not time."""
        ddp = self._hooks.ddp if self._hooks is not None else None
        if ddp is not None:
            from .ddp_timing import ddp_logging_summary

            end["ddp_logging"] = ddp_logging_summary(ddp.ddp, ddp.first_sample)
            user = getattr(ddp.ddp, "_comm_hooks", None)  # DDP keeps the user's hooks here
            end["comm_hook"] = (getattr(user[-1][0], "__qualname__", repr(user[-1][0])) if user
                                else "DDP's built-in all-reduce")
        timer = self._hooks.collectives if self._hooks is not None else None
        if timer is not None and timer.on_stream:
            from .collectives import untimed_on_stream

            self.warnings.append(untimed_on_stream(timer.on_stream, self.steps))

    def _teardown(self, end: dict | None = None) -> None:
        """The one way out, run on every exit path; idempotent, never raises: the sinks in one
        loop, the last opened first, then the hooks, the record file last of all (it takes the
        end record)."""
        self._active = self._log.active = False
        self._log.clear()
        self._raw.clear()
        try:
            atexit.unregister(self._at_exit)
        except Exception:
            pass
        self._close_sinks()  # (what stop() left open: after an error, or the file failing)
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            try:
                hooks.remove()
            except Exception as exc:
                warn_once("recorder-close-hooks", "gpuscope: could not close the hooks: %r", exc)
        writer, self._writer = self._writer, None
        if writer is not None:
            self._close_writer(writer, end)
        # last: a SIGTERM during the close above still waits for the end record
        self._sigterm.release()

    def _close_writer(self, writer: RecordWriter, end: dict | None) -> None:
        try:
            writer.close(end)
        except Exception as exc:
            warn_once("recorder-final-close", "gpuscope: could not close %s: %r", writer.path, exc)
        if writer.error is not None:
            warn_once("recorder-write", "gpuscope: recording stopped after step %d: %s",
                      self.steps, writer.error)

    def _open_modules(self, which) -> None:
        """Time the forward of the chosen modules (modules.py): CUDA events where the device
        is timed, the host clock otherwise."""
        from .modules import ModuleTimer, resolve

        names, mods, warnings = resolve(self.model, which)
        self.warnings += warnings
        events = None
        if self._wants_device_timing():
            from . import cuda_timing

            events = cuda_timing.backend_factory()
        timer = ModuleTimer(names, mods, self.options.clock, events)
        if timer.install():
            self._add_sink(ModuleTimes(timer))

    def _wants_device_timing(self) -> bool:
        if self.options.device_timing is not None:
            return bool(self.options.device_timing)
        return str(self._knobs.get("device", "")).startswith("cuda")

    # ----------------------------------------------------------------- sinks
    def _add_sink(self, sink: Sink) -> None:
        """Open a side channel: flushed from now on, called at each step's end if it listens,
        closed at stop() or teardown."""
        self._sinks.append(sink)
        self._rewire()

    def _rewire(self) -> None:
        """What the step path reads of the sinks, made again from their list: the listeners,
        and the two channels it calls directly (the device timer at each fetch,
        and the live exchange every live_every steps)."""
        sinks = self._sinks
        self._listeners = tuple(s for s in sinks if s.listens)
        self._dev = next((s.timer for s in sinks if isinstance(s, DeviceTimes)), None)
        self._live = next((s.live for s in sinks if isinstance(s, LiveDiagnosis)), None)

    def _unlisten(self, sink: Sink) -> None:
        """A listener said it wants no more step ends (the memory sink past the young steps)."""
        sink.listens = False
        self._rewire()

    def _drop_sink(self, sink: Sink) -> bool:
        """Take a sink out (once): False when it was gone already."""
        if sink not in self._sinks:
            return False
        self._sinks.remove(sink)
        self._rewire()
        sink.close()  # the callers warn if this raises
        return True

    def _flush_sinks(self, built, final: bool = False, wake: bool = True) -> None:
        """Hand every sink the rows just made (rows.Built), write what each measured beside
        them, and show every sink what the others measured (TensorBoard plots the memory)."""
        metas = []
        for sink in list(self._sinks):
            try:
                if built is not None:
                    sink.rows(built)
                meta = sink.meta(final)
                if meta:
                    metas.append(meta)
                    if self._writer is not None:
                        self._writer.add_meta(meta, wake)
            except Exception as exc:
                self._sink_failed(sink, exc)
        for meta in metas:
            for sink in list(self._sinks):
                try:
                    sink.side(meta)
                except Exception as exc:
                    self._sink_failed(sink, exc)

    def _sink_failed(self, sink: Sink, exc: Exception) -> None:
        """One sink raised: it alone goes (warned once, noted for the end record)."""
        if sink in self._sinks:
            self._sinks.remove(sink)
            self._rewire()
        self.warnings.append(f"{sink.off}: {exc!r}"[:400])
        sink.abandon(exc)

    def _close_sinks(self) -> None:
        """Close every sink, last opened first; a failure is warned once and goes into the
        warnings (the end record's, when it is still to be written)."""
        for sink in reversed(list(self._sinks)):
            try:
                self._drop_sink(sink)
            except Exception as exc:
                warn_once(f"sink-{sink.name}", "gpuscope: %s: %r", sink.off, exc)
                self.warnings.append(f"{sink.off}: {exc!r}"[:400])

    def _comm_timing_mode(self) -> str:
        """How communication is timed: the tail of DDP's backward (with DDP's own logging for
        what backward hides), torch.distributed's collectives, or only rec.phase("comm")."""
        hooks = self._hooks
        modes = []
        if hooks is not None and hooks.ddp is not None:
            modes.append("ddp_tail")
        if hooks is not None and hooks.collectives is not None:
            modes.append("collectives")
        return "+".join(modes) or "phases"

    # ----------------------------------------------------------------- public API
    def data(self, iterable):
        """Yield from `iterable`, timing how long each batch takes to arrive (untouched when the
        recorder is off)."""
        if not self._active:
            return iter(iterable)
        self.note_loader(iterable)
        return self.time_fetches(iter(iterable))

    def note_loader(self, loader) -> None:
        """Take the loader's settings (batch size, workers, ...) as knobs."""
        if self._active:
            try:
                self._note_knobs(loader_knobs(loader))
            except Exception as exc:
                self._fail("data", exc)

    def time_fetches(self, iterator):
        """Yield from an iterator, timing each next() as the wait for a batch, and the training
        thread's CPU time in it where that tells something (CPU_TIMED_WAIT_NS; -1 elsewhere)."""
        clock, fetched = self._log.now, self._log.fetched
        timed, n = True, 0
        while True:
            if self._dev is not None:
                self.fetch_started()
            c0 = _cpu() if timed else 0
            t0 = clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            t1 = clock()
            if self._active:  # batch_fetched(), a call less
                fetched(t0, t1, _cpu() - c0 if timed else -1)
                if self._dev is not None:
                    self._dev.batch_ready()
                self.note_batch(item)
            n += 1
            timed = t1 - t0 >= CPU_TIMED_WAIT_NS or n % CPU_SAMPLE_EVERY == 0
            yield item

    def fetch_started(self) -> None:
        """The loop asks for a batch now (batch_fetched() follows): on CUDA, the GPU's idle time
        while the host is inside next() is measured from here."""
        if not self._active or self._dev is None:
            return
        try:  # did the step queue any work before this fetch (a loop that prefetches mid-step)?
            self._dev.fetch_start(not self._log.begun())
        except Exception as exc:
            self._fail("device timing", exc)

    def batch_fetched(self, t0: int, t1: int, cpu_ns: int | None = None, batch=None) -> None:
        """A batch was fetched between t0 and t1 (on options.clock) by a loop gpuscope does not
        drive itself (a Trainer); `cpu_ns`: the fetching thread's CPU time meanwhile (-1: not
        measured)."""
        if not self._active:
            return
        self._log.fetched(t0, t1, (t1 - t0) if cpu_ns is None else cpu_ns)
        if self._dev is not None:
            self._dev.batch_ready()
        if batch is not None:
            self.note_batch(batch)

    def note_batch(self, batch) -> None:
        """Learn the batch size and bytes from a batch (the first one seen); later batches of
        another size (an epoch's last) are noted on their step."""
        if not self._active:
            return
        if not self._batch_seen:
            self._learn_batch_size(batch)
            return
        try:
            n = batch_size_of(batch)
            if n is not None and n != self._first_batch:
                self._log.samples(n)
        except Exception as exc:
            self._fail("batch", exc)

    def note_knobs(self, knobs: dict) -> None:
        """Settings the suggestions are about that gpuscope cannot see itself (a Trainer's
        per-device batch, accumulation steps, dataloader workers)."""
        if self._active:
            try:
                self._note_knobs({k: v for k, v in knobs.items() if v is not None})
            except Exception as exc:
                self._fail("knobs", exc)

    @contextmanager
    def phase(self, name: str, kind: str | None = None):
        """Time a named part of the step. kind: "compute" (default) or "comm" (blocking)."""
        if not self._active:
            yield self
            return
        log = self._log
        t0 = log.now()
        try:
            yield self
        finally:
            if self._active:
                if kind is None:
                    kind = "comm" if name.lower() in COMM_PHASES else "compute"
                log.phase(name, t0, log.now(), kind == "comm")

    def step(self) -> None:
        """Close the current step and start the next one."""
        if not self._active:
            return
        log = self._log
        now = log.now()
        try:
            opt_ran = log.opt_ran
            taken = log.take(self.steps, now)  # and the next micro-step starts now
            if taken is not None:
                for sink in self._listeners:
                    try:
                        if sink.step_end(self.steps):
                            self._unlisten(sink)
                    except Exception as exc:
                        self._sink_failed(sink, exc)
                # its events only: they are made into rows in batches, off the per-step path
                if not self._raw:
                    since = taken.start if taken.start is not None else now
                    self._flush_at = since + int(self.options.flush_s * 1e9)
                self._raw.append(taken)
                self.steps += 1
                self._micro += 1
                if opt_ran:
                    if self._knobs.get("sync_interval") != self._micro:
                        self._note_knobs({"sync_interval": self._micro})
                    self._micro = 0
                if len(self._raw) >= self.options.flush_rows or now >= self._flush_at:
                    self._flush_rows_now()
                if self._live is not None and self.steps % self.options.live_every == 0:
                    self._live_exchange()
        except Exception as exc:
            self._fail("step", exc)
        if self.steps == self._stop_after:
            self._end_trial()

    def _end_trial(self) -> None:
        """$GPUSCOPE_STOP_AFTER micro-steps recorded (a `gpuscope try` trial): the recording is
        closed, then the program ends here with exit status 0 (TrialEnd), every rank after the
        same micro-step, so that none is left waiting in a collective for another."""
        self.stop()
        raise TrialEnd(0)

    def _flush_rows_now(self) -> None:
        self._note_groups()
        writer = self._writer
        with self._flush_lock:
            built = self._drain()
            if writer is not None:
                if writer.error is not None:  # the disk is full, the file vanished...
                    self._write_failed(writer.error)
                    return
                writer.add_rows(built.rows, wake=False)  # the sinks' lines follow: one wake-up
        try:
            self._flush_sinks(built, wake=False)
        finally:
            if writer is not None:
                writer.wake()

    def _drain(self):
        """The rows of the micro-steps not flushed yet (rows.Built), taken out (called holding
        _flush_lock): as many as were there when it began, from the left, so a micro-step the
        training thread appends meanwhile stays for the next flush."""
        raw = self._raw
        pending = [raw.popleft() for _ in range(len(raw))]
        built = build(pending, self._t0_unix - self._t0_perf)  # start: _unix(start)
        self._note_forwards(built.forwards)
        return built

    def _write_failed(self, error: str) -> None:
        """The record file cannot be written any more: stop recording, say so once, and leave
        training alone (the rows already on disk still analyse; the reader reports the cut)."""
        warn_once("recorder-write", "gpuscope: recording stopped after step %d: %s; training "
                  "goes on", self.steps, error)
        self.warnings.append(f"recording stopped after step {self.steps}: {error}")
        self._teardown(None)

    # ----------------------------------------------------------------- stalls
    def _watch_fatal(self) -> None:
        """A fatal signal's stacks into a file beside the record (fatal.py)."""
        try:
            from .fatal import watch_fatal

            close = watch_fatal(self.path)
        except Exception:
            return
        if close is not None:
            self._add_sink(Closing("fatal-signal trace", close))

    def _start_stall_watch(self, p) -> None:
        """The stall watcher (stall.py): a thread that reads, never waits on, this recorder."""
        from .stall import StallWatch, wrapper_codes
        from .watched import Watched

        exchange = None
        if p.world_size > 1:  # rank 0 logs the hang as it happens (nothing runs per step)
            from .stall_exchange import Exchange

            exchange = Exchange(p.rank, p.world_size, log=self.options.live_log and p.rank == 0)
        watch = StallWatch(Watched(self), self.options.stall_s, self.options.flush_s,
                           wrapper_codes(Recorder.time_fetches.__code__), exchange)
        watch.start()

        def close():
            watch.stop()
            if watch.error:
                self.warnings.append(watch.error)

        self._add_sink(Closing("stall watcher", close))

    def _without_torch(self) -> None:
        """An install without torch (gpuscope reads runs without it): the loop's own timings
        are all it can record; said once, on the record too."""
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            why = ("gpuscope.record needs torch for collectives, memory and device times "
                   "(pip install torch): without it only the loop's own timings are recorded")
            self.warnings.append(why)
            warn_once("recorder-no-torch", "gpuscope: %s", why)

    # ----------------------------------------------------------------- live diagnosis
    def _start_live(self, p) -> None:
        """The live exchange (live.py); its group is made now when torch.distributed is up."""
        from .live import Live

        o = self.options
        live = Live(o.live_every, o.on_diagnosis, rank=p.rank, world_size=p.world_size,
                    knobs=self._knobs, timeout_s=o.live_timeout_s, log=o.live_log and p.rank == 0,
                    run_dir=self.run_dir)
        self._add_sink(LiveDiagnosis(live))
        self.live_summaries = live.summaries
        try:
            dist = sys.modules.get("torch.distributed")
            if p.world_size > 1 and dist is not None and dist.is_initialized():
                live.start_group()
        except Exception as exc:
            self._live_failed(exc)

    def _live_exchange(self) -> None:
        """Every live_every steps, on every rank: flush, then start the exchange (no waiting)."""
        try:
            if self._raw:
                self._flush_rows_now()
            if self._live is not None:
                self._live.launch()
        except Exception as exc:
            self._live_failed(exc)

    def _live_failed(self, exc: Exception) -> None:
        """Live diagnosis stops; recording goes on."""
        for sink in self._sinks:
            if isinstance(sink, LiveDiagnosis):
                self._sink_failed(sink, exc)
                return

    # ----------------------------------------------------------------- internals
    def _unix(self, perf_ns: int) -> int:
        return self._t0_unix + (perf_ns - self._t0_perf)

    def _learn_batch_size(self, item) -> None:
        """The first batch's size (unless a knob gave it) and bytes."""
        self._batch_seen = True
        try:
            self._first_batch = batch_size_of(item)
            self._note_knobs(batch_knobs(item, self._knobs.get("batch_size") is None))
        except Exception as exc:
            self._fail("batch", exc)

    def _note_forwards(self, counts: list) -> None:
        """Forward calls per step when more than one (a pipeline stage's micro-batches)."""
        n = max(set(counts), key=counts.count) if counts else 0
        if n >= 1 and n != self._knobs.get("forwards_per_step", 1):
            self._note_knobs({"forwards_per_step": n})

    def _note_groups(self) -> None:
        """The process groups the timed collectives went through, with their ranks (the
        layout of a hybrid run), and the mesh dimension each stands for, noted once they
        change; off the per-step path."""
        timer = self._hooks.collectives if self._hooks is not None else None
        if timer is None:  # no collective timed: no groups to note
            return
        from . import collectives as mod

        if not self._mesh_checked and self.model is not None:
            # once, at the first flush: a model's DTensor parameters are made before it trains
            # (walking up to 4,096 parameters every flush cost a large plain model ~1 ms each)
            self._mesh_checked = True
            from .knobs import mesh_dims

            dims = mesh_dims(self.model, mod.group_name)
            if dims:
                self._note_knobs({"mesh_dims": dims})
        groups = mod.members()
        if groups and groups != self._knobs.get("process_groups"):
            self._note_knobs({"process_groups": groups})

    def _note_knobs(self, knobs: dict) -> None:
        # a value once known is not taken back by a later None (a loader that batches in its
        # sampler has no batch_size of its own: the batches told it)
        knobs = {k: v for k, v in knobs.items()
                 if self._knobs.get(k) != v and not (v is None and self._knobs.get(k) is not None)}
        if not knobs:
            return
        self._knobs.update(knobs)
        if self._writer is not None and self._active:
            self._writer.add_meta({"knobs": knobs, "at_step": self.steps})

    def _fail(self, where: str, exc: Exception) -> None:
        """Log once, stop recording and tear down; the training loop goes on."""
        warn_once(f"recorder-{where}", "gpuscope: recording stopped after an internal error in "
                  "%s: %r", where, exc, exc_info=True)
        self.warnings.append(f"internal error in {where}: {exc!r}")
        self._teardown({"steps": self.steps, "crashed": False,
                        "recorder_error": f"{where}: {exc!r}", "warnings": self.warnings})


def record(run_dir, model=None, options: RecordOptions | None = None, **kw) -> Recorder:
    """Record per-rank step timings into `run_dir`::

        with gpuscope.record("runs/exp1", model=ddp_model) as rec:
            for batch in rec.data(loader):
                ...
                rec.step()

    or ``rec = gpuscope.record(...); rec.start(); ...; rec.stop()`` around a top-level loop.
    Options are RecordOptions' fields, as keywords (``tensorboard=True``) or one RecordOptions
    (they follow).
    """
    return Recorder(run_dir, model, options, **kw)


record.__doc__ += "\n" + options_help()


__all__ = ["Recorder", "RecordOptions", "record"]
