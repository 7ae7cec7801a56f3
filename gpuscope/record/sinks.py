"""The recorder's side channels, as sinks of one shape with one lifecycle.

A sink is handed every flush's rows (`rows`, a rows.Built), gives what it measured meanwhile to
be written beside them (`meta`), and is closed once (`close`). A sink that `listens` is called
at the end of every micro-step (`step_end`; a true answer: no more calls). The recorder keeps its
sinks in one list (opened at start, in order): one loop flushes them, one calls the listeners in
step(), one closes them (last opened first) before the end record is written, and teardown
closes whatever an error path left open. A sink that raises is switched off alone (`abandon`):
warned once, named in the end record's warnings, and the recording and the other sinks go on.
The record file and the hooks are not sinks: the hooks make the events, the file takes them.

The channels' own modules (cuda_timing, nvml, dataparallel, live, tb_scalars) are imported by
whoever opens them, not here: this module stays import-free.
"""

from __future__ import annotations

from .._log import warn_once


class Sink:
    """One side channel. Subclasses override what they take part in."""

    name = "side channel"  # in the warning when closing it fails
    off = "side channel off"  # the warning's words when it fails: "<off>: <error>"
    listens = False  # step_end is called at the end of each micro-step

    def step_end(self, step: int) -> bool | None:
        """Micro-step `step` closed (listeners only); True: no more calls."""

    def rows(self, built) -> None:
        """The flush's rows just summed (rows.Built: `.rows` in STEP_COLUMNS order)."""

    def meta(self, final: bool) -> dict | None:
        """What to write beside the rows now (None: nothing); `final` at stop()."""
        return None

    def side(self, meta: dict) -> None:
        """What another sink measured this flush (its meta), for a sink that shows it too."""

    def at_error(self) -> dict | None:
        """Training raised: what this sink holds that the end record should keep (memory)."""
        return None

    def close(self) -> None:
        """Once, at stop() or teardown; may raise (the recorder warns and goes on)."""

    def abandon(self, exc: Exception) -> None:
        """It raised: say so once and close without waiting; never raises."""
        warn_once(f"sink-{self.name}", "gpuscope: %s: %r; recording goes on", self.off, exc)
        try:
            self.close()
        except Exception:
            pass


class RoutingSink(Sink):
    """The rows each all_to_all_single delivered to this rank, per micro-step, in issue order
    (an expert layer's dispatch: the tokens this rank's experts got; the analysis compares the
    ranks instance by instance, analyze/routing.py)."""

    name, off = "all-to-all rows", "all-to-all rows off"

    def __init__(self):
        self._steps: list = []
        self._rows: list = []

    def rows(self, built) -> None:
        for step, rows in built.routed:
            self._steps.append(step)
            self._rows.append(rows)

    def meta(self, final: bool) -> dict | None:
        if not self._steps:
            return None
        out = {"routing": {"steps": self._steps, "rows": self._rows}}
        self._steps, self._rows = [], []
        return out


class ModuleTimes(Sink):
    """The chosen modules' forward time per micro-step (modules.ModuleTimer)."""

    name, off, listens = "module timer", "module timing off", True

    def __init__(self, timer):
        self.timer = timer

    def step_end(self, step: int) -> None:
        self.timer.step_end(step)

    def meta(self, final: bool) -> dict | None:
        return self.timer.meta(final)

    def close(self) -> None:
        self.timer.remove()


class DeviceTimes(Sink):
    """CUDA event times of the finished steps (cuda_timing.DeviceTimer)."""

    name, off, listens = "device timer", "device timing off", True

    def __init__(self, timer):
        self.timer = timer

    def step_end(self, step: int) -> None:
        self.timer.step_end(step)

    def meta(self, final: bool) -> dict | None:
        rows = self.timer.resolve(wait=final)
        return {"device": rows} if rows else None


class Telemetry(Sink):
    """NVML samples taken on the sampler's thread (nvml.Sampler)."""

    name, off = "NVML sampler", "NVML telemetry off"

    def __init__(self, sampler):
        self.sampler = sampler

    def meta(self, final: bool) -> dict | None:
        samples = self.sampler.drain()
        return {"nvml": samples} if samples else None

    def close(self) -> None:
        self.sampler.stop()


class DataParallelTimes(Sink):
    """nn.DataParallel's replicas timed on their devices (dataparallel.DataParallelTimer)."""

    name, off, listens = "DataParallel timer", "DataParallel timing off", True

    def __init__(self, timer):
        self.timer = timer

    def step_end(self, step: int) -> None:
        self.timer.step_end()

    def meta(self, final: bool) -> dict | None:
        return {"dataparallel": self.timer.summary()}

    def close(self) -> None:
        self.timer.remove()


class TensorBoardScalars(Sink):
    """Per-step scalars for TensorBoard, written on a background thread (tb_scalars), which is
    started at the first flush: importing TensorBoard stays out of record()'s start."""

    name, off = "TensorBoard writer", "TensorBoard scalars disabled"

    def __init__(self, run_dir: str, file_name: str):
        self.run_dir, self.file_name = run_dir, file_name
        self.writer = None

    def rows(self, built) -> None:
        if self.writer is None:
            from .tb_scalars import BackgroundScalars

            self.writer = BackgroundScalars(self.run_dir, self.file_name)
        self.writer.write(built.rows)
        if self.writer.error is not None:
            raise self.writer.error

    def side(self, meta: dict) -> None:
        if "memory" in meta and self.writer is not None:
            self.writer.write(("memory", meta["memory"]))

    def close(self, timeout: float = 10.0) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close(timeout=timeout)
            if writer.error is not None:
                raise writer.error

    def abandon(self, exc: Exception) -> None:
        warn_once("tensorboard", "gpuscope: %s: %r", self.off, exc)
        try:
            self.close(timeout=1.0)
        except Exception:
            pass


class LiveDiagnosis(Sink):
    """The live exchange between ranks (live.Live): rows feed its window; the recorder starts
    each exchange itself, every live_every steps."""

    name, off = "live diagnosis", "live diagnosis stopped"

    def __init__(self, live):
        self.live = live

    def rows(self, built) -> None:
        self.live.feed(built.rows)
        self.live.poll()

    def close(self) -> None:
        self.live.close()  # drops an exchange in flight: nothing waits at exit

    def abandon(self, exc: Exception) -> None:
        self.live._stop(repr(exc)[:300])  # warns once itself


class FlopCounting(Sink):
    """Counts micro-step `counter.at`'s FLOPs once (flops.FlopCount): starts as the step before
    it closes, stops as it closes, and tells `note` the count as knobs; then listens no more."""

    name, off, listens = "FLOP counter", "FLOPs not counted", True

    def __init__(self, counter, note):
        self.counter, self.note = counter, note

    def step_end(self, step: int) -> bool:
        counter = self.counter
        if counter.counting:
            n = counter.stop()
            if n:  # the step it slowed is left out of the analysis (prepare.py)
                self.note({"flops_per_step": n, "flops_counted_step": counter.at,
                           "flops_source": f"FlopCounterMode, micro-step {counter.at}",
                           **({"flops_by_dtype": counter.by_dtype} if counter.by_dtype else {})})
            return True
        if step + 1 == counter.at:
            counter.start()
        return step + 1 > counter.at  # past it without counting: done

    def close(self) -> None:
        self.counter.stop()


class Closing(Sink):
    """A channel whose only part in the recording is being closed with it (the precision probe,
    the stall watcher): `close` is called once."""

    def __init__(self, name: str, close):
        self.name, self.off, self._close = name, f"{name} off", close

    def close(self) -> None:
        self._close()
