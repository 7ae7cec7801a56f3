"""Device-side step timing with CUDA events, resolved in batches: no synchronization per step.

Per step, events are recorded on the current stream at three points:
  ready  - right after the batch arrived (before the step's first kernel is queued)
  end    - at rec.step() (after the optimizer's kernels are queued)
and, through the comm hook, before each gradient all-reduce is launched and in its completion
callback. On the GPU's own timeline:
  gpu_step_ns        = end[k] - end[k-1]
  gpu_data_stall_ns  = ready[k] - end[k-1]   (the GPU sat idle waiting for this batch; ~0 when
                                              kernels of the previous step were still queued)
  gpu_comm_ns        = sum over buckets of (done - launch)
Events come from a pool and are read only once `query()` says they completed (every N steps),
or at close, where one synchronize is allowed. All CUDA calls go through `CudaBackend`, the
seam tests replace with a fake clock.
"""

from __future__ import annotations

from collections import deque

from ..vocab import MS


class CudaBackend:
    """torch.cuda events on the current stream."""

    def __init__(self):
        import torch

        self.torch = torch

    def new_event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, event) -> None:
        event.record()

    def done(self, event) -> bool:
        return bool(event.query())

    def elapsed_ns(self, start, end) -> int:
        return int(start.elapsed_time(end) * MS)  # elapsed_time is in ms

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


#: what DeviceTimer uses to reach CUDA; tests put a fake clock here (no GPU on CI machines)
backend_factory = CudaBackend


class DeviceTimer:
    """Records per-step events from a pool and resolves finished steps into device times."""

    def __init__(self, backend=None, pool_size: int = 512):
        self.backend = backend or CudaBackend()
        self._pool: list = [self.backend.new_event() for _ in range(min(pool_size, 64))]
        self._pending: deque = deque()  # (step, ready, end, [(launch, done), ...])
        self._ready = None
        self._comm: list = []
        self._last_end = None

    def _event(self):
        ev = self._pool.pop() if self._pool else self.backend.new_event()
        self.backend.record(ev)
        return ev

    def batch_ready(self) -> None:
        if self._ready is None:
            self._ready = self._event()

    def comm_launch(self):
        return self._event()

    def comm_done(self, launch_event) -> None:
        self._comm.append((launch_event, self._event()))

    def step_end(self, step: int) -> None:
        end = self._event()
        self._pending.append((step, self._last_end, self._ready, end, self._comm))
        self._last_end, self._ready, self._comm = end, None, []

    def resolve(self, wait: bool = False) -> list[dict]:
        """Device times of the steps whose events have completed (all of them if `wait`)."""
        if wait and self._pending:
            self.backend.synchronize()
        out = []
        b = self.backend
        while self._pending:
            step, prev_end, ready, end, comm = self._pending[0]
            if not b.done(end):
                break
            self._pending.popleft()
            row = {"step": step, "gpu_comm_ns": sum(b.elapsed_ns(a, d) for a, d in comm)}
            if comm:  # the last bucket to finish cannot overlap backward: the exposed tail
                row["gpu_comm_exposed_ns"] = b.elapsed_ns(*comm[-1])
            if prev_end is not None:
                row["gpu_step_ns"] = b.elapsed_ns(prev_end, end)
                if ready is not None:
                    row["gpu_data_stall_ns"] = max(0, b.elapsed_ns(prev_end, ready))
            out.append(row)
            # the previous step's end event is no longer needed by anyone: back to the pool
            for ev in ([prev_end] if prev_end is not None else []) + ([ready] if ready else []) + \
                    [e for pair in comm for e in pair]:
                self._pool.append(ev)
        return out
