"""The typed result of an analysis as data (Verdict, StepResult, RankResult, Straggler,
Suggestion, ..., ReportData) and its stable JSON form: each class declares its keys as columns
(`JSON`: key, field, unit, rounding, when left out), which json_form.py's one serializer writes
(`to_dict`) and reads (`from_dict`). Renderers and the analysis import these; `report.Report`
adds the ways out.

Times inside are integer (or mean) nanoseconds and shares are fractions 0..1 unless a field
says `_pct`; every figure of a quantity is its mean per step over the analysed steps (the one
statistic, named in the report as `basis`); the JSON form uses ms and % (DESIGN.md keys).
`from_dict(to_dict())` gives back an equal report, less the rank x step table (`table`), which
the JSON does not carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .breakdown import GpuBreakdown
from .errors import InputError
from .json_form import (IN_MS, IN_PCT, MS_OF_NS, PCT_OF_SHARE, WHOLE, Col, Jsonable, Unit, empty,
                        load, none)
from .thresholds import Thresholds
from .vocab import COMPUTE_PHASES, JITTER, MS, PARTS

if TYPE_CHECKING:  # the table needs pandas; a Report read from JSON has none
    from .runtable import RunTable
    from .sections import (CommGroup, DataParallel, Death, Energy, Memory, NotRuledOut, Ops,
                           ParallelLayout, Routing, Stall, StoppedRank, StragglerFloor,
                           Throughput)

SCHEMA = "gpuscope.report/1"
#: the one statistic of every figure of a quantity in a report (ms per step, shares, estimates,
#: a straggler's excess): said once, in the JSON and under the terminal's rank table
BASIS = "mean per step over the analysed steps"


def _r3(x) -> float:
    return round(float(x), 3)


@dataclass(frozen=True)
class Verdict(Jsonable):
    """The run's label: the one that holds the most step time."""

    label: str
    share: float          # share of total step time carried by steps with that label
    confidence: str       # high / medium / low: the share, capped by evidence (confidence.py)
    time_by_label: dict   # label -> share of step time
    evidence: tuple = ()  # what in the input limits the confidence, one line each

    #: at the report's top level (ReportData's columns spread them)
    JSON = (Col("verdict", "label"), Col("verdict_share", "share", digits=4),
            Col("confidence"), Col("confidence_why", "evidence"), Col("time_by_label"))

    def others(self) -> list[tuple[str, float]]:
        """The other labels with their shares, largest first, those that round to 0% left out:
        the "(also: ...)" every view prints, in one order."""
        return [(k, s) for k, s in sorted(self.time_by_label.items(), key=lambda kv: -kv[1])
                if k != self.label and s >= 0.005]


@dataclass(frozen=True)
class Jitter(Jsonable):
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

    JSON = (Col("steps_time_pct", "steps_share", PCT_OF_SHARE, 2),
            Col("wait_pct", "wait_share", PCT_OF_SHARE, 2), Col("intermittent"))


@dataclass(frozen=True)
class TelemetrySummary(Jsonable):
    """One rank's NVML samples summed up."""

    samples: int
    util_pct: float            # mean utilization
    mem_used_max_pct: float    # peak memory in use, % of the device's
    power_w: float             # mean power
    sm_clock_mhz: float        # mean SM clock
    sm_clock_min_mhz: int
    temp_max_c: int
    throttle: tuple[str, ...]  # throttle reasons seen (idle excluded)

    JSON = (Col("samples"), Col("util_pct", unit=IN_PCT), Col("mem_used_max_pct", unit=IN_PCT),
            Col("power_w", unit=Unit("W")), Col("sm_clock_mhz", unit=Unit("MHz")),
            Col("sm_clock_min_mhz", unit=Unit("MHz")), Col("temp_max_c", unit=Unit("C")),
            Col("throttle"))


@dataclass
class Straggler(Jsonable):
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

    JSON = (Col("rank"), Col("host"), Col("slow_steps_pct", "slow_steps_share", PCT_OF_SHARE, 1),
            Col("excess_ms", "excess_ns", MS_OF_NS, 3), Col("cause"), Col("cause_detail"),
            Col("telemetry"), Col("group", omit=empty), Col("probable", omit=empty),
            Col("ops", omit=empty), Col("last_in", omit=lambda n_m: not n_m[1]),
            Col("bursts", omit=empty), Col("lateness", write=lambda s, d: s.lateness))


