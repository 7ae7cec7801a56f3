"""The typed result of an analysis as data (Verdict, StepResult, RankResult, Straggler,
Suggestion, ..., ReportData) and its stable JSON form (`to_dict` / `from_dict`). Renderers and the
analysis import these; `report.Report` adds the ways out.

Times inside are integer (or mean) nanoseconds and shares are fractions 0..1 unless a field
says `_pct`; every figure of a quantity is its mean per step over the analysed steps (the one
statistic, named in the report as `basis`); the JSON form uses ms and % (DESIGN.md keys). `from_dict(to_dict())` gives back an
equal report, less the rank x step table (`table`), which the JSON does not carry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from .breakdown import GpuBreakdown
from .errors import InputError
from .thresholds import Thresholds
from .vocab import COMPUTE_PHASES, JITTER, MS, PARTS

if TYPE_CHECKING:  # the table needs pandas; a Report read from JSON has none
    from .runtable import RunTable
    from .sections import (CommGroup, DataParallel, Death, Energy, Memory, NotRuledOut, Ops,
                           Routing, StragglerFloor)

SCHEMA = "gpuscope.report/1"
#: the one statistic of every figure of a quantity in a report (ms per step, shares, estimates,
#: a straggler's excess): said once, in the JSON and under the terminal's rank table
BASIS = "mean per step over the analysed steps"


def _r3(x) -> float:
    return round(float(x), 3)


def _ns(ms) -> int:
    return int(round(float(ms) * MS))


@dataclass(frozen=True)
class Verdict:
    """The run's label: the one that holds the most step time."""

    label: str
    share: float          # share of total step time carried by steps with that label
    confidence: str       # high / medium / low: the share, capped by evidence (confidence.py)
    time_by_label: dict   # label -> share of step time
    evidence: tuple = ()  # what in the input limits the confidence, one line each

    def others(self) -> list[tuple[str, float]]:
        """The other labels with their shares, largest first, those that round to 0% left out:
        the "(also: ...)" every view prints, in one order."""
        return [(k, s) for k, s in sorted(self.time_by_label.items(), key=lambda kv: -kv[1])
                if k != self.label and s >= 0.005]


@dataclass(frozen=True)
class Jitter:
    """Waiting in steps where the late rank changes from step to step (no consistent straggler)."""

    steps_share: float = 0.0   # share of step time in those steps
    #: share of step time lost waiting in them, by the rank that waits longest in each (the
    #: rank table's wait is each rank's own)
    wait_share: float = 0.0
    #: one rank late in nearly all of the steps with waiting, a minority of the steps
    #: (consistency.intermittent): {"rank", "late_steps", "of_steps", "steps", "every",
    #: "excess_ms"}
    intermittent: dict | None = None

    def note(self, stragglers: list[int] | None = None) -> str:
        """One line on it ("" when it costs under 1% of step time). Beside named stragglers it
        is the waiting of the other steps, said so (never "no consistent straggler" then); with
        an intermittently late rank, that rank and its steps."""
        d = self.to_dict()
        if d["wait_pct"] < 1:
            return ""
        i = self.intermittent
        if i:
            late = i["late_steps"]
            where = (f"every {i['every']} steps" if i["every"] else "steps " + ", ".join(
                map(str, late[:6])) + (", ..." if len(late) > 6 else ""))
            return (f"Intermittent straggler: {d['wait_pct']:.1f}% of step time is spent waiting "
                    f"by the rank that waits longest, in steps with no steady late rank; in the {i['of_steps']} steps where the "
                    f"waiting stands out, rank {i['rank']} arrived last in {len(late)} ({where}; "
                    f"{i['steps']} steps analysed), {i['excess_ms']:.1f} ms late in each")
        if stragglers:
            who = ", ".join(map(str, stragglers))
            return (f"Rank jitter besides: {d['wait_pct']:.1f}% of step time is spent waiting by "
                    f"the rank that waits longest, in steps where rank(s) {who} did not arrive last and the late rank changes "
                    f"from step to step ({d['steps_time_pct']:.0f}% of step time)")
        return (f"Rank jitter: {d['wait_pct']:.1f}% of step time is spent waiting by the rank "
                f"that waits longest, in steps where the late rank changes from step to step ({d['steps_time_pct']:.0f}% of step "
                "time): no consistent straggler")

    def to_dict(self) -> dict:
        return {"steps_time_pct": round(100 * self.steps_share, 2),
                "wait_pct": round(100 * self.wait_share, 2),
                "intermittent": self.intermittent}

    @classmethod
    def from_dict(cls, d: dict) -> "Jitter":
        return cls(d["steps_time_pct"] / 100, d["wait_pct"] / 100, d.get("intermittent"))


