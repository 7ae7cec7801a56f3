"""Device-side step timing with CUDA events, resolved in batches: no synchronization per step.

Per step, events are recorded on the training's stream (the current one at the first event) at
these points:
  fetch  - as the host asks for the batch (entering next())
  ready  - right after the batch arrived
  end    - at rec.step() (after the optimizer's kernels are queued)
and, for DDP (ddp_timing.py), at the end of backward compute and after backward returned (DDP's
finalize has made the stream wait for the all-reduce by then). On the GPU's own timeline:
  gpu_step_ns        = end[k] - end[k-1]
  gpu_data_stall_ns  = ready[k] - fetch[k]  (the GPU sat idle while the host was in next(): the
                                             `fetch` event completes once the work queued before
                                             it has, `ready` once the batch is there; ~0 when
                                             kernels were still queued when the batch came)
  gpu_idle_before_data_ns = fetch[k] - end[k-1] when the fetch opened the step (nothing of it
                                             queued before: the GPU idled while the host worked
                                             elsewhere: logging, checkpoints); 0 for a loop that
                                             fetches its next batch mid-step, after the forward
  gpu_comm_ns        = sum over those pairs of (done - launch): the exposed tail
Events come from a pool and are read only once `query()` says they completed (every N steps),
or at close, where one synchronize is allowed. All CUDA calls go through `CudaBackend`, the
seam tests replace with a fake clock.
"""

from __future__ import annotations

from collections import deque

from ..vocab import MS


class CudaBackend:
    """torch.cuda events on the stream the training runs on, looked up once, at the first event
    (inside the loop: after it has picked its device; a recording may start before
    `torch.cuda.set_device`): `Event.record()` without a stream looks the current one up and
    builds a Stream object for it every time (the largest part of the recorder's cost per step
    on an H200, five events a step). `cuda`: torch.cuda, or what tests count the calls of (the
    seam's own fake)."""

    def __init__(self, cuda=None):
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.cuda = cuda
        self.stream = None

    def new_event(self):
        return self.cuda.Event(enable_timing=True)

    def record(self, event) -> None:
        stream = self.stream
        if stream is None:
            stream = self.stream = self.cuda.current_stream()
        event.record(stream)

    def done(self, event) -> bool:
        return bool(event.query())

    def elapsed_ns(self, start, end) -> int:
        return int(start.elapsed_time(end) * MS)  # elapsed_time is in ms

    def synchronize(self) -> None:
        self.cuda.synchronize()


#: what DeviceTimer uses to reach CUDA; tests put a fake clock here (no GPU on CI machines)
backend_factory = CudaBackend


class DeviceTimer:
    """Records per-step events from a pool and resolves finished steps into device times."""

    def __init__(self, backend=None, pool_size: int = 64):
        """`pool_size`: events made at once, as recording starts: as many as the steps between
        two resolves hold (five a step), so that none is made while training."""
        self.backend = backend or CudaBackend()
        self._pool: list = [self.backend.new_event() for _ in range(pool_size)]
        self._pending: deque = deque()  # (step, ready, end, [(launch, done), ...])
        self._ready = None
        self._comm: list = []
        self._last_end = None
        self._fetch = None
        self._opens = True

    def _event(self):
        ev = self._pool.pop() if self._pool else self.backend.new_event()
        self.backend.record(ev)
        return ev

    def fetch_start(self, opens_step: bool) -> None:
        """The host asks for a batch; `opens_step`: nothing of the step was queued before."""
        if self._ready is None and self._fetch is None:
            self._fetch = self._event()
            self._opens = opens_step

    def batch_ready(self) -> None:
        if self._ready is None:
            self._ready = self._event()

    def comm_launch(self):
        return self._event()

    def comm_done(self, launch_event) -> None:
        self._comm.append((launch_event, self._event()))

    def step_end(self, step: int) -> None:
        end = self._event()
        fetch = self._fetch
        if fetch is not None and self._ready is None:  # asked, never came: the event goes back
            self._pool.append(fetch)
            fetch = None
        self._pending.append((step, self._last_end, fetch, self._opens, self._ready, end,
                              self._comm))
        self._last_end, self._ready, self._comm, self._fetch = end, None, [], None

    def resolve(self, wait: bool = False) -> list[dict]:
        """Device times of the steps whose events have completed (all of them if `wait`)."""
        if wait and self._pending:
            self.backend.synchronize()
        out = []
        b = self.backend
        while self._pending:
            step, prev_end, fetch, opens, ready, end, comm = self._pending[0]
            if not b.done(end):
                break
            self._pending.popleft()
            spans = [b.elapsed_ns(a, d) for a, d in comm]
            row = {"step": step, "gpu_comm_ns": sum(spans)}
            if comm:  # the last bucket to finish cannot overlap backward: the exposed tail
                row["gpu_comm_exposed_ns"] = spans[-1]
            if prev_end is not None:
                row["gpu_step_ns"] = b.elapsed_ns(prev_end, end)
                if fetch is not None:  # (a fetch is kept only with its batch)
                    row["gpu_data_stall_ns"] = max(0, b.elapsed_ns(fetch, ready))
                    row["gpu_idle_before_data_ns"] = (max(0, b.elapsed_ns(prev_end, fetch))
                                                      if opens else 0)
                elif ready is not None:  # a batch noted without its start: the whole gap
                    row["gpu_data_stall_ns"] = max(0, b.elapsed_ns(prev_end, ready))
            out.append(row)
            # the previous step's end event is no longer needed by anyone: back to the pool
            for ev in [e for e in (prev_end, ready, fetch) if e is not None] + \
                    [e for pair in comm for e in pair]:
                self._pool.append(ev)
        return out