@dataclass(frozen=True)
class MinorStraggler(Jsonable):
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

    JSON = (Col("rank"), Col("host"), Col("late_ms", "late_ns", MS_OF_NS, 3),
            Col("late_pct", "late_share", PCT_OF_SHARE, 1),
            Col("excess_ms", "excess_ns", MS_OF_NS, 3), Col("cause"), Col("cause_detail"),
            Col("last_in", omit=lambda n_m: not n_m[1]))


@dataclass(frozen=True)
class StageResult(Jsonable):
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

    JSON = (Col("rank"), Col("stage"), Col("pipeline"),
            *(Col(f"{k}_ms", f"{k}_ns", MS_OF_NS, 3)
              for k in ("step", "busy", "compute", "wait_prev", "wait_next", "bubble")),
            # from the figures as written, so that reading the JSON back gives the same one
            Col("bubble_pct", unit=IN_PCT, write=lambda s, d: round(
                100 * d["bubble_ms"] / max(d["step_ms"], 1e-6), 2)),
            Col("microbatches"))


@dataclass(frozen=True)
class PipelineResult(Jsonable):
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

    JSON = (Col("stages", kind=StageResult), Col("n_stages"), Col("microbatches"),
            Col("bubble_pct", "bubble_share", PCT_OF_SHARE, 2),
            Col("ideal_bubble_pct", "ideal_bubble_share", PCT_OF_SHARE, 2),
            Col("slowest_rank"), Col("imbalance", digits=3))


@dataclass
class Suggestion(Jsonable):
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
    #: the label whose gaining fixes come before it whatever the gains (suggestions.in_order):
    #: a straggler late in its data where every rank loads with one DataLoader configuration
    #: comes after the data's fixes, which fix it either way; "" for none; not in the JSON form
    after: str = field(default="", compare=False)

    JSON = (Col("knob"), Col("current"), Col("proposed"),
            Col("estimated_step_ms", unit=IN_MS, digits=3), Col("why"), Col("addresses"),
            Col("gain_pct", unit=IN_PCT, digits=1),
            Col("estimated_step_ms_range", unit=IN_MS, digits=3))


@dataclass(frozen=True)
class StepResult(Jsonable):
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

    JSON = (Col("step"), Col("label"), Col("step_ms", "step_ns", MS_OF_NS, 3),
            Col("data_pct", "data_share", PCT_OF_SHARE, 3),
            Col("comm_exposed_pct", "comm_share", PCT_OF_SHARE, 3),
            Col("wait_pct", "wait_share", PCT_OF_SHARE, 3),
            Col("compute_pct", "compute_share", PCT_OF_SHARE, 3), Col("secondary"),
            Col("micro_steps", omit=lambda n: n == 1),
            Col("host_pct", "host_share", PCT_OF_SHARE, 3, omit=empty),
            Col("bubble_pct", "bubble_share", PCT_OF_SHARE, 3, omit=empty))


@dataclass(frozen=True)
class RankResult(Jsonable):
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

    JSON = (Col("rank"), Col("host"), Col("steps"), Col("step_ms", "step_ns", MS_OF_NS, 3),
            *(c for p in PARTS for c in (Col(f"{p}_ms", f"{p}_ns", MS_OF_NS, 3),
                                         Col(f"{p}_pct", unit=IN_PCT, digits=3))),
            Col("phases", spread=True, write=lambda r, d: r.phases_out(),
                read=lambda d: RankResult.phases_in(d)),
            Col("comm_by_kind", unit=MS_OF_NS, digits=3, omit=empty),
            *(Col(k, unit=IN_PCT, digits=3, omit=none)
              for k in ("between_pct", "host_pct", "sync_idle_pct", "cpu_math_pct",
                        "python_pct")),
            # both or neither, as one
            Col("bubble", spread=True, write=lambda r, d: r.bubble_out(),
                read=lambda d: {"bubble_ns": d.get("bubble_ms", 0.0) * MS,
                                "bubble_pct": d.get("bubble_pct", 0.0)}),
            Col("telemetry", kind=TelemetrySummary, omit=none),
            Col("gpu_breakdown", kind=GpuBreakdown, omit=none))

    def phases_out(self) -> dict:
        """Each compute phase's mean ms and % as the JSON has them (forward_ms, forward_pct)."""
        d = {}
        for phase, ns in self.phases_ns.items():
            d[f"{phase}_ms"] = _r3(ns / MS)
            d[f"{phase}_pct"] = _r3(self.phases_pct.get(phase, 0.0))
        return d

    @staticmethod
    def phases_in(d: dict) -> dict:
        phases = [p for p in COMPUTE_PHASES if f"{p}_ms" in d]
        return {"phases_ns": {p: d[f"{p}_ms"] * MS for p in phases},
                "phases_pct": {p: d.get(f"{p}_pct", 0.0) for p in phases}}

    def bubble_out(self) -> dict:
        if not (self.bubble_ns or self.bubble_pct):
            return {}
        return {"bubble_ms": _r3(self.bubble_ns / MS), "bubble_pct": _r3(self.bubble_pct)}


