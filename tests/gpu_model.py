"""A model of DDP training on several GPUs, for tests on machines without one.

Each rank has a host clock and one CUDA stream with a device clock of its own (an offset from
the host's, different per rank, as on real GPUs). The host launches a step's kernels and runs
ahead of them; the stream runs them in order, each from the later of its launch and the end of
the kernel before. DDP's gradient all-reduce over NCCL is a kernel on every rank's stream that
ends only once every rank's stream has reached it (NCCL's kernels spin waiting for their peers)
plus the transfer; the host never blocks on it. The loop reads its loss once a step
(`loss.item()`, as logging does), which blocks the host until its stream has run everything
queued before: that is where the host waits.

What is real: gpuscope's DeviceTimer (cuda_timing.py) records and resolves its events through
`ModelCuda`, the CUDA seam, whose events take the device time at which the rank's stream
reaches them; the record files it writes are read by the real reader and analysis. What the
recorder's host side would write is written here (`host_row`), from the same model, in the
record file's own format (run_format.py). What is not modelled: several streams per rank,
kernel launch queues filling up, clocks drifting within a run.
"""

from __future__ import annotations

import json
import os

from gpuscope.record.cuda_timing import DeviceTimer
from gpuscope.run_format import COMM_KEY, SCHEMA, STEP_COLUMNS, rank_file_name

MS = 1_000_000
US = 1_000


class Rank:
    """One rank: its host clock, its stream's device clock (host + `offset`), the calls the
    CUDA seam got."""

    def __init__(self, rank: int, offset: int):
        self.rank = rank
        self.offset = offset
        self.host = 0           # host time, ns
        self.free = 0           # host-clock time at which the stream has run all it was given

    def launch(self, host_ns: int, device_ns: int) -> None:
        """The host spends `host_ns` launching kernels that take `device_ns` on the GPU."""
        self.host += host_ns
        self.free = max(self.free, self.host) + device_ns

    def stream_at(self) -> int:
        """Where an event recorded now lands on the stream (host clock)."""
        return max(self.free, self.host)

    def sync(self) -> int:
        """The host waits for its stream (loss.item()); returns how long."""
        wait = max(0, self.free - self.host)
        self.host += wait
        return wait


class ModelCuda:
    """The CUDA seam (cuda_timing.CudaBackend's methods) over one modelled rank: an event takes
    the device time at which the stream reaches it, completes once the host clock has passed
    that point, and elapsed times are differences of device times. Counts each call."""

    def __init__(self, rank: Rank):
        self.r = rank
        self.calls = {"new_event": 0, "record": 0, "done": 0, "elapsed_ns": 0, "synchronize": 0}

    def new_event(self):
        self.calls["new_event"] += 1
        return {"t": None}

    def record(self, ev) -> None:
        self.calls["record"] += 1
        ev["t"] = self.r.stream_at() + self.r.offset

    def done(self, ev) -> bool:
        self.calls["done"] += 1
        return ev["t"] is not None and ev["t"] <= self.r.host + self.r.offset

    def elapsed_ns(self, a, b) -> int:
        self.calls["elapsed_ns"] += 1
        return b["t"] - a["t"]

    def synchronize(self) -> None:
        self.calls["synchronize"] += 1
        self.r.sync()


def host_row(step, start, step_ns, data, fwd, bwd, opt, comm, other) -> list:
    """A step row as the recorder writes it (STEP_COLUMNS), DDP's tail as the one collective."""
    compute = fwd + bwd + opt
    row = {"step": step, "start_ns": start, "step_ns": step_ns, "data_ns": data,
           "compute_ns": compute, "comm_ns": comm, "comm_exposed_ns": comm,
           "other_ns": step_ns - data - compute - comm, "forward_ns": fwd, "backward_ns": bwd,
           "optimizer_ns": opt, "n_comm": 1, "data_cpu_ns": -1, "synced": 1, "between_ns": 0}
    assert row["other_ns"] >= other >= 0
    return [row[c] for c in STEP_COLUMNS]


