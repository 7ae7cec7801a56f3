"""The analysis driver: RunTable -> Report through one ordered list of passes (PASSES), each a
function of one `Analysis` (the state the passes share) that reads what earlier passes found and
adds its own; warnings go to `Analysis.warnings` only.

    prepare        empty steps, stopped ranks, accumulation cycles, warm-up, the wait split
    add_up         pipeline bubbles split out; every row made to add up (invariants.py)
    classify       per-step labels, the run verdict, the roles of late and early ranks
    stragglers     who holds the others back, with why
    ops            time by op, range and kernel; a straggler's excess down to the op;
                   collectives with their size and bandwidth (profiler traces)
    telemetry      NVML samples joined to the steps; straggler evidence; memory headroom
    memory         growth with its forecast, peaks near capacity, allocator retries, OOMs
    throughput     steps/s, samples/s, tokens/s, FLOP/s and MFU per rank and globally
    energy         joules per step and sample (NVML), the share spent waiting; cost per 1,000 steps
    suggest        each bottleneck's suggestions (bottlenecks/, through suggestions.py)
    bound          suggestions held to what they can recover, the verdict's fix first
    report         per-rank summaries; the Report
    check          the report checked against its own arithmetic; confidence earned

A pass may be left out or one added without touching the others: each declares the fields it
reads and writes (passes.declares), and the order is checked against that (passes.out_of_order;
tests/test_run_passes.py also checks that the declarations are true).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import msgspec
import numpy as np
import pandas as pd

from ..report import Report
from ..runtable import RunTable
from ..thresholds import Thresholds
from ..vocab import COMPUTE, LABELS, MS, PIPELINE, UNEXPLAINED, rest_of_other
from .classify import classify_steps, jitter_cost, run_verdict, step_results
from .confidence import Evidence, earn, share_of_time
from .consistency import Roles, find_roles, intermittent
from .bottlenecks.dataparallel import dataparallel
from .bottlenecks.host import sync_sources
from .bottlenecks.memory import memory_findings, report_section, used_fraction
from .bottlenecks.mesh import by_dimension, heaviest, suggest_mesh
from .comm_groups import dim_steps, groups_section, kinds_by_group
from .energy import energy_section
from .throughput import straggler_mfu_gap, throughput_section
from .bottlenecks.pipeline import suggest_pipeline, summarize_pipeline
from .invariants import bound_suggestions, enforce_parts, violations
from .layout import Layout, find_layout, split_bubble
from .ops import ops_section
from .passes import declares
from .prepare import prepare
from .warm_split import whole
from .rank_summary import (analysed_rows, comm_by_kind, comm_by_parts, grad_sync_share,
                           summarize_ranks)
from .routing import routing_section
from .rowgroups import PerRank, count_distinct, same_rows, step_by_rank
from .stragglers import find_minor, find_stragglers
from .stall import late_before, section as stall_section
from .stopped import deaths
from .suggestions import in_order, leading_labels, suggest, unaddressed
from .findings import Findings, typical_step
from ..calibration import calibrated, noise_for
from ..sections import NotRuledOut, ParallelLayout, StragglerFloor, Throughput, load
from .floors import hold_to_findings
from .rerun_noise import widen
from .window import profiled_hint, windowed
from .wait import UNSET, key_waits
from .whatif import micro_steps


@dataclass
class Analysis:
    """What the passes share. Set by `prepare`: table (less empty steps), frame, knobs,
    stopped, missing, mapping, micro, growth; the others by the pass named beside them."""

    table: RunTable
    th: Thresholds
    warnings: list[str]
    own: bool = False  # the table was read for this analysis alone: its memory may be reused
    frame: pd.DataFrame | None = None
    knobs: dict = field(default_factory=dict)
    stopped: list = field(default_factory=list)
    died: list = field(default_factory=list)     # memory: how the run died (stopped.deaths)
    last_steps: dict = field(default_factory=dict)  # prepare: each rank's last recorded step
    missing: list = field(default_factory=list)
    mapping: pd.DataFrame | None = None          # micro-step -> optimizer step (accumulation)
    micro: object = None                         # micro-step statistics (whatif.micro_steps)
    growth: dict = field(default_factory=dict)   # forward growth with the batch
    layout: Layout | None = None                 # add_up
    per_rank: PerRank | None = None              # add_up: medians over the analysed rows
    broken: list[str] = field(default_factory=list)  # add_up: rows clipped to add up
    roles: Roles | None = None                   # classify
    steps: pd.DataFrame | None = None            # classify: one row per step
    verdict: object = None                       # classify, then check
    unseen: str = ""                             # classify: no communication on several ranks
    stragglers: list = field(default_factory=list)  # stragglers
    minor: list = field(default_factory=list)       # stragglers: minor ones (under threshold)
    telemetry: dict = field(default_factory=dict)   # telemetry
    memory: object = None                           # memory: sections.Memory, or None
    throughput: Throughput | None = None  # throughput: the report's section
    energy: object = None                           # energy: the report's section (sections.Energy)
    comm_groups: list = field(default_factory=list)  # suggest: [sections.CommGroup]
    wait_cells: object = UNSET                       # prepare: wait.wait_cells (let go in suggest)
    key_waits: object = None                         # suggest: wait per collective key (wait.py)
    routing: object = None                           # suggest: sections.Routing, or None
    ops: object = None                               # ops: sections.Ops, or None
    labels: set = field(default_factory=set)        # suggest: labels holding material time
    jitter: object = None                           # suggest
    by_kind: dict = field(default_factory=dict)     # suggest: comm per rank and kind
    findings: Findings | None = None                # suggest
    suggestions: list = field(default_factory=list)  # suggest, bound
    pipeline: object = None                         # suggest: pipeline stages
    dp_section: object = None                       # suggest: sections.DataParallel, or None
    why_not: dict = field(default_factory=dict)     # suggest: label -> why no suggestion
    why_not_pipeline: str = ""                      # suggest
    typical: object = None                          # suggest: the report's typical step
    unbound: list[str] = field(default_factory=list)  # bound: estimates held (said on each)
    report: Report | None = None                    # report


@declares("table frame micro",
          "layout frame broken per_rank micro warnings")
def add_up(a: Analysis) -> None:
    """frame -> bubbles split out, rows made to add up; layout, per_rank, broken (and the
    micro-step statistics, where prepare left them: they share the per-rank medians)."""
    a.layout = find_layout(a.table)
    before = a.frame
    a.frame, a.broken = enforce_parts(split_bubble(before, a.layout))
    a.warnings += a.broken
    a.per_rank = PerRank(a.frame)
    if a.micro is None:
        a.micro = micro_steps(before, 0, a.per_rank if a.frame is before else None)


@declares("frame th table",
          "roles steps verdict unseen warnings")
def classify(a: Analysis) -> None:
    """frame -> roles, steps, verdict; a warning when too few steps tell roles, or when no
    communication was seen on several ranks."""
    a.roles = find_roles(a.frame, a.th.wait)
    if count_distinct(a.frame["rank"].to_numpy()) > 1 and not a.roles.decided and (a.frame["wait_ns"] > 0).any():
        a.warnings.append(f"only {a.roles.n_steps} step(s) recorded on every rank: too few to "
                          "tell a consistent straggler from per-step jitter")
    a.steps = classify_steps(a.frame, a.th, a.roles)
    a.verdict = run_verdict(a.steps)
    a.unseen = comm_unseen(a.table, a.frame)
    if a.unseen:
        a.warnings.append(a.unseen)


@declares("table frame steps th roles layout per_rank",
          "stragglers minor")
def stragglers(a: Analysis) -> None:
    """frame, steps, roles, layout -> stragglers."""
    hosts = {r: info.host for r, info in a.table.ranks.items()}
    a.stragglers = find_stragglers(a.frame, a.steps, a.th, a.roles, hosts, a.layout, a.per_rank)
    a.minor = find_minor(a.frame, a.roles, a.stragglers, hosts, a.layout, a.per_rank)


@declares("table frame stragglers mapping",
          "ops stragglers")
def ops(a: Analysis) -> None:
    """table.ops / messages / kernel_breakdown, frame, stragglers -> the ops section; each
    straggler's excess down to the op and kernel."""
    a.ops = ops_section(a.table, a.frame, a.stragglers, a.mapping)