@dataclass(frozen=True)
class TelemetrySummary:
    """One rank's NVML samples summed up."""

    samples: int
    util_pct: float            # mean utilization
    mem_used_max_pct: float    # peak memory in use, % of the device's
    power_w: float             # mean power
    sm_clock_mhz: float        # mean SM clock
    sm_clock_min_mhz: int
    temp_max_c: int
    throttle: tuple[str, ...]  # throttle reasons seen (idle excluded)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throttle"] = list(self.throttle)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TelemetrySummary":
        return cls(**{**d, "throttle": tuple(d.get("throttle", ()))})


@dataclass
class Straggler:
    """A rank the others wait for, consistently."""

    rank: int
    slow_steps_share: float     # share of imbalanced steps in which it arrived last
    excess_ns: int              # mean busy time (step - wait) per step above the median rank's
    cause: str                  # "data" | "compute" | "other"
    cause_detail: str = ""      # e.g. "backward" when the compute excess sits there
    cause_excess_ns: int = 0
    host: str = ""
    telemetry: str = ""         # what its GPU shows against the others (NVML), if anything
    group: list = field(default_factory=list)  # the ranks it makes wait (its process group)
    #: "" for a straggler the tests confirm; else why it is only probably one (late in most
    #: steps, too few of them to rule out chance)
    probable: str = ""
    # the ranks its excess is measured against when they are its group's (empty: every other
    # rank); what the suggestion's text says, not part of the JSON form
    peers: list = field(default_factory=list, compare=False)
    #: the ops and kernels its excess is in, against the median of its peers (profiler traces:
    #: analyze/ops.py excess), largest first
    ops: list = field(default_factory=list)
    #: (N, M): it arrived last in N of the M steps every rank recorded: the one count of its
    #: lateness every view quotes (0, 0: not known, an older report)
    last_in: tuple = (0, 0)
    #: where most of its lateness sits when that is a few steps (consistency.bursts): {"steps",
    #: "of_steps", "share", "every", "excess_ms"}; empty when it is spread over the steps
    bursts: dict = field(default_factory=dict)

    @property
    def part(self) -> str:
        return f"{self.cause} ({self.cause_detail})" if self.cause_detail else self.cause

    @property
    def lateness(self) -> str:
        """The one statement of its lateness: "last in N of M steps" (the share of the
        imbalanced steps it was slow in, where an older report lacks the count)."""
        n, m = self.last_in
        said = (f"last in {n} of {m} steps" if m else
                f"slow in {100 * self.slow_steps_share:.0f}% of the imbalanced steps")
        b = self.bursts
        if b:
            when = f"every {b['every']} steps" if b.get("every") else \
                "steps " + ", ".join(str(x) for x in b["steps"])
            said += (f", {100 * b['share']:.0f}% of the waiting in {len(b['steps'])} of them "
                     f"({when}), {b['excess_ms']:.1f} ms late in each: intermittent")
        return said

    def to_dict(self) -> dict:
        return {"rank": self.rank, "host": self.host,
                "slow_steps_pct": round(100 * self.slow_steps_share, 1),
                "excess_ms": _r3(self.excess_ns / MS), "cause": self.cause,
                "cause_detail": self.cause_detail, "telemetry": self.telemetry,
                **({"group": list(self.group)} if self.group else {}),
                **({"probable": self.probable} if self.probable else {}),
                **({"ops": [dict(o) for o in self.ops]} if self.ops else {}),
                **({"last_in": list(self.last_in)} if self.last_in[1] else {}),
                **({"bursts": dict(self.bursts)} if self.bursts else {}),
                "lateness": self.lateness}

    @classmethod
    def from_dict(cls, d: dict) -> "Straggler":
        return cls(d["rank"], d["slow_steps_pct"] / 100, _ns(d["excess_ms"]), d["cause"],
                   d.get("cause_detail", ""), host=d.get("host", ""),
                   telemetry=d.get("telemetry", ""), group=list(d.get("group", [])),
                   probable=d.get("probable", ""), ops=[dict(o) for o in d.get("ops", [])],
                   last_in=tuple(d.get("last_in", (0, 0))), bursts=dict(d.get("bursts", {})))


