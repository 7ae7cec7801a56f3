"""A counting stand-in for torch.cuda (and the allocator calls of torch._C) behind the recorder's
CUDA seams (record/cuda_timing.CudaBackend, record/memory.CudaMemory): the GPU path's calls per
step counted where no GPU is at hand, the way bench_instructions counts the host's work.

Nothing runs on a device: an event "completes" at once, at the next tick of a counter standing
for a device clock (1 us a record); the allocator reports fixed figures. What is counted is what
the recorder asks of CUDA: streams looked up, events made, recorded, queried and read,
synchronizations, allocator statistics read and reset, memory queries. Used by
benchmarks/bench_cuda_calls.py (the gate's figures) and tests/test_cuda_calls.py (the gate).
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from types import SimpleNamespace


class CountingCuda:
    """torch.cuda as far as the recorder uses it; `calls` counts each call by name."""

    def __init__(self, total: int = 80 << 30):
        self.calls: Counter = Counter()
        self.clock = 0
        self.total = total
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                cuda.calls["Event"] += 1
                self.t = None

            def record(self, stream=None):
                cuda.calls["Event.record" if stream is not None else "Event.record(no stream)"] += 1
                if stream is None:  # what torch.cuda.Event.record does without a stream
                    cuda.current_stream()
                cuda.clock += 1_000
                self.t = cuda.clock

            def query(self):
                cuda.calls["Event.query"] += 1
                return True

            def elapsed_time(self, end):
                cuda.calls["Event.elapsed_time"] += 1
                return (end.t - self.t) / 1e6  # ms

        self.Event = Event

    def current_stream(self, device=None):
        self.calls["current_stream"] += 1
        return SimpleNamespace(stream_id=0)

    def synchronize(self, device=None):
        self.calls["synchronize"] += 1

    def current_device(self):
        return 0

    def mem_get_info(self, device=None):
        self.calls["mem_get_info"] += 1
        return (self.total // 2, self.total)

    def memory_reserved(self, device=None):
        self.calls["memory_reserved"] += 1
        return 1 << 30

    def get_per_process_memory_fraction(self, device=None):
        self.calls["get_per_process_memory_fraction"] += 1
        return 1.0

    def memory_stats(self, device=None):
        self.calls["memory_stats"] += 1
        return {"allocated_bytes.all.peak": 1 << 30, "reserved_bytes.all.peak": 2 << 30,
                "num_alloc_retries": 0, "num_ooms": 0}

    def reset_peak_memory_stats(self, device=None):
        self.calls["reset_peak_memory_stats"] += 1

    def max_memory_allocated(self, device=None):
        self.calls["max_memory_allocated"] += 1
        return 1 << 30

    def get_device_name(self, device=None):
        return "Counting GPU"


def counting_torch(cuda: CountingCuda):
    """A module-like object with `.cuda` and the allocator's two calls in `._C`."""
    def memory_stats(device):
        cuda.calls["_cuda_memoryStats"] += 1
        stat = {"current": 1 << 30, "peak": 1 << 30, "allocated": 0, "freed": 0}
        return {"allocated_bytes": {"all": stat}, "reserved_bytes": {"all": stat},
                "num_alloc_retries": 0, "num_ooms": 0}

    def reset(device):
        cuda.calls["_cuda_resetPeakMemoryStats"] += 1

    return SimpleNamespace(cuda=cuda, _C=SimpleNamespace(_cuda_memoryStats=memory_stats,
                                                          _cuda_resetPeakMemoryStats=reset))


@contextmanager
def counting_seams():
    """The counting fake behind both seams while the block runs (the real ones after)."""
    from gpuscope.record import cuda_timing, memory

    cuda = CountingCuda()
    torch_like = counting_torch(cuda)
    pairs = ((cuda_timing, "backend_factory", lambda: cuda_timing.CudaBackend(cuda)),
             (memory, "device_factory", lambda device=None: memory.CudaMemory(0, torch_like)))
    before = [getattr(mod, name) for mod, name, _ in pairs]
    for mod, name, value in pairs:
        setattr(mod, name, value)
    try:
        yield cuda
    finally:
        for (mod, name, _), value in zip(pairs, before):
            setattr(mod, name, value)


def calls_per_step(steps: int = 192, young: int = 64) -> dict:
    """Train a tiny DDP model (gloo, one rank, CPU) `steps` micro-steps recorded with device
    timing on through the counting fake; the CUDA calls per micro-step in the run's young
    steps and after them, by call (the recording's start and close apart)."""
    import os
    import tempfile

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gpuscope

    d = tempfile.mkdtemp()
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
    marks = {}
    try:
        with counting_seams() as cuda:
            torch.manual_seed(0)
            model = DDP(nn.Linear(8, 8))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x = torch.randn(4, 8)
            with gpuscope.record(os.path.join(d, "run"), model=model, device_timing=True,
                                 telemetry=False, flush_rows=64, flush_s=3600) as rec:
                marks["start"] = Counter(cuda.calls)
                for i, b in enumerate(rec.data(x for _ in range(steps))):
                    if i == young:
                        marks["young"] = Counter(cuda.calls)
                    opt.zero_grad()
                    model(b).sum().backward()
                    opt.step()
                    rec.step()
                marks["steady"] = Counter(cuda.calls)
            marks["end"] = Counter(cuda.calls)
    finally:
        if made:
            dist.destroy_process_group()

    def per(a, b, n):
        diff = marks[b] - marks[a]
        return {k: round(v / n, 3) for k, v in sorted(diff.items())}

    return {"steps": steps, "young_steps": young,
            "young_per_step": per("start", "young", young),
            "steady_per_step": per("young", "steady", steps - young),
            "at_start": dict(sorted(marks["start"].items())),
            "at_close": dict(sorted((marks["end"] - marks["steady"]).items()))}