@declares("table stragglers knobs frame",
          "telemetry frame knobs stragglers")
def telemetry(a: Analysis) -> None:
    """The table's NVML samples -> telemetry per rank, joined to the frame; each straggler's
    telemetry evidence; knobs["memory_used_fraction"]."""
    if a.table.telemetry is None or not len(a.table.telemetry):
        return
    from .telemetry import join_steps, memory_used_fraction, straggler_evidence, summarize

    a.telemetry = summarize(a.table.telemetry)
    a.frame = join_steps(a.frame, a.table.telemetry)
    for s in a.stragglers:
        s.telemetry = straggler_evidence(a.telemetry, s.rank)
    used = memory_used_fraction(a.telemetry, a.table.ranks)
    if used is not None:
        a.knobs["memory_used_fraction"] = used


@declares("table frame last_steps stopped knobs",
          "memory died knobs")
def memory(a: Analysis) -> None:
    """table.memory, the ranks' capacity and end records, frame (the analysed steps) -> the
    memory section (series per rank, findings); knobs["memory_used_fraction"] raised to
    the device's measured peak where that is higher (batch-size suggestions need the room)."""
    t = a.table
    crashed = any((i.meta.get("end") or {}).get("crashed") for i in t.ranks.values())
    if (t.memory is None or t.memory.empty) and not crashed:
        return  # nothing measured, no error to look at
    last = a.last_steps  # each rank's last recorded step, the steps few ranks had included
    step_s = float(a.frame["step_ns"].mean()) / 1e9 if len(a.frame) else None
    firsts = a.frame.groupby("rank")["step"].min() if len(a.frame) else None
    found = memory_findings(t.memory, t.ranks, firsts, step_s, last)
    a.memory = report_section(found)
    a.died = deaths(t, a.stopped, a.memory, a.last_steps)
    used = used_fraction(t.memory, t.ranks)
    if used is not None and used > a.knobs.get("memory_used_fraction", 0.0):
        a.knobs["memory_used_fraction"] = used


