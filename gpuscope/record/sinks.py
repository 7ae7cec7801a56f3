"""The recorder's side channels, as sinks of one shape with one lifecycle.

A sink is handed the step rows of every flush (`rows`), gives what it measured meanwhile to be
written beside them (`meta`), and is closed once (`close`). The recorder keeps its sinks in one
list (opened at start, in order): one loop flushes them, one loop closes them (last opened
first) before the end record is written, and teardown closes whatever an error path left open.
A sink that raises is switched off alone (`abandon`): warned once, named in the end record's
warnings, and the recording and the other sinks go on. The record file itself is not a sink:
the sinks' output goes into it.

`attr` names the recorder attribute through which the step path calls the channel directly
(a CUDA event per step, say); the recorder clears it when the sink goes, so the step path stops
calling it. The channels' own modules (cuda_timing, nvml, dataparallel, live, tb_scalars) are
imported by whoever opens them, not here: this module stays import-free.
"""

from __future__ import annotations

from .._log import warn_once


class Sink:
    """One side channel. Subclasses override what they take part in."""

    name = "side channel"  # in the warning when closing it fails
    off = "side channel off"  # the warning's words when it fails: "<off>: <error>"
    attr: str | None = None  # the Recorder attribute the step path calls, cleared when it goes

    def rows(self, rows: list) -> None:
        """The step rows just summed (STEP_COLUMNS order)."""

    def meta(self, final: bool) -> dict | None:
        """What to write beside the rows now (None: nothing); `final` at stop()."""
        return None

    def side(self, meta: dict) -> None:
        """What another sink measured this flush (its meta), for a sink that shows it too."""

    def close(self) -> None:
        """Once, at stop() or teardown; may raise (the recorder warns and goes on)."""

    def abandon(self, exc: Exception) -> None:
        """It raised: say so once and close without waiting; never raises."""
        warn_once(f"sink-{self.name}", "gpuscope: %s: %r; recording goes on", self.off, exc)
        try:
            self.close()
        except Exception:
            pass


class Routing(Sink):
    """The rows each all_to_all_single delivered to this rank, per micro-step, in issue order
    (an expert layer's dispatch: the tokens this rank's experts got; the analysis compares the
    ranks instance by instance, analyze/routing.py)."""

    name, off, attr = "all-to-all rows", "all-to-all rows off", "_routing"

    def __init__(self):
        self._steps: list = []
        self._rows: list = []

    def step_end(self, step: int, rows: list) -> None:
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

    name, off, attr = "module timer", "module timing off", "_modules"

    def __init__(self, timer):
        self.timer = timer

    def meta(self, final: bool) -> dict | None:
        return self.timer.meta(final)

    def close(self) -> None:
        self.timer.remove()


class DeviceTimes(Sink):
    """CUDA event times of the finished steps (cuda_timing.DeviceTimer)."""

    name, off, attr = "device timer", "device timing off", "_dev"

    def __init__(self, timer):
        self.timer = timer

    def meta(self, final: bool) -> dict | None:
        rows = self.timer.resolve(wait=final)
        return {"device": rows} if rows else None


class Telemetry(Sink):
    """NVML samples taken on the sampler's thread (nvml.Sampler)."""

    name, off, attr = "NVML sampler", "NVML telemetry off", "_sampler"

    def __init__(self, sampler):
        self.sampler = sampler

    def meta(self, final: bool) -> dict | None:
        samples = self.sampler.drain()
        return {"nvml": samples} if samples else None

    def close(self) -> None:
        self.sampler.stop()


class DataParallelTimes(Sink):
    """nn.DataParallel's replicas timed on their devices (dataparallel.DataParallelTimer)."""

    name, off, attr = "DataParallel timer", "DataParallel timing off", "_dp"

    def __init__(self, timer):
        self.timer = timer

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

    def rows(self, rows: list) -> None:
        if self.writer is None:
            from .tb_scalars import BackgroundScalars

            self.writer = BackgroundScalars(self.run_dir, self.file_name)
        self.writer.write(rows)
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

    name, off, attr = "live diagnosis", "live diagnosis stopped", "_live"

    def __init__(self, live):
        self.live = live

    def rows(self, rows: list) -> None:
        self.live.feed(rows)
        self.live.poll()

    def close(self) -> None:
        self.live.close()  # drops an exchange in flight: nothing waits at exit

    def abandon(self, exc: Exception) -> None:
        self.live._stop(repr(exc)[:300])  # warns once itself