def ddp_nccl_run(out: str, *, ranks: int = 2, steps: int = 30, extra_ms: dict | None = None,
                 fwd_ms: float = 1.5, bwd_ms: float = 3.0, opt_ms: float = 0.5,
                 transfer_ms: float = 2.0, data_ms: float = 0.05, gpu: str = "NVIDIA H100 80GB HBM3",
                 backend: str = "nccl") -> dict[int, ModelCuda]:
    """Record files of a DDP run over NCCL, one GPU a rank, into `out`; returns each rank's CUDA
    seam. `extra_ms`: {rank: device ms} of extra kernels a rank queues in its forward (more
    tokens, a slower GPU, a bigger expert): nothing on its host waits for them until loss.item().
    Device work per step: forward `fwd_ms`, backward `bwd_ms`, optimizer `opt_ms`; the host
    launches each in a third of its device time (a GPU-bound step)."""
    extra_ms = extra_ms or {}
    sims = [Rank(r, offset=(r + 1) * 7_777_777_777) for r in range(ranks)]
    seams = {r.rank: ModelCuda(r) for r in sims}
    timers = {r.rank: DeviceTimer(seams[r.rank]) for r in sims}
    rows: dict[int, list] = {r.rank: [] for r in sims}
    t0 = 1_800_000_000 * 10**9
    ms = lambda x: int(round(x * MS))  # noqa: E731
    ends = {r.rank: 0 for r in sims}
    for step in range(steps):
        tail_start, launched = {}, {}
        starts = {}
        for r in sims:
            dev = timers[r.rank]
            starts[r.rank] = ends[r.rank]
            dev.fetch_start(True)
            r.host += ms(data_ms)
            dev.batch_ready()
            r.launch(ms(fwd_ms) // 3, ms(fwd_ms + extra_ms.get(r.rank, 0.0)))
            r.launch(ms(bwd_ms) // 3, ms(bwd_ms))
            tail_start[r.rank] = r.host
            launched[r.rank] = dev.comm_launch()   # the last gradient is ready: DDP's tail
            r.host += 20 * US                      # launching the all-reduce
        # NCCL: each stream reaches the all-reduce, which ends once all have, plus the transfer
        arrive = {r.rank: r.stream_at() for r in sims}
        done = max(arrive.values()) + ms(transfer_ms)
        for r in sims:
            dev = timers[r.rank]
            r.free = done
            r.host += 30 * US                      # DDP's finalize: the stream waits for it
            dev.comm_done(launched[r.rank])
            comm = r.host - tail_start[r.rank]
            r.launch(ms(opt_ms) // 3, ms(opt_ms))
            waited = r.sync()                      # loss.item()
            r.host += 50 * US
            dev.step_end(step)
            step_ns = r.host - starts[r.rank]
            other = waited + 50 * US
            rows[r.rank].append(host_row(step, t0 + starts[r.rank], step_ns, ms(data_ms),
                                         ms(fwd_ms) // 3, ms(bwd_ms) // 3, ms(opt_ms) // 3,
                                         comm, other))
            ends[r.rank] = r.host
        # every rank's host ends the step at about the same time: they start the next together
        top = max(ends.values())
        for r in sims:
            r.host = ends[r.rank] = top
    os.makedirs(out, exist_ok=True)
    for r in sims:
        device = timers[r.rank].resolve(wait=True)
        header = {"schema": SCHEMA, "rank": r.rank, "local_rank": r.rank, "world_size": ranks,
                  "host": "node0", "pid": 100 + r.rank, "start_unix_ns": t0,
                  "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
                  "comm_timing": "ddp_tail+collectives", "comm_key": COMM_KEY,
                  "knobs": {"world_size": ranks, "local_world_size": ranks, "backend": backend,
                            "model": "DistributedDataParallel", "device": f"cuda:{r.rank}",
                            "param_dtype": "float32", "batch_size": 64, "cpu_count": 32,
                            "cpus_available": 32, "cuda_available": True},
                  "gpu": {"device_timing": "cuda_events", "name": gpu}}
        with open(os.path.join(out, rank_file_name(r.rank)), "w") as f:
            f.write(json.dumps(header) + "\n")
            for row in rows[r.rank]:
                f.write(json.dumps(row) + "\n")
            f.write(json.dumps({"device": device}) + "\n")
            f.write(json.dumps({"end": {"steps": steps, "crashed": False}}) + "\n")
    return seams