@declares("frame table mapping knobs layout stragglers",
          "throughput warnings")
def throughput(a: Analysis) -> None:
    """frame (or, with accumulation, the table's micro-steps from the first analysed one),
    knobs, layout, stragglers -> the throughput section; each straggler's MFU gap."""
    micro = a.frame if a.mapping is None else a.table.frame
    firsts, lasts = step_by_rank(a.frame, "min"), None
    if a.mapping is not None:  # a cycle's step is its last micro-step: back to its first
        per = a.knobs.get("sync_interval") or 1
        firsts = {r: s - int(per) + 1 for r, s in firsts.items()}
        lasts = step_by_rank(a.frame, "max")  # not the micro-steps of an unfinished cycle
    cycles = (np.bincount(a.frame["rank"].to_numpy(np.int64)) if a.mapping is not None
              and len(a.frame) else None)  # steps/s in the report's steps: optimizer steps
    section = throughput_section(micro, firsts, a.knobs, a.table, a.layout, cycles, lasts)
    if section.get("mfu_impossible"):
        a.warnings.append(section["mfu_impossible"])
    gaps = straggler_mfu_gap(section, [s.rank for s in a.stragglers])
    if gaps:
        section["straggler_mfu_gap_pct"] = {str(k): v for k, v in gaps.items()}
    a.throughput = load(Throughput, section, "throughput")  # typed once, here (None: no steps)


@declares("frame table knobs",
          "energy")
def energy(a: Analysis) -> None:
    """frame (the analysed steps, wait split), table.telemetry, knobs -> the energy section."""
    a.energy = energy_section(a.frame, a.table.telemetry, a.knobs)


@declares(("verdict steps roles stragglers minor th table frame mapping wait_cells layout "
           "knobs micro growth"),
          ("labels jitter minor by_kind routing key_waits wait_cells comm_groups findings "
           "typical suggestions pipeline dp_section why_not why_not_pipeline warnings"))