@dataclass
class ReportData(Jsonable):
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
    #: process groups, pipelines and the mesh's communication (analyze/layout.py), None: none
    layout: "ParallelLayout | None" = None
    pipeline: PipelineResult | None = None
    #: the structured sections are typed (sections.py), None (or []) where the input has none
    dataparallel: DataParallel | None = None  # nn.DataParallel per device (ms, GB)
    #: ranks that stopped before the others (analyze/stopped.py), and ranks with no data
    stopped_ranks: "list[StoppedRank]" = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    #: memory per rank (series) and what it tells (findings): analyze/bottlenecks/memory.py
    memory: Memory | None = None
    #: steps/s, samples/s, tokens/s, FLOP/s and MFU per rank and globally: analyze/throughput.py
    throughput: "Throughput | None" = None
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
    #: since when, whether it was late before; the pauses it came back from. None when none
    stall: "Stall | None" = None
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

    #: the JSON report (DESIGN.md keys; times in ms, shares in %), in its key order
    JSON = (Col("schema", write=lambda r, d: SCHEMA), Col("source"), Col("path"),
            Col("basis", write=lambda r, d: BASIS),
            Col("stall", spread=True, write=lambda r, d: {"stall": r.stall.to_dict()}
                if r.stall is not None else {}, read=lambda d: {"stall": stall_read(d.get("stall"))}),
            Col("died", kind="Death", omit=empty), Col("world_size", unit=WHOLE),
            Col("ranks_analysed", write=lambda r, d: len(r.ranks)),
            Col("steps_analysed", write=lambda r, d: len(r.steps)),
            Col("verdict", kind=Verdict, spread=True),
            Col("stragglers", write=lambda r, d: r.straggler_ranks),
            Col("probable_stragglers", write=lambda r, d: r.probable_straggler_ranks),
            Col("straggler_details", "stragglers", kind=Straggler),
            Col("minor_stragglers", kind=MinorStraggler), Col("jitter", kind=Jitter),
            Col("steps", kind=StepResult), Col("ranks", kind=RankResult),
            Col("suggestions", kind=Suggestion), Col("knobs"),
            Col("thresholds", kind=Thresholds), Col("warnings"),
            Col("straggler_not_ruled_out", "not_ruled_out", kind="NotRuledOut", omit=none),
            Col("straggler_floor", kind="StragglerFloor", omit=none),
            Col("early_ranks", omit=empty), Col("layout", kind="ParallelLayout", omit=none),
            Col("pipeline", kind=PipelineResult, omit=none),
            Col("dataparallel", kind="DataParallel", omit=none),
            Col("stopped_ranks", kind="StoppedRank", omit=empty), Col("missing_ranks", omit=empty),
            Col("memory", kind="Memory", omit=none), Col("throughput", kind="Throughput", omit=none),
            Col("energy", kind="Energy", omit=none), Col("comm_by_group", kind="CommGroup", omit=empty),
            Col("routing", kind="Routing", omit=none), Col("ops", kind="Ops", omit=none))

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

    @classmethod
    def from_dict(cls, d: dict) -> "ReportData":
        """Read back a saved JSON report (`to_dict`'s form), checked: a report of another
        schema, or with a missing or malformed field, is one InputError."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise InputError(f"not a {SCHEMA} JSON report (schema {got!r})")
        try:
            return load(cls, d)
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


def stall_read(stall: dict | None) -> "Stall | None":
    """A JSON report's `stall` as the analysis makes it (typed, its ranks' stacks keyed by
    rank), its `story` (what a front end shows after "The run stalled:") said once here for a
    report written before it carried one."""
    if not stall:
        return None
    from .sections import Stall, load
    from .stall_story import said

    out = dict(stall) if isinstance(stall, dict) else stall
    if isinstance(out, dict) and out.get("text") and not out.get("story"):
        text = str(out["text"])
        said(out, text[len("stalled "):] if text.startswith("stalled ") else text)
    return load(Stall, out, "stall")