@dataclass(frozen=True)
class MinorStraggler:
    """A rank consistently late by less than the imbalance threshold (consistency.Roles.minor):
    it decides no verdict and gets no suggestion, and is named so that its cause can be looked
    at before it grows."""

    rank: int
    late_ns: int                # mean lateness at the collectives against the others' mean
    late_share: float           # of the typical step
    excess_ns: int              # mean busy time (step - wait) per step above the median rank's
    cause: str                  # "data" | "compute" | "other"
    cause_detail: str = ""
    host: str = ""
    last_in: tuple = (0, 0)     # arrived last in N of the M steps every rank recorded

    @property
    def part(self) -> str:
        return f"{self.cause} ({self.cause_detail})" if self.cause_detail else self.cause

    def line(self, threshold: float) -> str:
        """What it is, in one line (terminal and HTML)."""
        n, m = self.last_in
        return (f"rank {self.rank}{' on ' + self.host if self.host else ''}: arrives "
                f"{self.late_ns / MS:.1f} ms after the others on average ({100 * self.late_share:.0f}% "
                f"of the step{f'; last in {n} of {m} steps' if m else ''}), consistently, "
                f"{self.excess_ns / MS:.1f} ms busier per step than the median rank, mostly in "
                f"{self.part}: under the {100 * threshold:.0f}% at which waiting for it "
                "decides the verdict, so no suggestion; its cause is worth a look before it grows")

    def to_dict(self) -> dict:
        return {"rank": self.rank, "host": self.host, "late_ms": _r3(self.late_ns / MS),
                "late_pct": round(100 * self.late_share, 1), "excess_ms": _r3(self.excess_ns / MS),
                "cause": self.cause, "cause_detail": self.cause_detail,
                **({"last_in": list(self.last_in)} if self.last_in[1] else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "MinorStraggler":
        return cls(d["rank"], _ns(d["late_ms"]), d["late_pct"] / 100, _ns(d["excess_ms"]),
                   d["cause"], d.get("cause_detail", ""), d.get("host", ""),
                   tuple(d.get("last_in", (0, 0))))


@dataclass(frozen=True)
class StageResult:
    """One pipeline stage (a rank with point-to-point communication), mean ns per step."""

    rank: int
    stage: int | None          # index in its pipeline (None: unknown order, profiler traces)
    pipeline: int | None       # which pipeline (replica) it belongs to
    step_ns: float
    busy_ns: float             # step minus waiting on other ranks and on other stages
    compute_ns: float
    wait_prev_ns: float        # blocked on the previous stage (its activations)
    wait_next_ns: float        # blocked on the next stage (its gradients)
    bubble_ns: float           # all point-to-point waiting (the two above, or without peers)
    microbatches: int | None   # forward calls per step

    def to_dict(self) -> dict:
        d = {"rank": self.rank, "stage": self.stage, "pipeline": self.pipeline}
        for k in ("step", "busy", "compute", "wait_prev", "wait_next", "bubble"):
            d[f"{k}_ms"] = _r3(getattr(self, f"{k}_ns") / MS)
        # from the figures as written, so that reading the JSON back gives the same one
        d["bubble_pct"] = round(100 * d["bubble_ms"] / max(d["step_ms"], 1e-6), 2)
        d["microbatches"] = self.microbatches
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StageResult":
        ns = {f"{k}_ns": d[f"{k}_ms"] * MS
              for k in ("step", "busy", "compute", "wait_prev", "wait_next", "bubble")}
        return cls(d["rank"], d.get("stage"), d.get("pipeline"), microbatches=d.get("microbatches"),
                   **ns)


@dataclass(frozen=True)
class PipelineResult:
    """Pipeline parallelism: per stage its busy time and waiting, the bubble against the
    schedule's ideal, and the slowest stage."""

    stages: tuple[StageResult, ...]
    n_stages: int
    microbatches: int | None
    bubble_share: float          # mean over stages of bubble / step
    ideal_bubble_share: float | None   # (S - 1) / (M + S - 1): GPipe and 1F1B, balanced stages
    slowest_rank: int
    imbalance: float             # busiest stage's busy over the mean stage's (over replicas)

    def slowest(self) -> StageResult:
        return next(s for s in self.stages if s.rank == self.slowest_rank)

    def to_dict(self) -> dict:
        return {"stages": [s.to_dict() for s in self.stages], "n_stages": self.n_stages,
                "microbatches": self.microbatches,
                "bubble_pct": round(100 * self.bubble_share, 2),
                "ideal_bubble_pct": (round(100 * self.ideal_bubble_share, 2)
                                     if self.ideal_bubble_share is not None else None),
                "slowest_rank": self.slowest_rank, "imbalance": round(self.imbalance, 3)}

    @classmethod
    def from_dict(cls, d: dict) -> "PipelineResult":
        ideal = d.get("ideal_bubble_pct")
        return cls(tuple(StageResult.from_dict(s) for s in d["stages"]), d["n_stages"],
                   d.get("microbatches"), d["bubble_pct"] / 100,
                   ideal / 100 if ideal is not None else None, d["slowest_rank"], d["imbalance"])


@dataclass
class Suggestion:
    """One change to make: the knob, its current and proposed value, the step time expected."""

    knob: str
    current: object
    proposed: object
    estimated_step_ms: float
    why: str
    addresses: str            # the label it fixes
    gain_pct: float = 0.0     # throughput gain (samples/s) the estimate implies
    #: (lo, hi) ms: where the step time should land given what the estimate had to assume
    estimated_step_ms_range: tuple[float, float] | None = None
    #: the straggler a straggler suggestion is about (its `current` says it in words): which
    #: finding its change removes (floors.fixes); not in the JSON form
    rank: int | None = field(default=None, compare=False)
    #: where trials measured this very change (calibration.py): the half-width, a share of the
    #: point, of their mean's 95% interval; a re-run's noise then adds to it in quadrature
    #: (rerun_noise.widen); not in the JSON form
    measured_share: float | None = field(default=None, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("rank")
        d.pop("measured_share")
        d["estimated_step_ms"] = _r3(self.estimated_step_ms)
        rng = self.estimated_step_ms_range
        d["estimated_step_ms_range"] = None if rng is None else [_r3(rng[0]), _r3(rng[1])]
        d["gain_pct"] = round(float(self.gain_pct), 1)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Suggestion":
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        if kw.get("estimated_step_ms_range") is not None:
            kw["estimated_step_ms_range"] = tuple(kw["estimated_step_ms_range"])
        return cls(**kw)


@dataclass(frozen=True)
class StepResult:
    """One step across ranks (a synchronous step is as slow as its slowest rank)."""

    step: int                     # with accumulation: the optimizer step's last micro-step
    label: str
    step_ns: int                  # the slowest rank's
    data_share: float             # mean over ranks of data / step
    comm_share: float             # mean over ranks of exposed transfer / step
    wait_share: float             # max over ranks of wait / step
    compute_share: float          # mean over ranks of compute / step
    secondary: tuple[str, ...] = ()
    micro_steps: int = 1          # micro-steps (rec.step() calls) in this optimizer step
    host_share: float = 0.0       # mean over ranks of GPU-waits-on-host / step (GPU traces)
    bubble_share: float = 0.0     # max over ranks of waiting on another pipeline stage / step

    @property
    def jitter(self) -> bool:
        return JITTER in self.secondary

    def to_dict(self) -> dict:
        d = {"step": self.step, "label": self.label, "step_ms": _r3(self.step_ns / MS),
             "data_pct": _r3(100 * self.data_share),
             "comm_exposed_pct": _r3(100 * self.comm_share),
             "wait_pct": _r3(100 * self.wait_share),
             "compute_pct": _r3(100 * self.compute_share), "secondary": list(self.secondary)}
        if self.micro_steps != 1:
            d["micro_steps"] = self.micro_steps
        if self.host_share:
            d["host_pct"] = _r3(100 * self.host_share)
        if self.bubble_share:
            d["bubble_pct"] = _r3(100 * self.bubble_share)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepResult":
        return cls(d["step"], d["label"], _ns(d["step_ms"]), d["data_pct"] / 100,
                   d["comm_exposed_pct"] / 100, d["wait_pct"] / 100, d["compute_pct"] / 100,
                   tuple(d.get("secondary", ())), d.get("micro_steps", 1),
                   d.get("host_pct", 0.0) / 100, d.get("bubble_pct", 0.0) / 100)


@dataclass(frozen=True)
class RankResult:
    """One rank over the analysed steps: the mean ns per step of each part (`<part>_ns`) and its
    share of the rank's summed step time in % (`<part>_pct`: the same figure over the mean
    step), and where known the compute phases, collectives by kind (mean ns per step) and what
    "other" holds."""

    rank: int
    host: str
    steps: int
    step_ns: float
    data_ns: float
    compute_ns: float
    comm_ns: float
    comm_exposed_ns: float
    wait_ns: float
    other_ns: float
    data_pct: float
    compute_pct: float
    comm_pct: float
    comm_exposed_pct: float
    wait_pct: float
    other_pct: float
    telemetry: TelemetrySummary | None = None
    gpu_breakdown: GpuBreakdown | None = None
    phases_ns: dict = field(default_factory=dict)   # forward / backward / optimizer: mean ns
    phases_pct: dict = field(default_factory=dict)  # and share of step time, %
    comm_by_kind: dict = field(default_factory=dict)  # kind -> mean ns per step
    between_pct: float | None = None  # share of step time between rec.step() and the next step
    host_pct: float | None = None     # share of step time the GPU waited on the host to launch
    sync_idle_pct: float | None = None  # ... of it, after the host's syncs returned (traces)
    cpu_math_pct: float | None = None   # ... of it, while the host ran maths on CPU tensors
    python_pct: float | None = None     # ... of it, while the host ran Python between ops
    bubble_ns: float = 0.0   # mean exposed point-to-point wait (a pipeline stage's bubble)
    bubble_pct: float = 0.0

    def part_ns(self, part: str) -> float:
        return getattr(self, f"{part}_ns")

    def part_pct(self, part: str) -> float:
        return getattr(self, f"{part}_pct")

    def mean_ms(self, part: str) -> float:
        """Mean ms per step of a part (its share of the mean step)."""
        return self.step_ns * self.part_pct(part) / 100 / MS

    @property
    def transfer_ns(self) -> float:
        """Mean exposed communication that is moving bytes, not waiting."""
        return max(self.comm_exposed_ns - self.wait_ns - self.bubble_ns, 0.0)

    def to_dict(self) -> dict:
        # a report has a row per rank (100,000 of them at fleet size): the parts written out
        # field by field, not looked up by name
        d = {"rank": self.rank, "host": self.host, "steps": self.steps,
             "step_ms": _r3(self.step_ns / MS),
             "data_ms": _r3(self.data_ns / MS), "data_pct": _r3(self.data_pct),
             "compute_ms": _r3(self.compute_ns / MS), "compute_pct": _r3(self.compute_pct),
             "comm_ms": _r3(self.comm_ns / MS), "comm_pct": _r3(self.comm_pct),
             "comm_exposed_ms": _r3(self.comm_exposed_ns / MS),
             "comm_exposed_pct": _r3(self.comm_exposed_pct),
             "wait_ms": _r3(self.wait_ns / MS), "wait_pct": _r3(self.wait_pct),
             "other_ms": _r3(self.other_ns / MS), "other_pct": _r3(self.other_pct)}
        for phase, ns in self.phases_ns.items():
            d[f"{phase}_ms"] = _r3(ns / MS)
            d[f"{phase}_pct"] = _r3(self.phases_pct.get(phase, 0.0))
        if self.comm_by_kind:
            d["comm_by_kind"] = {k: _r3(v / MS) for k, v in self.comm_by_kind.items()}
        if self.between_pct is not None:
            d["between_pct"] = _r3(self.between_pct)
        if self.host_pct is not None:
            d["host_pct"] = _r3(self.host_pct)
        if self.sync_idle_pct is not None:
            d["sync_idle_pct"] = _r3(self.sync_idle_pct)
        if self.cpu_math_pct is not None:
            d["cpu_math_pct"] = _r3(self.cpu_math_pct)
        if self.python_pct is not None:
            d["python_pct"] = _r3(self.python_pct)
        if self.bubble_ns or self.bubble_pct:
            d["bubble_ms"] = _r3(self.bubble_ns / MS)
            d["bubble_pct"] = _r3(self.bubble_pct)
        if self.telemetry is not None:
            d["telemetry"] = self.telemetry.to_dict()
        if self.gpu_breakdown is not None:
            d["gpu_breakdown"] = self.gpu_breakdown.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankResult":
        parts = {f"{p}_ns": d[f"{p}_ms"] * MS for p in PARTS}
        pcts = {f"{p}_pct": d[f"{p}_pct"] for p in PARTS}
        tel, gb = d.get("telemetry"), d.get("gpu_breakdown")
        phases = [p for p in COMPUTE_PHASES if f"{p}_ms" in d]
        return cls(d["rank"], d.get("host", ""), d["steps"], d["step_ms"] * MS, **parts, **pcts,
                   telemetry=TelemetrySummary.from_dict(tel) if tel else None,
                   gpu_breakdown=GpuBreakdown.from_dict(gb) if gb else None,
                   phases_ns={p: d[f"{p}_ms"] * MS for p in phases},
                   phases_pct={p: d.get(f"{p}_pct", 0.0) for p in phases},
                   comm_by_kind={k: v * MS for k, v in d.get("comm_by_kind", {}).items()},
                   between_pct=d.get("between_pct"), host_pct=d.get("host_pct"),
                   sync_idle_pct=d.get("sync_idle_pct"), cpu_math_pct=d.get("cpu_math_pct"),
                   python_pct=d.get("python_pct"),
                   bubble_ns=d.get("bubble_ms", 0.0) * MS, bubble_pct=d.get("bubble_pct", 0.0))


@dataclass
class ReportData:
    """What an analysis found, as data: renderers read these fields; `to_dict` is the JSON
    contract. `gpuscope.Report` adds the ways out (print, write_json, write_html)."""

    source: str                     # "record" | "kineto"
    path: str
    world_size: int
    verdict: Verdict
    steps: list[StepResult]
    ranks: list[RankResult]
    stragglers: list[Straggler]
    suggestions: list[Suggestion]
    thresholds: Thresholds          # as applied (warm-up steps resolved for the source)
    jitter: Jitter = field(default_factory=Jitter)
    knobs: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    early_ranks: list[int] = field(default_factory=list)  # ranks that wait for all others
    layout: dict = field(default_factory=dict)  # process groups and pipelines (layout.Layout)
    pipeline: PipelineResult | None = None
    #: the structured sections are typed (sections.py), None (or []) where the input has none
    dataparallel: DataParallel | None = None  # nn.DataParallel per device (ms, GB)
    #: ranks that stopped before the others (analyze/stopped.py), and ranks with no data
    stopped_ranks: list[dict] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    #: memory per rank (series) and what it tells (findings): analyze/bottlenecks/memory.py
    memory: Memory | None = None
    #: steps/s, samples/s, tokens/s, FLOP/s and MFU per rank and globally: analyze/throughput.py
    throughput: dict = field(default_factory=dict)
    #: joules per step and sample, the share spent waiting, cost per 1,000 steps: analyze/energy.py
    energy: "Energy | None" = None
    #: communication per process group, named by its mesh dimension where known
    comm_by_group: list[CommGroup] = field(default_factory=list)
    #: how unevenly all-to-alls deliver rows (an expert layer's tokens): analyze/routing.py
    routing: Routing | None = None
    #: ops, ranges and kernels per rank and step, collectives with their message and bandwidth,
    #: HTA's kernel breakdown (profiler traces): analyze/ops.py
    ops: Ops | None = None
    #: how the run died, the rank that died first first (analyze/stopped.deaths): each with
    #: its rank, the step it died in (from 0), its cause and what it says; [] when it did not
    died: "list[Death]" = field(default_factory=list)  # the first to die first
    #: a run whose steps stopped coming (analyze/stall.py): who waits where, who never came,
    #: since when, whether it was late before; the pauses it came back from. {} when none
    stall: dict = field(default_factory=dict)
    #: the analysed rank x step table (with wait and telemetry joined); None when read from JSON
    table: RunTable | None = field(default=None, compare=False, repr=False)
    #: per analysed rank and step, each mesh dimension's comm, exposed and wait ns
    #: (analyze/comm_groups.dim_steps); None when read from JSON or no group names a dimension
    comm_by_dim_steps: object = field(default=None, compare=False, repr=False)
    #: ranks consistently late by less than the imbalance threshold (MinorStraggler)
    minor_stragglers: list = field(default_factory=list)
    #: where no straggler is named: the rank these steps leave most room to be one, else None
    not_ruled_out: "NotRuledOut | None" = None
    #: where no rank is named late: what the steps can see, else None
    straggler_floor: "StragglerFloor | None" = None

    @property
    def step_ns(self) -> float:
        """The report's step time: the slowest rank's mean over the analysed steps (the rank
        table's, the throughput's and every estimate's basis); the one figure `compare`,
        `scaling` and the views quote for the run (live diagnosis: the same over its window)."""
        return float(max((r.step_ns for r in self.ranks), default=0.0))

    @property
    def straggler_ranks(self) -> list[int]:
        """The stragglers the tests confirm (a probable one is listed apart)."""
        return [s.rank for s in self.stragglers if not s.probable]

    @property
    def late_ranks(self) -> list[int]:
        """Every rank a statement of lateness names: stragglers (probable ones too), then minor
        stragglers (the jitter note speaks of the waiting besides theirs)."""
        return [s.rank for s in self.stragglers] + [m.rank for m in self.minor_stragglers]

    @property
    def not_ruled_out_line(self) -> str:
        """What the report says of a straggler its steps cannot rule out ("" where none)."""
        return self.not_ruled_out.line() if self.not_ruled_out else ""

    @property
    def straggler_floor_line(self) -> str:
        """What the steps can see of a straggler where none is named ("" where not said)."""
        return self.straggler_floor.line() if self.straggler_floor else ""

    @property
    def probable_straggler_ranks(self) -> list[int]:
        """Ranks late in most steps, too few of them to confirm it."""
        return [s.rank for s in self.stragglers if s.probable]

    def to_dict(self) -> dict:
        """The JSON report (DESIGN.md keys; times in ms, shares in %)."""
        d = {
            "schema": SCHEMA, "source": self.source, "path": self.path, "basis": BASIS,
            **({"stall": _jsonable(self.stall)} if self.stall else {}),
            **({"died": [x.to_dict() for x in self.died]} if self.died else {}),
            "world_size": int(self.world_size),
            "ranks_analysed": len(self.ranks),
            "steps_analysed": len(self.steps),
            "verdict": self.verdict.label,
            "verdict_share": round(self.verdict.share, 4),
            "confidence": self.verdict.confidence,
            "confidence_why": list(self.verdict.evidence),
            "time_by_label": self.verdict.time_by_label,
            "stragglers": self.straggler_ranks,
            "probable_stragglers": self.probable_straggler_ranks,
            "straggler_details": [s.to_dict() for s in self.stragglers],
            "minor_stragglers": [s.to_dict() for s in self.minor_stragglers],
            "jitter": self.jitter.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "ranks": [r.to_dict() for r in self.ranks],
            "suggestions": [s.to_dict() for s in self.suggestions],
            "knobs": self.knobs,
            "thresholds": self.thresholds.to_dict(),
            "warnings": list(self.warnings),
        }
        if self.not_ruled_out:
            d["straggler_not_ruled_out"] = self.not_ruled_out.to_dict()
        if self.straggler_floor:
            d["straggler_floor"] = self.straggler_floor.to_dict()
        if self.early_ranks:
            d["early_ranks"] = list(self.early_ranks)
        if self.layout:
            d["layout"] = self.layout
        if self.pipeline is not None:
            d["pipeline"] = self.pipeline.to_dict()
        if self.dataparallel is not None:
            d["dataparallel"] = self.dataparallel.to_dict()
        if self.stopped_ranks:
            d["stopped_ranks"] = [dict(s) for s in self.stopped_ranks]
        if self.missing_ranks:
            d["missing_ranks"] = list(self.missing_ranks)
        if self.memory is not None:
            d["memory"] = self.memory.to_dict()
        if self.throughput:
            d["throughput"] = self.throughput
        if self.energy:
            d["energy"] = self.energy.to_dict()
        if self.comm_by_group:
            d["comm_by_group"] = [g.to_dict() for g in self.comm_by_group]
        if self.routing is not None:
            d["routing"] = self.routing.to_dict()
        if self.ops is not None:
            d["ops"] = self.ops.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ReportData":
        """Read back a saved JSON report (`to_dict`'s form)."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise InputError(f"not a {SCHEMA} JSON report (schema {got!r})")
        from .sections import (CommGroup, DataParallel, Death, Energy, Memory, NotRuledOut,
                               Ops, Routing, StragglerFloor, load, load_list)

        try:
            verdict = Verdict(d["verdict"], d["verdict_share"], d["confidence"],
                              dict(d["time_by_label"]), tuple(d.get("confidence_why", ())))
            return cls(
                d["source"], d["path"], d["world_size"], verdict,
                [StepResult.from_dict(s) for s in d["steps"]],
                [RankResult.from_dict(r) for r in d["ranks"]],
                [Straggler.from_dict(s) for s in d["straggler_details"]],
                [Suggestion.from_dict(s) for s in d["suggestions"]],
                Thresholds(**d["thresholds"]), Jitter.from_dict(d["jitter"]),
                dict(d["knobs"]), list(d["warnings"]), list(d.get("early_ranks", [])),
                dict(d.get("layout", {})),
                PipelineResult.from_dict(d["pipeline"]) if d.get("pipeline") else None,
                load(DataParallel, d.get("dataparallel"), "dataparallel"),
                [dict(s) for s in d.get("stopped_ranks", [])], list(d.get("missing_ranks", [])),
                memory=load(Memory, d.get("memory"), "memory"),
                throughput=dict(d.get("throughput", {})), energy=load(Energy, d.get("energy"), "energy"),
                comm_by_group=load_list(CommGroup, d.get("comm_by_group", []), "comm_by_group"),
                routing=load(Routing, d.get("routing"), "routing"),
                ops=load(Ops, d.get("ops"), "ops"),
                died=load_list(Death, d.get("died", []), "died"),
                stall=stall_read(d.get("stall", {})),
                minor_stragglers=[MinorStraggler.from_dict(x)
                                  for x in d.get("minor_stragglers", [])],
                not_ruled_out=load(NotRuledOut, d.get("straggler_not_ruled_out"),
                                   "straggler_not_ruled_out"),
                straggler_floor=load(StragglerFloor, d.get("straggler_floor"),
                                     "straggler_floor"))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"a {SCHEMA} report with a missing or malformed field ({exc!r})") \
                from None

    @classmethod
    def read_json(cls, path) -> "ReportData":
        import msgspec

        try:
            with open(path, "rb") as fh:
                return cls.from_dict(msgspec.json.decode(fh.read()))
        except (OSError, msgspec.DecodeError) as exc:
            raise InputError(f"{path}: cannot read the report ({exc})") from None


def stall_read(stall: dict) -> dict:
    """A JSON report's `stall` as the analysis makes it: its ranks' stacks keyed by rank (int),
    and its `story` (what a front end shows after "The run stalled:") said once here for a
    report written before it carried one."""
    out = dict(stall or {})
    if isinstance(out.get("stacks"), dict):
        out["stacks"] = {int(r): v for r, v in out["stacks"].items()}
    if out.get("text") and not out.get("story"):
        from .stall_story import said

        text = str(out["text"])
        said(out, text[len("stalled "):] if text.startswith("stalled ") else text)
    return out


def _jsonable(x):
    """A section with int keys (ranks) as JSON has them: string keys."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
