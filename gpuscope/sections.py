"""The report's structured sections as typed records (msgspec structs): the analysis builds them,
the renderers read their fields, and a JSON report read back is checked against them on load (a
malformed section is one clear InputError, not a KeyError in a renderer).

Their JSON form is their fields (`to_dict`), an optional field that is None left out, as the
report always wrote them (DESIGN.md keys); a field that is null where unknown and absent where
the input has nothing to say defaults to msgspec's UNSET (`known` tells a value). Where a section's parts vary by what the input holds
(a memory finding, an op table's rows), the part stays a dict and its module says its keys.

Adding a section: a struct here; the field on results.ReportData with its column in
`ReportData.JSON` (json_form.Col, naming the struct); the pass that builds it in
analyze/run.py with what it reads and writes declared (`PASSES`); its renderer in
render/terminal.py and render/html.py reading its fields; the tab's (integrations/tensorboard);
its entry in render/shown.py; and a golden report case whose input has it
(tests/fixtures/golden/reports/, scripts/golden_cases.py). docs/how-it-works.md has the recipe.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from .errors import InputError


class Section(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A report section: its JSON form is its fields, an optional one left out when None."""

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


class CommGroup(Section):
    """Communication of one process group, mean ms per step over its ranks (analyze/comm_groups)."""

    group: str
    dim: str | None             # the DeviceMesh dimension the group stands for; None: not one
    ranks: list[int]
    comm_ms: float
    exposed_ms: float
    kinds: list[str]            # the collectives run in it
    wait_ms: float | None = None      # of the exposed time, waiting for a late rank ...
    transfer_ms: float | None = None  # ... and the rest (None: not split)


class Routing(Section):
    """The most uneven all-to-all instance: rows each rank received (analyze/routing.py)."""

    instance: int
    instances: int
    steps: int
    rows_by_rank: dict[str, float]
    busiest_rank: int
    busiest_share: float
    max_over_mean: float
    uneven: bool


class DataParallel(Section):
    """nn.DataParallel per device (analyze/bottlenecks/dataparallel.py); only `devices` where
    the replicas were not timed (on CPU, or one device)."""

    devices: list[str]
    forward_ms: dict[str, float] | None = None
    scatter_ms: float | None = None
    replicate_ms: float | None = None
    gather_ms: float | None = None
    device0_forward_excess_pct: float | None = None
    peak_memory_gb: dict[str, float] | None = None
    device0_memory_excess_pct: float | None = None


class MemorySeries(Section):
    """One rank's host or device memory over the run (bytes)."""

    rank: int
    memory: str                 # "host" | "device" | "host_alloc"
    points: int
    first_bytes: int
    last_bytes: int
    peak_bytes: int
    rate_bytes_per_step: float | None
    growing: bool | None        # None: too few points to tell


class Memory(Section):
    """Memory per rank and what it tells (analyze/bottlenecks/memory.py): findings are dicts
    with "kind" (growth, near_capacity, alloc_retries, out_of_memory, ...), "ranks", "text"."""

    series: list[MemorySeries]
    findings: list[dict]

    def of_kind(self, kind: str) -> list[dict]:
        return [f for f in self.findings if f.get("kind") == kind]


class Ops(Section):
    """Ops, ranges, modules and kernels per rank and step, collectives with their messages,
    HTA's kernel breakdown (analyze/ops.py; the tables' rows are dicts, its docstrings say
    their keys)."""

    basis: str
    ranks: list[dict]
    run: dict
    slow_step: dict | None = None
    collectives: list[dict] | None = None
    kernel_breakdown: dict | None = None


class NotRuledOut(Section):
    """The rank these steps leave room to be a straggler though no test named one, where
    nobody is named late (consistency.Roles.unruled; JSON `straggler_not_ruled_out`)."""

    rank: int
    late_ms: float              # how late it arrived, on average
    up_to_ms: float             # up to this much is within chance over these steps
    material_ms: float          # a straggler from this much on is imbalance
    steps: int

    def line(self) -> str:
        return (f"rank {self.rank} is not ruled out as a straggler: it arrived "
                f"{self.late_ms:.1f} ms after the others on average over {self.steps} steps, and "
                f"up to {self.up_to_ms:.1f} ms is within chance (a straggler from "
                f"{self.material_ms:.1f} ms on is imbalance): more steps would settle it")


class StragglerFloor(Section):
    """What the steps can see of a straggler where no rank is named late
    (consistency.Roles.floor_ns; JSON `straggler_floor`)."""

    up_to_ms: float             # a rank late by up to this much a step is not told from chance
    pct: float                  # ... this share of the typical step
    steps: int

    def line(self) -> str:
        return (f"these {self.steps} steps cannot tell a rank late by up to {self.up_to_ms:.1f} "
                f"ms a step on average ({self.pct:.0f}% of it) from chance: a smaller "
                "straggler would not be seen")