def suggest_all(a: Analysis) -> None:
    """Suggestions for the verdict and for every label holding a material share of the time,
    each from its bottleneck's module (bottlenecks/: data, comm, host, imbalance through
    suggestions.py; pipeline stages; DataParallel)."""
    a.labels = {a.verdict.label} | {k for k, v in a.verdict.time_by_label.items() if v >= 0.2}
    a.labels |= secondary_labels(a.steps, 0.2)
    a.jitter = jitter_cost(a.steps)
    if a.roles is not None and a.jitter.wait_share > 0:
        named = {s.rank for s in a.stragglers} | ({a.roles.probable[0]} if a.roles.probable
                                                  else set())
        late = intermittent(a.roles, a.steps, a.th.wait, named)
        if late is not None:
            a.jitter = replace(a.jitter, intermittent=late)
            # one statement of a rank's lateness: its bursts, not also a minor straggler
            a.minor = [m for m in a.minor if m.rank != late["rank"]]
    hit = analysed_rows(a.table.comm, a.frame, a.mapping)  # the collectives' analysed rows
    (exposed, a.by_kind), (g_exposed, g_comm) = comm_by_parts(
        a.table, a.frame, a.mapping, ("exposed_ns", "comm_ns"), hit=hit)
    a.routing = routing_section(a.table.routing, a.frame, a.mapping)
    a.key_waits = key_waits(a.table.comm, a.wait_cells)
    a.wait_cells = UNSET
    # the waits' rows are the collectives' own where each row is a cell: the same analysed rows
    same = hit is not None and same_rows(a.key_waits, a.table.comm)
    g_wait = (comm_by_kind(replace(a.table, comm=a.key_waits), a.frame, a.mapping,
                           ("wait_ns",), 1, hit=hit if same else None)[0]
              if a.key_waits is not None else None)
    a.comm_groups = groups_section(a.table, g_comm, g_exposed, kinds_by_group(a.table),
                                   a.layout, g_wait)
    dims = a.table.mesh_dims()
    if dims and not any(g.dim for g in a.comm_groups) and a.frame["comm_ns"].any():
        a.warnings.append(
            f"the run names mesh dimensions ({', '.join(sorted(set(dims.values())))}) but its "
            "collectives carry no process group (CPU / gloo traces do not name one): "
            "communication is not split by dimension")
    kinds = {k for per_rank in exposed.values() for k in per_rank}
    a.findings = Findings(a.frame, a.labels, a.th, a.knobs, a.stragglers, a.roles.early,
                          share_of_time(a.steps, "data_share"), a.jitter,
                          {k: float(np.mean([r.get(k, 0.0) for r in exposed.values()]))
                           for k in kinds}, a.micro, a.growth, a.routing,
                          grad_sync_share(a.table, a.frame, a.mapping, hit),
                          sync_sources(a.table.ranks.values()))
    a.typical = typical_step(a.frame)
    made, a.why_not = suggest(a.findings, a.typical)
    a.suggestions = list(made)
    a.suggestions += suggest_mesh(a.comm_groups, a.typical.step, a.th.comm)
    a.pipeline = summarize_pipeline(a.table, a.frame, a.layout, exposed)
    a.dp_section, more, dp_warnings = dataparallel(a.table, lambda: a.typical.step,
                                                   a.verdict.label)
    a.warnings += dp_warnings
    a.suggestions += more
    if PIPELINE in a.labels:
        more, a.why_not_pipeline = suggest_pipeline(a.pipeline, a.table, a.typical.step)
        a.suggestions += more
    if UNEXPLAINED in a.labels:
        a.why_not[UNEXPLAINED] = unexplained_why(a.table, a.frame, a.steps)


@declares(("suggestions typical frame knobs stragglers labels verdict steps why_not "
           "why_not_pipeline table mapping warnings"),
          "suggestions unbound warnings")
