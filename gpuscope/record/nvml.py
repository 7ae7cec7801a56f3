"""NVML telemetry: a background thread that reads (never sets) one GPU's state at 1-10 Hz.

Per sample (run_format.NVML_FIELDS): utilization %, memory used / total, power, SM clock,
temperature, throttle reasons, and the device's total energy counter (mJ since the driver
loaded; None on GPUs before Volta).
The device is the one this rank uses: matched by PCI bus id when torch can tell it, else through
CUDA_VISIBLE_DEVICES (index or UUID), else the local rank. Without a driver the sampler switches
itself off with one info line. Everything NVML goes through `NvmlApi`, the seam tests replace.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from .._log import info_once, warn_once

class NvmlUnavailable(Exception):
    """No usable NVML here (no driver, no library, no such device)."""


class NvmlApi:
    """The few read-only NVML calls gpuscope makes (module `pynvml`, package nvidia-ml-py)."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("package nvidia-ml-py is not installed") from exc
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML unavailable ({exc})") from None

    def device_count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def handle(self, index: int | None = None, pci_bus_id: str | None = None,
               uuid: str | None = None):
        if pci_bus_id:
            return self.nv.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        if uuid:
            return self.nv.nvmlDeviceGetHandleByUUID(uuid)
        return self.nv.nvmlDeviceGetHandleByIndex(index or 0)

    def sample(self, h) -> tuple:
        """One sample's readings, in the order of run_format.NVML_FIELDS after its time (which
        the Sampler stamps, on the recorder's clock)."""
        nv = self.nv
        util = nv.nvmlDeviceGetUtilizationRates(h).gpu
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        clock = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        try:
            throttle = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        except Exception:
            throttle = int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        try:
            energy = int(nv.nvmlDeviceGetTotalEnergyConsumption(h))
        except Exception:  # not supported on this device
            energy = None
        return (int(util), int(mem.used), int(mem.total), round(power, 1), int(clock), int(temp),
                throttle, energy)

    def describe(self, h) -> dict:
        nv = self.nv
        name = nv.nvmlDeviceGetName(h)
        return {"name": name.decode() if isinstance(name, bytes) else str(name),
                "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(h).busId),
                "uuid": _text(nv.nvmlDeviceGetUUID(h))}

    def driver_version(self) -> str:
        return _text(self.nv.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> int:
        return int(self.nv.nvmlSystemGetCudaDriverVersion())

    def shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def device_selector(local_rank: int) -> dict:
    """How to find this rank's GPU in NVML: PCI bus id, UUID, or physical index."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                if hasattr(props, "pci_bus_id"):
                    return {"pci_bus_id": f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:"
                                          f"{props.pci_device_id:02X}.0"}
        except Exception:
            pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and local_rank < len(visible):
        entry = visible[local_rank]
        if entry.isdigit():
            return {"index": int(entry)}
        return {"uuid": entry}
    return {"index": local_rank}


#: what Sampler uses to reach NVML; tests put a fake here (this machine has no NVIDIA driver)
api_factory = NvmlApi


class Sampler:
    """Samples one GPU every 1/hz seconds of `clock` on a daemon thread; `drain()` hands the
    samples over.

    `clock` is the recorder's (integer ns); the thread waits for each sample's time on it: on
    the real clock through its stop event, on a clock that keeps its own time (a test's
    simulated one) through the clock's `wait(due_ns, stop_event)`, which returns True once
    stopped (such a clock's `join(stop_event)` counts the thread in before it starts). `now`
    maps a time of that clock to unix ns (as the rows' times are); None: unix time read after
    each sample."""

    def __init__(self, local_rank: int = 0, hz: float = 5.0, api_factory=None, now=None,
                 clock=None):
        self.hz = min(10.0, max(1.0, hz))
        self.clock = clock
        self.now = now
        self.samples: list[tuple] = []
        self.device: dict = {}
        self.active = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.api = (api_factory or globals()["api_factory"])()
            sel = device_selector(local_rank)
            self.handle = self.api.handle(**sel)
            self.device = {**self.api.describe(self.handle), "selected_by": next(iter(sel))}
            self.active = True
        except NvmlUnavailable as exc:  # no driver: the same on every rank of a host, said
            self.reason = str(exc)         # by its first (the record header says it on each)
            if local_rank == 0:
                info_once("nvml-off", "gpuscope: GPU telemetry off: %s", exc)
        except Exception as exc:  # an NVML error on this device: telemetry off, training on
            self.reason = f"NVML device lookup failed ({exc})"
            info_once("nvml-off", "gpuscope: GPU telemetry off: %s", self.reason)

    def start(self) -> "Sampler":
        if self.active:
            join = getattr(self.clock, "join", None)
            if join is not None:
                join(self._stop)
            self._thread = threading.Thread(target=self._run, name="gpuscope-nvml", daemon=True)
            self._thread.start()
        return self

    def _wait(self, due: int | None, period: float) -> bool:
        """Until `due` on the clock (or `period` seconds where there is none); True: stopped."""
        if due is None:
            return self._stop.wait(period)
        wait = getattr(self.clock, "wait", None)
        if wait is not None:
            return wait(due, self._stop)
        return self._stop.wait(max(0.0, (due - self.clock()) / 1e9))

    def _run(self) -> None:
        period = 1.0 / self.hz
        step = int(period * 1e9)
        due = self.clock() + step if self.clock is not None else None
        while not self._wait(due, period):
            try:
                readings = self.api.sample(self.handle)
                t = self.now() if self.now is not None else time.time_ns()
                self.samples.append((t, *readings))
            except Exception as exc:
                warn_once("nvml-sample", "gpuscope: NVML sampling stopped: %r", exc)
                self.active = False
                return
            if due is not None:  # the next on the grid; one missed (a slow read) is skipped
                due += step
                late = self.clock() - due
                if late > 0:
                    due += (late // step + 1) * step

    def drain(self) -> list[tuple]:
        out, self.samples = self.samples, []
        return out

    def stop(self) -> None:
        """Stop sampling and release NVML; safe to call more than once."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2.0)
        api = self.__dict__.pop("api", None)
        if api is not None:
            api.shutdown()
        self.active = False