class EnergyRank(Section):
    """One rank's energy over the steps the NVML samples cover."""

    rank: int
    steps: int
    joules_per_step: float
    watts: float
    joules_per_sample: float | None = None


class EnergyCost(Section):
    """What 1,000 steps cost at the price given, and each part's share of it by time."""

    price_per_gpu_hour: float
    per_1000_steps: float
    data: float
    comm: float                 # exposed transfer
    waiting: float              # waiting for other ranks


class Energy(Section):
    """Energy per rank and step from NVML and what the waiting costs; with a price, the cost
    per 1,000 steps (analyze/energy.py). Either part may be absent (no samples, no price)."""

    source: str | None = None           # "NVML energy counter" | "power samples"
    per_rank: list[EnergyRank] | None = None
    joules_per_step: float | None = None  # summed over the ranks
    waiting_pct: dict[str, float] | None = None  # data / comm / waiting: % of the energy
    assumes: str | None = None
    joules_per_sample: float | None = None
    cost: EnergyCost | None = None

    def line(self) -> str:
        """Joules, watts, the share spent waiting, and the cost, in one line ("" without
        any): what every front end says of it."""
        parts = []
        if self.per_rank:
            w = self.waiting_pct or {}
            watts = sum(r.watts for r in self.per_rank) / len(self.per_rank)
            parts.append(
                f"{self.joules_per_step:,.1f} J/step over {len(self.per_rank)} GPU(s)"
                + (f", {self.joules_per_sample:.3g} J/sample"
                   if self.joules_per_sample is not None else "")
                + f", {watts:.0f} W per GPU ({self.source}); {sum(w.values()):.0f}% of it while "
                f"waiting (data {w['data']:.0f}%, communication {w['comm']:.0f}%, other ranks "
                f"{w['waiting']:.0f}%)")
        c = self.cost
        if c:
            parts.append(f"{c.per_1000_steps:,.2f} per 1,000 steps at {c.price_per_gpu_hour:g} "
                         f"per GPU hour, of which data {c.data:,.2f}, communication "
                         f"{c.comm:,.2f}, waiting for other ranks {c.waiting:,.2f}")
        return "; ".join(parts)


class ProcessGroup(Section):
    """A process group the run's collectives went through, with its global ranks."""

    name: str
    ranks: list[int]


class DimComm(Section, kw_only=True):
    """One mesh dimension's communication, mean ms per step over its groups' ranks."""

    exposed_ms: float
    comm_ms: float
    wait_ms: float | None = None        # of the exposed time, waiting for a late rank ...
    transfer_ms: float | None = None    # ... and the rest (absent: not split)
    kinds: list[str]


class Mesh(Section, kw_only=True):
    """Communication by DeviceMesh dimension, and the one that holds the step back."""

    by_dim: dict[str, DimComm]
    holds_back: str | None              # null: no dimension holds COMM of the step

    def holds_back_words(self) -> str:
        """The dimension that holds the step back in words every front end shows ("" where
        none does)."""
        if not self.holds_back:
            return ""
        return (f"The {self.holds_back!r} dimension holds the step back: "
                f"{self.by_dim[self.holds_back].exposed_ms:.1f} ms of exposed communication per "
                "step")


class ParallelLayout(Section):
    """The run's parallel layout (analyze/layout.py): its process groups, pipeline chains (each
    in stage order), the ranks with point-to-point traffic, and the mesh's communication."""

    groups: list[ProcessGroup] | None = None   # [] where none but the pipelines
    pipelines: list[list[int]] | None = None
    stage_ranks: list[int] | None = None
    mesh: Mesh | None = None


class StallState(str, Enum):
    """What kind of stall it is (as the Flight Recorder's MatchState says how entries match)."""

    WAITING = "waiting"          # ranks wait in one collective; the others never reached it
    MISMATCHED = "mismatched"    # ranks at one collective number entered different collectives
    ELSEWHERE = "elsewhere"      # no rank waits on a peer: each is where it stopped
    FROM_DUMPS = "from_dumps"    # told by the Flight Recorder's dumps alone (no stall record)


class Pause(Section, kw_only=True):
    """A stall the run came back from, or that the program closed the recording in."""

    rank: int
    step: int
    lasted_s: float | None
    in_: str | None = msgspec.field(name="in")   # what the rank was in (data, forward, ...)
    at: str | None                               # file:line (function) of the user's code
    until_end: bool | None = None                # the recording closed before it ended