def bound(a: Analysis) -> None:
    """suggestions -> held to what each can recover (a warning for those that could not be),
    the verdict's fix first (or the fixes of the labels in a near tie with it) and then by gain
    (suggestions.in_order); a warning when the verdict has no fix."""
    # what `gpuscope try` measured on this host corrects the models' estimates (calibration.py)
    hosts = {i.host for i in a.table.ranks.values()}
    ordered = calibrated(a.suggestions, hosts, a.typical.step / MS, knobs=a.knobs)
    ordered = sorted(ordered, key=lambda s: -s.gain_pct)
    ordered, a.unbound = bound_suggestions(ordered, a.typical, a.frame, a.knobs)  # said on each
    shares = None
    comm = a.table.comm
    if a.stragglers and comm is not None and any(s.knob == "sync_frequency" for s in ordered):
        ranks = comm["rank"].to_numpy()  # each straggler's own rows (10 M rows at 10k ranks)
        shares = {s.rank: grad_sync_share(replace(a.table, comm=comm.iloc[
            np.flatnonzero(ranks == s.rank)]), a.frame, a.mapping) for s in a.stragglers}
    ordered, notes, held = hold_to_findings(ordered, a.frame, a.stragglers, a.typical,
                                            a.knobs, a.labels, shares)
    a.unbound += notes
    ordered = in_order(ordered, leading_labels(a.verdict), held)
    a.suggestions = widen(ordered,
                          a.steps["step_ns"].to_numpy() if len(a.steps) else [], a.knobs,
                          noise_for(hosts))
    label = a.verdict.label
    if label == PIPELINE and a.why_not_pipeline and not any(
            s.addresses == PIPELINE for s in a.suggestions):
        a.warnings.append(f"no suggestion for {PIPELINE}: {a.why_not_pipeline}")
    elif label == UNEXPLAINED:
        a.warnings.append(a.why_not[UNEXPLAINED])
    elif label != COMPUTE:
        why = unaddressed(a.why_not, label, a.suggestions)
        if why:
            a.warnings.append(why)
    if len(a.table.ranks) == 1 and a.table.world_size > 1:
        a.warnings.append("only one rank's data: waiting for other ranks cannot be told apart "
                          "from transfer, so imbalance is not detected")


@declares(("table frame telemetry by_kind per_rank layout comm_groups typical th verdict "
           "steps stragglers suggestions jitter knobs warnings roles pipeline dp_section "
           "stopped missing memory throughput energy routing ops died mapping key_waits "
           "minor"),
          "report")
def report(a: Analysis) -> None:
    """Everything found -> the Report (per-rank summaries over the analysed rows)."""
    t = a.table
    analysed = replace(t, frame=a.frame)
    ranks = summarize_ranks(t, a.frame, a.telemetry, a.by_kind, a.per_rank)
    layout = a.layout
    layout_d = layout.to_dict() if layout.groups or layout.pipelined else {}
    dims = by_dimension(a.comm_groups)
    if dims:  # which mesh dimension holds the step back (None: none holds COMM of the step)
        top = heaviest(a.comm_groups, a.typical.step / 1e6, a.th.comm)
        layout_d["mesh"] = {"by_dim": {k: {**{f: round(v[f], 3) for f in
                                              ("exposed_ms", "comm_ms", "wait_ms", "transfer_ms")
                                              if f in v}, "kinds": v["kinds"]}
                                       for k, v in dims.items()},
                            "holds_back": top[0] if top else None}
    a.report = Report(
        t.source, t.path, int(t.world_size), a.verdict, step_results(a.steps), ranks,
        a.stragglers, a.suggestions, a.th, jitter=a.jitter, knobs=a.knobs,
        warnings=a.warnings, early_ranks=sorted(a.roles.early),
        layout=load(ParallelLayout, layout_d, "layout"),  # typed once, here (None: none)
        pipeline=a.pipeline, dataparallel=a.dp_section, stopped_ranks=a.stopped,
        missing_ranks=a.missing, memory=a.memory, throughput=a.throughput, energy=a.energy,
        comm_by_group=a.comm_groups, routing=a.routing, ops=a.ops, died=a.died, table=analysed,
        comm_by_dim_steps=dim_steps(t, a.frame, a.mapping, a.key_waits),
        minor_stragglers=a.minor, not_ruled_out=not_ruled_out(a),
        straggler_floor=straggler_floor(a))
    a.report.stall = stall_section(t, a.report)
    hung = set(a.report.stall.ranks or ()) if a.report.stall is not None else set()
    killed = {d.rank for d in a.report.died if d.cause == "killed"}
    if hung and hung <= killed and {d.rank for d in a.report.died} <= hung:
        a.report.died = []  # the hung job killed at once: the stall says what happened
    if a.report.died:  # the rank that died first: was it late before?
        d = a.report.died[0]
        before = late_before(a.report, d.rank, "died").text
        a.report.died[0] = msgspec.structs.replace(d, late_before=before,
                                                   text=f"{d.text}; {before}")


