"""Times nn.DataParallel per device: what each GPU computes and what device 0 does besides.

DataParallel runs in one process: every step it scatters the batch from device 0, replicates
the model onto every device, runs the replicas on one thread per device, and gathers the
outputs back on device 0, where the loss, the gradients' reduction and the optimizer run too.
The replicas share the wrapped module's hooks, so a forward pre/post hook on it fires once per
device, on that device's thread with that device current: events recorded there time each
device's forward on its own stream. The scatter, replicate and gather are DataParallel's own
methods: wrapped on the instance while recording, timed on the host (they block until their
copies are queued). Peak allocator memory per device shows device 0 holding more.

Events are resolved once they completed (no synchronization in the step); `summary()` gives the
totals, written beside the step rows. All CUDA calls go through a backend; tests put a fake one
in (no GPU here), as for cuda_timing.
"""

from __future__ import annotations

import threading



class CudaDevices:
    """CUDA events on the current device's current stream, allocator peaks per device."""

    def __init__(self):
        import torch

        self.torch = torch

    def device(self) -> int:
        return int(self.torch.cuda.current_device())

    def mark(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def done(self, ev) -> bool:
        return bool(ev.query())

    def elapsed_ns(self, a, b) -> int:
        return int(a.elapsed_time(b) * 1_000_000)

    def peak_bytes(self, device: int) -> int:
        return int(self.torch.cuda.max_memory_allocated(device))


#: what DataParallelTimer uses to reach CUDA; tests put a fake here
backend_factory = CudaDevices

_METHODS = ("scatter", "replicate", "gather")


def device_ids(dp) -> list[int]:
    ids = getattr(dp, "device_ids", None) or []
    out = []
    for d in ids:
        idx = getattr(d, "index", d)
        if isinstance(idx, int):
            out.append(idx)
    return out


class DataParallelTimer:
    """Per-device forward times and DataParallel's own scatter / replicate / gather."""

    def __init__(self, dp, backend=None, *, now):
        self.dp = dp
        self.now = now  # the recorder's clock
        self.devices = device_ids(dp)
        self.backend = backend
        self.active = False
        self.reason = ""
        self._handles: list = []
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._pending: list = []            # (device, start, end) events not yet complete
        self.forward_ns: dict = {}          # device -> total ns
        self.forward_n: dict = {}           # device -> forwards timed
        self.host_ns = dict.fromkeys(_METHODS, 0)
        self.steps = 0

    def install(self) -> bool:
        if len(self.devices) < 2:
            self.reason = "DataParallel over fewer than 2 devices: it runs the module directly"
            return False
        try:
            self.backend = self.backend or backend_factory()
            inner = self.dp.module
            self._handles.append(inner.register_forward_pre_hook(self._start))
            self._handles.append(inner.register_forward_hook(self._end))
            for name in _METHODS:
                self._wrap(name)
            self.active = True
        except Exception as exc:  # an unexpected DataParallel: no per-device timing
            self.remove()
            self.reason = f"DataParallel timing off ({exc!r})"
        return self.active

    def _wrap(self, name: str) -> None:
        fn = getattr(self.dp, name)

        now = self.now

        def timed_part(*args, **kwargs):
            t0 = now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.host_ns[name] += now() - t0

        timed_part._gpuscope_original = fn
        setattr(self.dp, name, timed_part)  # an instance attribute: the class stays untouched

    def remove(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()
        for name in _METHODS:
            if getattr(self.dp.__dict__.get(name), "_gpuscope_original", None) is not None:
                del self.dp.__dict__[name]
        self.active = False

    # hooks: on each replica's thread, its device current
    def _start(self, module, args) -> None:
        try:
            self._tls.open = (self.backend.device(), self.backend.mark())
        except Exception:
            self._tls.open = None

    def _end(self, module, args, output) -> None:
        opened = getattr(self._tls, "open", None)
        self._tls.open = None
        if opened is None:
            return
        try:
            end = self.backend.mark()
        except Exception:
            return
        with self._lock:
            self._pending.append((opened[0], opened[1], end))

    def step_end(self) -> None:
        self.steps += 1
        if len(self._pending) >= 64:
            self.resolve()

    def resolve(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        keep = []
        for item in pending:
            device, a, b = item
            try:
                if not self.backend.done(b):
                    keep.append(item)
                    continue
                ns = self.backend.elapsed_ns(a, b)
            except Exception:
                continue
            self.forward_ns[device] = self.forward_ns.get(device, 0) + ns
            self.forward_n[device] = self.forward_n.get(device, 0) + 1
        with self._lock:
            self._pending = keep + self._pending

    def summary(self) -> dict:
        """Totals so far (JSON-ready): devices, steps, forward per device, host ns of scatter /
        replicate / gather, allocator peak per device."""
        self.resolve()
        peaks = {}
        for d in self.devices:
            try:
                peaks[str(d)] = self.backend.peak_bytes(d)
            except Exception:
                pass
        return {"devices": list(self.devices), "steps": self.steps,
                "forward_ns": {str(d): int(v) for d, v in self.forward_ns.items()},
                "forward_n": {str(d): int(v) for d, v in self.forward_n.items()},
                "host_ns": {k: int(v) for k, v in self.host_ns.items()},
                "peak_bytes": peaks}