class Stall(Section, kw_only=True):
    """A run whose steps stopped coming (analyze/stall.py; its words by stall_story.py): who
    waits where, who never came and where, since when, whether it was late before, how it
    ended; the pauses it came back from. A run that only paused has `pauses` alone."""

    state: StallState | None = None
    step: int | None = None
    group: str | None = None
    seq: int | None = None
    kind: str | None | UnsetType = UNSET    # the collective; null: the ranks' kinds differ
    waiting: list[int] | None = None
    never_reached: list[int] | None = None
    behind_them: list[int] | None = None    # reached further than those, not as far as it
    past_it: list[int] | None = None
    mismatched: dict[str, list[int]] | None = None   # "kind [shape]" -> ranks
    odd_ones: list[int] | None = None
    silent: list[int] | None = None         # ranks that left no stall record
    story: str | None = None   # what happened, as a front end shows it after "The run stalled:"
    text: str | None = None    # the same in one line: "stalled " + story
    blamed: list[int] | None = None
    flight_recorder: dict | None = None     # the dumps told (analyze/hang_report.tell)
    flight_recorder_text: str | None = None
    late_before: dict[int, str] | None = None
    ended: str | None = None
    ranks: dict[int, dict] | None = None    # each stalled rank's record, with "at"
    stacks: dict[int, list[dict]] | None = None
    pauses: list[Pause] | None = None

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self, str_keys=True)

    @property
    def stalled(self) -> bool:
        """It stalled (not only paused)."""
        return bool(self.text)


def known(value) -> bool:
    """A field that holds a value: not None (said unknown) and not UNSET (not said at all)."""
    return value is not None and value is not UNSET


class RankRate(Section):
    """One rank's rates over its analysed steps (analyze/throughput.py)."""

    rank: int
    steps_per_s: float
    samples_per_s: float | None         # null: the batch size is not known
    tokens_per_s: float | UnsetType = UNSET
    flop_per_s: float | UnsetType = UNSET
    mfu_pct: float | UnsetType = UNSET  # absent: no peak, or an impossible MFU
    busy_mfu_pct: float | UnsetType = UNSET   # over its steps less their waiting


class Throughput(Section, kw_only=True):
    """Steps/s, samples/s, tokens/s, FLOP/s and MFU per rank and for the run
    (analyze/throughput.py): a key is absent where its input is (no token count, no FLOPs),
    and null where the input is there but the figure cannot be had (samples/s without a batch
    size; MFU without a peak, or above 100%)."""

    per_rank: list[RankRate]
    steps_per_s: float                  # the median rank's
    samples_per_s: float | None         # summed over the ranks that count samples
    tokens_per_s: float | UnsetType = UNSET
    flops_per_step: float | UnsetType = UNSET
    flops_source: str | UnsetType = UNSET
    flop_per_s: float | UnsetType = UNSET   # mean per rank
    peak_flops: float | None | UnsetType = UNSET
    peak_source: str | UnsetType = UNSET
    mfu_pct: float | None | UnsetType = UNSET
    mfu_impossible: str | UnsetType = UNSET  # why the MFU would be above 100%
    assumes: list[str]
    #: per straggler, the median rank's busy MFU minus its own (points)
    straggler_mfu_gap_pct: dict[str, float] | UnsetType = UNSET


class StoppedRank(Section):
    """A rank that stopped before the others (analyze/stopped.stopped_ranks); `line()` is the
    warning every front end shows."""

    rank: int
    last_step: int              # its last recorded step (-1: none)
    others_reached: int         # the last step the others recorded
    reason: str                 # how it ended, and whether the others then failed on it

    def line(self) -> str:
        return (f"rank {self.rank} stopped first: "
                + (f"its last recorded step is {self.last_step}" if self.last_step >= 0 else
                   "it recorded no step")
                + f"; the other ranks recorded up to step {self.others_reached} ({self.reason})")


class Death(Section):
    """A rank whose training ended by its own error or a kill, not by waiting on a lost peer
    (analyze/stopped.deaths), the one that died first leading; `text` says it, with whether
    it was late before (`late_before`, the first only), as every front end shows it."""

    rank: int
    step: int | None            # the step it died in (from 0, as every step); None: not known
    last_step: int | None       # its last recorded step
    cause: Literal["out_of_memory", "fatal_signal", "killed", "exception"]
    first: bool                 # among the ranks that stopped first
    unix_ns: int | None         # when (None: killed, no end record to say)
    text: str
    late_before: str | None = None


def named(name: str) -> type:
    """A section's struct by its class name (json_form's columns name them: msgspec loads
    only where a report holds one)."""
    kind = globals().get(name)
    if not (isinstance(kind, type) and issubclass(kind, Section)):
        raise ValueError(f"no report section is named {name!r}")
    return kind


def load(kind: type, value, key: str):
    """A section read back from a JSON report, checked against its type (None where absent)."""
    if value is None or value == {}:
        return None
    try:
        return msgspec.convert(value, kind, str_keys=True)  # ranks as JSON keys: "3"
    except msgspec.ValidationError as exc:
        raise InputError(f"the report's {key!r} section is malformed: {exc}") from None


def load_list(kind: type, values, key: str) -> list:
    """A list of sections read back (comm_by_group), each checked."""
    if not isinstance(values, list):
        raise InputError(f"the report's {key!r} section is not a list")
    return [load(kind, v, key) for v in values]
