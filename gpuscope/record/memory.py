"""Memory as the run goes: the process's resident set, and on CUDA the caching allocator's
peaks, retries and out-of-memory errors: after every one of the run's first YOUNG_STEPS steps,
then at every flush (every `flush_rows` steps or `flush_s` seconds: a long run gets thousands of
samples, and the step path pays nothing once the run is past its young steps).

Every step while the run is young (the device's allocator every YOUNG_DEVICE_EVERY-th): a run that
keeps 8 MB more every step is to be named within its first 40 steps, which one sample per flush
(two in a 40-step run) cannot do. Not every step
all run long: reading /proc/self/statm costs ~1.5 us alone, but inside a recording it releases
the GIL to another thread (the writer's, NVML's), and the step then waits to have it back (+5 us
per step measured); `torch.cuda.memory_stats` builds a dict of some hundred entries. At a flush
both are one read for many steps. The device's peaks are reset after each read: each sample
holds the peak over its window. One side record per flush, with the samples since the last::

    {"memory": {"steps": [25, 26, 27], "rss_bytes": [...],
                "device": [[first_step, last_step, peak_allocated, peak_reserved,
                            alloc_retries, ooms], ...]}}

`steps` are the sampled steps (the resident set as each closed); a device window runs from the
step after the previous one to its sample; retries and OOMs are the allocator's running totals.
(Older files hold one device window, not a list of them.) What a machine can hold goes into the record header once
(`memory`): the host's memory and this process's cgroup limit, the device's total.
"""

from __future__ import annotations

import os

from .sinks import Sink

#: the steps at the start of a run sampled one by one (after them: one sample per flush)
YOUNG_STEPS = 64
#: ... the device's allocator in one of this many of them (its statistics are a dict of ~160
#: entries a read, plus a reset; a window of 4 steps keeps its peak): 10 samples in 40 steps,
#: enough to name a leak there (analyze/bottlenecks/memory.py needs 6)
YOUNG_DEVICE_EVERY = 4
#: cgroup limits (v2, then v1) that cap this process's memory below the host's
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


class HostRss:
    """This process's resident set in bytes, read from /proc/self/statm (None elsewhere)."""

    def __init__(self, path: str = "/proc/self/statm"):
        self.fd = os.open(path, os.O_RDONLY)
        self.page = os.sysconf("SC_PAGE_SIZE")

    def __call__(self) -> int:
        return int(os.pread(self.fd, 128, 0).split()[1]) * self.page

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def host_rss() -> HostRss | None:
    try:
        probe = HostRss()
        probe()
        return probe
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def host_capacity(meminfo: str = "/proc/meminfo", limits=CGROUP_LIMITS) -> dict:
    """{"host_total_bytes", "host_limit_bytes" (a cgroup's, when below the host's)}, as known."""
    out: dict = {}
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    out["host_total_bytes"] = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    for path in limits:
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < out.get("host_total_bytes", 1 << 62):
            out["host_limit_bytes"] = int(text)
        break
    return out