def not_ruled_out(a: Analysis) -> NotRuledOut | None:
    """The rank these steps leave room to be a straggler though no test named one
    (consistency.Roles.unruled), where nobody is named late at all; None otherwise."""
    u = a.roles.unruled if a.roles is not None else None
    if u is None or a.stragglers or a.minor:
        return None
    rank, late, upper, bound = u
    return NotRuledOut(rank=rank, late_ms=round(late / 1e6, 3), up_to_ms=round(upper / 1e6, 3),
                       material_ms=round(bound / 1e6, 3), steps=int(a.roles.n_steps))


def straggler_floor(a: Analysis) -> StragglerFloor | None:
    """What the steps can see, where no rank is named late (consistency.Roles.floor_ns)."""
    r = a.roles
    if r is None or not r.floor_ns or a.stragglers or a.minor or not r.typical_ns:
        return None
    return StragglerFloor(up_to_ms=round(r.floor_ns / 1e6, 3),
                          pct=round(100 * r.floor_ns / r.typical_ns, 1), steps=int(r.n_steps))


@declares("report table per_rank steps unseen broken stragglers minor roles verdict th warnings",
          "warnings report")
def check(a: Analysis) -> None:
    """The report against its own arithmetic (a bug if anything fails: said, and it costs
    confidence), then the verdict's confidence earned by the evidence."""
    wrong = violations(a.report)
    a.warnings += [f"did not add up: {w}" for w in wrong]
    t = a.table
    with_rows = len(a.per_rank.groups.keys) if a.per_rank is not None else 0  # with steps
    evidence = Evidence(steps=len(a.steps), ranks=with_rows, world=int(t.world_size),
                        step_markers=all(i.meta.get("step_markers", True)
                                         for i in t.ranks.values()),
                        comm_seen=not a.unseen, clocks_aligned=clocks_aligned(t),
                        stragglers=bool(a.stragglers), minor=bool(a.minor),
                        broken_rules=len(a.broken) + len(wrong),
                        leaning=a.roles.probable if a.roles is not None else None,
                        leaning_of=a.roles.n_steps if a.roles is not None else 0,
                        unruled=a.roles.unruled if a.roles is not None else None,
                        host_comm_share=max((float(i.meta.get("host_comm_share") or 0.0)
                                             for i in t.ranks.values()), default=0.0))
    a.report.verdict = earn(a.verdict, evidence, a.steps, a.th)


#: the analysis, in order
PASSES: tuple[Callable[[Analysis], None], ...] = (
    prepare, add_up, classify, stragglers, ops, telemetry, memory, throughput, energy, suggest_all,
    bound, report, check)


def analyze_table(table: RunTable, thresholds: Thresholds | None = None,
                  skip: int | None = None, passes=PASSES, own: bool = False,
                  steps=None) -> Report:
    """Analyse one RunTable. `skip`: warm-up steps (optimizer steps, when the run accumulates
    gradients) to leave out per rank (default: the thresholds' warmup_steps, else 1 for
    recorded runs and 0 for profiler traces; 0 when `steps` names them). `own`: the table was
    read for this call and is used by nothing else afterwards; its frame's memory may then be
    reused (the table's frame is not the one read). `steps`: the steps to read (window.py:
    [(first, last), ...], or "profiled": those a torch.profiler captured beside a recording)."""
    th = thresholds or Thresholds()
    warnings = list(table.warnings)
    if steps is not None:
        table = windowed(whole(table), steps, warnings)
        if skip is None:
            skip = 0
    else:
        warnings += profiled_hint(table)
    if skip is not None:
        th = th.with_overrides({"warmup_steps": skip})
    a = Analysis(table, th.for_source(table.source), warnings, own=own and steps is None)
    for p in passes:
        p(a)
    return a.report


