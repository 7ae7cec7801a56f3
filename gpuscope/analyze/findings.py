"""What the analysis found that the bottlenecks' suggestions are drawn from (Findings), the
mean step every estimate starts from (TypicalStep), and the two conversions all estimates share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..results import Jitter, Straggler
from ..thresholds import Thresholds
from ..vocab import MS
from . import order_stats, whatif
from .rowgroups import Groups


@dataclass
class Findings:
    """What the analysis found that the suggestions are drawn from."""

    frame: pd.DataFrame             # the analysed rank x step table (wait filled)
    labels: set[str]                # the verdict and every label holding a material share
    thresholds: Thresholds
    knobs: dict
    stragglers: list[Straggler] = field(default_factory=list)
    early_ranks: set[int] = field(default_factory=set)  # ranks that wait for all others
    data_share: float = 0.0         # data's share of the step time (mean data / mean step)
    jitter: Jitter = field(default_factory=Jitter)
    exposed_by_kind: dict = field(default_factory=dict)  # kind -> mean exposed ns per step
    micro: whatif.MicroSteps | None = None  # per micro-step means, synchronized or not
    growth: dict = field(default_factory=dict)  # {m: (point, lo, hi)} forward's growth, measured
    routing: object = None  # sections.Routing: all-to-all rows by rank (routing.py), or None
    #: the share of exposed communication that synchronized gradients (None: not known)
    grad_share: float | None = None
    #: where the host's syncs come from, summed over the ranks ({source: syncs}; traces)
    sync_sources: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TypicalStep:
    """The mean step (ns) over the analysed steps, the one basis of every estimate: the step is
    the slowest rank's mean, the parts the mean over ranks (wait: the longest wait of the step),
    each averaged over the steps; a suggestion's estimate is the mean step after its change, so its
    gain is the throughput ratio."""

    step: float
    data: float
    transfer: float
    wait: float
    compute: float
    data_cpu: float | None  # CPU time of loading, None when not measured (traces)
    sync_interval: int
    host: float = 0.0    # GPU idle waiting for the host to launch (GPU traces)
    #: traces: the part of the data wait the training thread spent in torch ops (the CPU
    #: loading is seen to use; its Python is not in a trace); None elsewhere
    data_ops: float | None = None
    #: the rest of the step (step less data) of the analysed rows at its 10th percentile: how
    #: fast the loop's own work runs in its best steps (None: fewer than 10 rows)
    busy_fast: float | None = None
    #: GPU traces: the host's time blocked in runtime calls that wait on the device or copy,
    #: the syncs among them (.item(), .cpu(), torch.cuda.synchronize()), and the GPU's idle
    #: time after the syncs until its next work, per step
    sync: float = 0.0
    syncs: float = 0.0
    sync_idle: float = 0.0
    #: GPU traces: the device work (kernels, copies) the host launched per step
    launches: float = 0.0
    #: GPU traces: of `host`, the GPU's idle while the training thread ran maths on CPU tensors
    cpu_math: float = 0.0
    #: GPU traces: of `host`, the GPU's idle while the host ran Python between torch ops
    python: float = 0.0

    @property
    def busy(self) -> float:  # time the step needs besides data
        return max(self.step - self.data, 1.0)


def typical_step(frame: pd.DataFrame) -> TypicalStep:
    g = Groups(frame["step"].to_numpy())

    def mean(col: str) -> np.ndarray:
        return g.mean(frame[col].to_numpy()) if col in frame else np.zeros(g.keys.size)

    slowest = g.max(frame["step_ns"].to_numpy())
    most_wait = g.max(frame["wait_ns"].to_numpy())
    data = mean("data_ns")
    # CPU time while loading: recorded runs measure it (on every step, or where fetches are
    # fast on a sample of them: record/recorder.py); traces do not (-1): unknown stays unknown
    cpu = frame["data_cpu_ns"].to_numpy() if "data_cpu_ns" in frame else np.zeros(0)
    known = cpu >= 0
    data_cpu = None
    if cpu.size and known.all():
        data_cpu = mean("data_cpu_ns")
    elif known.any():  # the measured steps' CPU share of their wait, over every step's wait
        waited = float(frame["data_ns"].to_numpy()[known].sum())
        data_cpu = data * (float(cpu[known].sum()) / waited if waited > 0 else 0.0)
    data_ops = mean("data_ops_ns") if "data_ops_ns" in frame else None
    comm = mean("comm_ns")
    if "micro_steps" in frame:  # rows are optimizer steps of several micro-steps
        interval = int(np.median(frame["micro_steps"].to_numpy()))
    else:  # rows are micro-steps: how often one of them communicated
        synced = float((comm > 0).mean()) if g.keys.size else 0.0
        interval = int(round(1 / synced)) if synced > 0 else 1
    avg = lambda a: float(np.mean(a)) if a.size else 0.0  # noqa: E731
    transfer = mean("comm_exposed_ns") - mean("wait_ns") - mean("bubble_ns")
    # the step: the slowest rank's mean (the rank table's step, and what throughput is made
    # of); the mean over steps of each step's slowest rank would add the ranks' step-to-step
    # jitter in where a step ends (72.7 ms against ranks of 67.9 and 68.1)
    by_rank = Groups(frame["rank"].to_numpy()).mean(frame["step_ns"].to_numpy())
    step = float(by_rank.max()) if by_rank.size else avg(slowest)
    rest = frame["step_ns"].to_numpy(np.float64) - frame["data_ns"].to_numpy(np.float64)
    fast = float(order_stats.percentile(rest, 10)) if rest.size >= 10 else None
    return TypicalStep(step, avg(data), avg(np.maximum(transfer, 0)),
                       avg(most_wait), avg(mean("compute_ns")),
                       avg(data_cpu) if data_cpu is not None else None,
                       interval, avg(mean("host_ns")),
                       avg(data_ops) if data_ops is not None else None, fast,
                       avg(mean("sync_ns")), avg(mean("syncs")), avg(mean("sync_idle_ns")),
                       avg(mean("launches")), avg(mean("cpu_math_ns")),
                       avg(mean("python_ns")))


def ms_range(e: "whatif.Estimate") -> tuple[float, float]:
    lo, hi = e.range
    return (lo / MS, hi / MS)


def gain(old_step: float, new_step: float, batch_factor: float = 1.0) -> float:
    """Throughput gain in % when a step of `old_step` becomes `new_step` for batch_factor x samples."""
    return (old_step * batch_factor / max(new_step, 1.0) - 1) * 100