class CudaMemory:
    """The caching allocator of one device, through torch.cuda (a seam: tests pass a fake).

    `window()` reads the four figures a sample keeps from the allocator's own nested dict
    (torch._C._cuda_memoryStats, what torch.cuda.memory_stats flattens: that flattening is a
    Python call per entry, ~160 a read, which the run's young steps paid every step); where
    torch lacks it, memory_stats as before."""

    def __init__(self, device=None, torch_module=None):
        if torch_module is None:
            import torch as torch_module
        torch = self.torch = torch_module
        self.device = device if device is not None else torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        self._raw = raw if raw is not None and isinstance(self.device, int) else None
        self._reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)

    def stats(self) -> dict:
        return self.torch.cuda.memory_stats(self.device)

    def window(self) -> tuple[int, int, int, int]:
        """(peak allocated, peak reserved, allocation retries, OOMs) since the last reset."""
        if self._raw is not None:
            try:
                s = self._raw(self.device)
                return (int(s["allocated_bytes"]["all"]["peak"]),
                        int(s["reserved_bytes"]["all"]["peak"]),
                        int(s["num_alloc_retries"]), int(s["num_ooms"]))
            except (KeyError, TypeError, RuntimeError):
                self._raw = None
        return device_window(self.stats())

    def reset_peaks(self) -> None:
        if self._reset is not None and isinstance(self.device, int):
            self._reset(self.device)
        else:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def total_bytes(self) -> int:
        return int(self.torch.cuda.mem_get_info(self.device)[1])

    def limits(self) -> dict:
        """What this process may use of the device, where less than its total: the share a
        per-process memory fraction allows (`device_limit_bytes`), and what was free for it
        as recording started, with what its allocator held then (`device_usable_bytes`: other
        processes' memory, its own CUDA context, are not)."""
        free, total = (int(x) for x in self.torch.cuda.mem_get_info(self.device))
        out = {}
        get_fraction = getattr(self.torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:
            fraction = float(get_fraction(self.device))
            if 0 < fraction < 1:
                out["device_limit_bytes"] = int(total * fraction)
        usable = free + int(self.torch.cuda.memory_reserved(self.device))
        if usable < total:
            out["device_usable_bytes"] = usable
        return out


#: what the recorder opens for a CUDA device (tests without a GPU put a fake here)
device_factory = CudaMemory


def device_window(stats: dict) -> tuple[int, int, int, int]:
    """(peak allocated, peak reserved, allocation retries, OOMs) from a memory_stats dict."""
    get = lambda k: int(stats.get(k, 0) or 0)  # noqa: E731
    return (get("allocated_bytes.all.peak"), get("reserved_bytes.all.peak"),
            get("num_alloc_retries"), get("num_ooms"))


class MemorySink(Sink):
    """The memory sink: `step_end` samples each of the run's young steps, the flushed rows tell
    it the steps since, and `meta()` samples the last of them and hands over what it holds."""

    name, off = "memory probe", "memory sampling off"

    def __init__(self, rss: HostRss | None, device: CudaMemory | None = None,
                 young: int = YOUNG_STEPS):
        self.rss, self.device = rss, device
        self.young = young           # steps still to be sampled one by one
        self.listens = young > 0     # step_end is called while the run is young
        self._sampled = -1           # the last step sampled
        self._dev_sampled = -1       # ... of the device's allocator
        self._young_seen = 0
        self._last = -1              # the last step flushed
        self._steps: list = []       # samples not handed over yet
        self._rss: list = []
        self._dev: list = []

    def step_end(self, step: int) -> bool:
        """Step `step` closed while the run is young: sample it (the device in one of
        YOUNG_DEVICE_EVERY, and the last young step); True once the run is young no more."""
        self.young -= 1
        self._young_seen += 1
        self._sample(step, self._young_seen % YOUNG_DEVICE_EVERY == 0 or self.young <= 0)
        return self.young <= 0

    def _sample(self, step: int, device: bool = True) -> None:
        if self.rss is not None:
            self._steps.append(step)
            self._rss.append(self.rss())
        if self.device is not None and device:
            self._sample_device(step)
        self._sampled = step

    def rows(self, built) -> None:
        if built.rows:
            self._last = max(self._last, built.rows[-1][0])  # STEP_COLUMNS[0]: the step

    def meta(self, final: bool) -> dict | None:
        if self._last > self._sampled:
            self._sample(self._last)
        elif self.device is not None and self._last > self._dev_sampled:
            self._sample_device(self._last)
        out: dict = {}
        if self._steps:
            out = {"steps": self._steps, "rss_bytes": self._rss}
        if self._dev:
            out["device"] = self._dev
        self._steps, self._rss, self._dev = [], [], []
        return {"memory": out} if out else None

    def _sample_device(self, step: int) -> None:
        """The device's window up to `step`, whose resident set was sampled already."""
        window = self.device.window()
        self.device.reset_peaks()
        self._dev.append([min(self._dev_sampled + 1, step), step, *window])
        self._dev_sampled = step

    def at_error(self) -> dict:
        """What memory held when training raised (an out-of-memory error): for the end record."""
        out: dict = {}
        try:
            if self.rss is not None:
                out["rss_bytes"] = self.rss()
            if self.device is not None:
                peak, reserved, retries, ooms = self.device.window()
                out.update(device_peak_allocated_bytes=peak, device_peak_reserved_bytes=reserved,
                           alloc_retries=retries, ooms=ooms)
        except Exception:
            pass
        return out

    def close(self) -> None:
        if self.rss is not None:
            self.rss.close()