def warm_steps(th: Thresholds, skip: int | None, steps) -> int:
    """The warm-up rows per rank an analysis of a recorded run leaves out (what its reader may
    set apart as it reads: RunTable.warm); 0 when it reads a window of steps."""
    if steps is not None:
        return 0
    return max(int(skip if skip is not None else th.for_source("record").warmup_steps or 0), 0)


def comm_unseen(table: RunTable, frame: pd.DataFrame) -> str:
    """A warning when a multi-rank run shows no communication at all ("" otherwise)."""
    if table.world_size < 2 or frame["comm_ns"].any() or frame["n_comm"].any():
        return ""
    if table.source == "kineto":
        return (f"{table.world_size} ranks, but the traces hold no collective (no NCCL kernel, "
                "no gloo / nccl range): waiting and transfer cannot be told from compute, so the "
                "verdict may be wrong; profile with record_shapes off but CPU and CUDA activities "
                "on, on every rank")
    return (f"{table.world_size} ranks, but no communication was timed: pass the DDP or FSDP "
            "model itself as record(model=...), not the module inside it, or mark your own "
            "collectives with rec.phase('comm'); until then waiting and transfer count as "
            "compute and the verdict may be wrong")


def unexplained_why(table: RunTable, frame: pd.DataFrame, steps: pd.DataFrame) -> str:
    """What the unexplained steps are made of, as far as the input says, and what would explain
    the rest."""
    mine = steps[steps["label"] == UNEXPLAINED]
    other = share_of_time(mine, "other_share")
    held = float(mine["step_ns"].sum()) / max(float(steps["step_ns"].sum()), 1.0)
    head = (f"unexplained: in {len(mine)} step(s) holding {held:.0%} of the time, {other:.0%} of "
            "the step is time gpuscope cannot attribute (no op, data wait or collective seen in "
            "it), more than compute; ")
    rows = frame[frame["step"].isin(mine["step"])]
    if table.source == "record":
        between = (float(rows["between_ns"].sum()) / max(float(rows["step_ns"].sum()), 1.0)
                   if "between_ns" in rows and rows["between_ns"].notna().all() else None)
        timed = "forward_ns" in rows and bool(rows["forward_ns"].any())
        where = (f"{between:.0%} of the step is the loop's own work between rec.step() and the "
                 "next step (logging, checkpoints, a profiler writing its trace, evaluation); "
                 f"{rest_of_other(timed)}: " if between is not None else "")
        return head + where + ("time the loop's own work with rec.phase('name') to see what "
                               "it is")
    if any(i.meta.get("gpu_not_recorded") for i in table.ranks.values()):
        return head + ("the trace holds CUDA launches but no GPU event: the GPU's activity was "
                       "not recorded, so what the host ran is not counted as compute; profile "
                       "with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    if frame.get("host_ns") is not None and frame["host_ns"].any():
        return head + ("the GPU sat idle with no kernel queued and no host op gpuscope "
                       "recognises: profile with with_stack=True, or mark your own code with "
                       "torch.profiler.record_function, to see what the host did")
    return head + ("the training thread ran no op in it (Python between ops, sleeping, or waiting "
                   "for a core): profile with with_stack=True, or mark your own code with "
                   "torch.profiler.record_function, to see what it did")


def secondary_labels(steps: pd.DataFrame, min_share: float) -> set[str]:
    """Labels that steps holding at least `min_share` of the step time have as secondary."""
    total = float(steps["step_ns"].sum()) or 1.0
    time: dict[str, float] = {}
    for ns, sec in zip(steps["step_ns"].tolist(), steps["secondary"].tolist()):
        for label in sec:
            if label in LABELS:
                time[label] = time.get(label, 0.0) + ns
    return {k for k, v in time.items() if v / total >= min_share}


def clocks_aligned(table: RunTable) -> bool:
    """False when ranks sit on several hosts and no clock offset between them could be found
    (traces; recorded runs carry unix time from each host's synchronized clock)."""
    hosts = {i.host for i in table.ranks.values() if i.host}
    if len(hosts) < 2 or table.source != "kineto":
        return True
    return any("clock_offset_ns" in i.meta for i in table.ranks.values())
