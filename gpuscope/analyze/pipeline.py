"""The analysis: RunTable -> sync cycles -> warm-up dropped -> wait split -> every row made to
add up -> step labels -> stragglers -> telemetry -> suggestions (held to what they can recover)
-> Report, checked, its confidence earned by the evidence."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import InputError
from ..report import Report
from ..results import RankResult
from ..runtable import RunTable, key_parts
from ..thresholds import Thresholds
from ..vocab import COMPUTE, COMPUTE_PHASES, LABELS, PARTS, PIPELINE
from .classify import classify_steps, jitter_cost, run_verdict, step_results
from .confidence import Evidence, earn
from .consistency import find_roles
from .cycles import cycle_ends, group_cycles, sync_interval
from .whatif import batch_growth, micro_steps
from .dataparallel import dataparallel
from .rowgroups import PerRank, find_pairs, rank_position
from .invariants import bound_suggestions, enforce_parts, violations
from .layout import find_layout, split_bubble
from .stages import suggest_pipeline, summarize_pipeline
from .stopped import stopped_ranks, stopped_warnings
from .stragglers import find_stragglers
from .suggest import Findings, suggest, typical_step, unaddressed
from .wait import estimate_wait


def drop_warmup(frame: pd.DataFrame, n: int, warnings: list[str]) -> pd.DataFrame:
    """Leave out the first `n` steps of each rank (all of them kept, with a warning, when that
    would leave nothing)."""
    if n <= 0 or frame.empty:
        return frame
    kept = frame[rank_position(frame) >= n]
    if kept.empty:
        warnings.append(f"only {frame['step'].nunique()} step(s): warm-up steps kept in the analysis")
        return frame
    return kept


def _growth(frame: pd.DataFrame, knobs: dict, warmup: int) -> dict:
    """{m: how forward grows for m x the batch}, where the run had batches of another size."""
    bs = knobs.get("batch_size")
    if not isinstance(bs, int) or "samples" not in frame:
        return {}
    return {m: g for m in (2, 4) if (g := batch_growth(frame, bs, m, warmup)) is not None}


def to_cycles(frame: pd.DataFrame, ends, warnings: list[str]):
    """Micro-steps summed into optimizer steps; returns (frame, micro-step -> cycle map)."""
    cycles, mapping = group_cycles(frame, ends)
    last = cycles.groupby("rank")["step"].transform("max") == cycles["step"]
    partial = last & (cycles["micro_steps"] < sync_interval(cycles))
    if partial.any() and (~partial).any():
        warnings.append(f"the last {int(cycles.loc[partial, 'micro_steps'].max())} micro-step(s) "
                        "did not complete an optimizer step and are left out")
        cycles = cycles[~partial].reset_index(drop=True)
    return cycles, mapping


def comm_by_kind(table: RunTable, frame: pd.DataFrame, mapping,
                 columns: tuple[str, ...] = ("comm_ns",)) -> list[dict[int, dict]]:
    """For each column: per rank, {kind: mean ns per analysed step} of the timed collectives
    (their time, comm_ns, or the part the step was blocked on, exposed_ns). In numpy: the table
    has a row per rank, step and collective, up to millions."""
    comm = table.comm
    if comm is None or comm.empty:
        return [{} for _ in columns]
    kinds = key_parts(comm)[0]
    r = comm["rank"].to_numpy(np.int64)
    s = comm["step"].to_numpy(np.int64)
    code = np.asarray(kinds.codes, np.int64)
    sel = np.ones(len(comm), dtype=bool)
    if mapping is not None:  # micro-steps -> the optimizer step (cycle) they belong to
        sel, at = find_pairs(mapping["rank"].to_numpy(np.int64),
                             mapping["step"].to_numpy(np.int64), r, s)
        r, code = r[sel], code[sel]
        s = mapping["cycle_step"].to_numpy(np.int64)[at[sel]]
    fr = frame["rank"].to_numpy(np.int64)
    hit, _ = find_pairs(fr, frame["step"].to_numpy(np.int64), r, s)  # analysed steps only
    hit &= code >= 0
    if not hit.any():
        return [{} for _ in columns]
    n_kinds = len(kinds.categories)
    cell = r[hit] * n_kinds + code[hit]
    seen = np.flatnonzero(np.bincount(cell))
    n_steps = np.bincount(fr)
    names = [str(k) for k in kinds.categories]
    outs = []
    for column in columns:
        total = np.bincount(cell, comm[column].to_numpy(np.float64)[sel][hit])
        out: dict[int, dict] = {}
        for c in seen.tolist():
            rank, k = divmod(c, n_kinds)
            out.setdefault(rank, {})[names[k]] = float(total[c]) / int(n_steps[rank])
        outs.append(out)
    return outs


def summarize_ranks(table: RunTable, frame: pd.DataFrame, telemetry: dict,
                    by_kind: dict, per_rank: PerRank | None = None) -> list[RankResult]:
    """Per rank: median ns of each part, its share of the rank's summed step time in %, and
    the mean step; the compute phases, collectives by kind and the breakdown of "other"
    where known. `per_rank`: medians already known for these rows."""
    per_rank = per_rank or PerRank(frame)
    g = per_rank.groups
    med = {p: per_rank.median(f"{p}_ns").tolist() for p in ("step",) + PARTS}
    step_total = np.maximum(g.sum(frame["step_ns"].to_numpy()), 1.0)
    share = lambda col: (100 * g.sum(frame[col].to_numpy()) / step_total).tolist()  # noqa: E731
    pct = {p: share(f"{p}_ns") for p in PARTS}
    mean_step = (step_total / g.counts).tolist()
    phases = [p for p in COMPUTE_PHASES if f"{p}_ns" in frame and frame[f"{p}_ns"].any()]
    phase_med = {p: per_rank.median(f"{p}_ns").tolist() for p in phases}
    phase_pct = {p: share(f"{p}_ns") for p in phases}
    between = (share("between_ns") if table.source == "record" and "between_ns" in frame
               and frame["between_ns"].notna().all() else None)
    host = share("host_ns") if "host_ns" in frame and frame["host_ns"].any() else None
    has_bubble = "bubble_ns" in frame and frame["bubble_ns"].any()
    bubble_med = per_rank.median("bubble_ns").tolist() if has_bubble else None
    bubble_pct = share("bubble_ns") if has_bubble else None
    out = []
    for i, rank in enumerate(g.keys.tolist()):
        info = table.ranks.get(rank)
        out.append(RankResult(
            rank, info.host if info else "", int(g.counts[i]), med["step"][i],
            *(med[p][i] for p in PARTS), *(pct[p][i] for p in PARTS),
            telemetry=telemetry.get(rank), gpu_breakdown=table.gpu_breakdown.get(rank),
            step_mean_ns=mean_step[i], phases_ns={p: phase_med[p][i] for p in phases},
            phases_pct={p: phase_pct[p][i] for p in phases},
            comm_by_kind=by_kind.get(rank, {}),
            between_pct=between[i] if between is not None else None,
            host_pct=host[i] if host is not None else None,
            bubble_ns=bubble_med[i] if has_bubble else 0.0,
            bubble_pct=bubble_pct[i] if has_bubble else 0.0))
    return out


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


def secondary_labels(steps: pd.DataFrame, min_share: float) -> set[str]:
    """Labels that steps holding at least `min_share` of the step time have as secondary."""
    total = float(steps["step_ns"].sum()) or 1.0
    time: dict[str, float] = {}
    for ns, sec in zip(steps["step_ns"].tolist(), steps["secondary"].tolist()):
        for label in sec:
            if label in LABELS:
                time[label] = time.get(label, 0.0) + ns
    return {k for k, v in time.items() if v / total >= min_share}


def analyze_table(table: RunTable, thresholds: Thresholds | None = None,
                  skip: int | None = None) -> Report:
    """Analyse one RunTable. `skip`: warm-up steps (optimizer steps, when the run accumulates
    gradients) to leave out per rank (default: the thresholds' warmup_steps, else 1 for
    recorded runs and 0 for profiler traces)."""
    th = thresholds or Thresholds()
    if skip is not None:
        th = th.with_overrides({"warmup_steps": skip})
    th = th.for_source(table.source)
    warnings = list(table.warnings)
    frame = table.frame
    if frame.empty:
        raise InputError(f"{table.path}: no steps to analyse (the run recorded none)")
    empty = frame["step_ns"].to_numpy() <= 0
    if empty.any():  # nothing in them adds up to anything: said, and left out
        warnings.append(f"{int(empty.sum())} step(s) of no length (a cut trace, a damaged row) "
                        "left out")
        frame = frame[~empty].reset_index(drop=True)
        if frame.empty:
            raise InputError(f"{table.path}: no steps to analyse (every step has no length)")
        table = RunTable(frame, table.source, table.path, table.ranks, table.world_size,
                         table.warnings, table.telemetry, table.gpu_breakdown, table.comm)
    knobs = table.knobs()
    stopped, missing = stopped_ranks(table)
    warnings += stopped_warnings(stopped)
    ends = cycle_ends(frame)
    mapping = None
    if ends is not None:  # accumulation: waits per micro-step, then optimizer steps
        frame = estimate_wait(frame, warnings, table.comm)
        micro = micro_steps(frame, max(th.warmup_steps, 1))
        growth = _growth(frame, knobs, max(th.warmup_steps, 1))
        frame, mapping = to_cycles(frame, ends, warnings)
        frame = drop_warmup(frame, th.warmup_steps, warnings)
    else:
        frame = drop_warmup(frame, th.warmup_steps, warnings)
        frame = estimate_wait(frame, warnings, table.comm)
        micro = None  # below: it shares the per-rank medians when the rows are the same
        growth = _growth(frame, knobs, 0)
    layout = find_layout(table)
    before = frame
    frame, broken = enforce_parts(split_bubble(frame, layout))  # every row adds up
    warnings += broken
    per_rank = PerRank(frame)  # medians over the analysed rows, computed once
    if micro is None:
        micro = micro_steps(before, 0, per_rank if frame is before else None)
    if mapping is not None:
        knobs["sync_interval"] = sync_interval(frame)
    roles = find_roles(frame, th.wait)
    if frame["rank"].nunique() > 1 and not roles.decided and (frame["wait_ns"] > 0).any():
        warnings.append(f"only {roles.n_steps} step(s) recorded on every rank: too few to tell a "
                        "consistent straggler from per-step jitter")
    steps = classify_steps(frame, th, roles)
    verdict = run_verdict(steps)
    unseen = comm_unseen(table, frame)
    if unseen:
        warnings.append(unseen)
    hosts = {r: info.host for r, info in table.ranks.items()}
    stragglers = find_stragglers(frame, steps, th, roles, hosts, layout, per_rank)
    telemetry: dict = {}
    if table.telemetry is not None and len(table.telemetry):
        from .telemetry import join_steps, memory_used_fraction, straggler_evidence, summarize

        telemetry = summarize(table.telemetry)
        frame = join_steps(frame, table.telemetry)
        for s in stragglers:
            s.telemetry = straggler_evidence(telemetry, s.rank)
        used = memory_used_fraction(telemetry, table.ranks)
        if used is not None:
            knobs["memory_used_fraction"] = used
    # suggestions for the verdict and for any label holding a material share of the time
    labels = {verdict.label} | {k for k, v in verdict.time_by_label.items() if v >= 0.2}
    labels |= secondary_labels(steps, 0.2)
    jitter = jitter_cost(steps)
    exposed, by_kind = comm_by_kind(table, frame, mapping, ("exposed_ns", "comm_ns"))
    kinds = {k for per_rank in exposed.values() for k in per_rank}
    found = Findings(frame, labels, th, knobs, stragglers, roles.early,
                     float(steps["data_share"].median()), jitter,
                     {k: float(np.mean([r.get(k, 0.0) for r in exposed.values()])) for k in kinds},
                     micro, growth)
    suggestions = suggest(found)
    pipeline = summarize_pipeline(table, frame, layout, exposed)
    typical = typical_step(frame)
    dp_section, dp_suggestions, dp_warnings = dataparallel(
        table, lambda: typical.step, verdict.label)
    warnings += dp_warnings
    suggestions = sorted(suggestions + dp_suggestions, key=lambda s: -s.gain_pct)
    why_not_pipeline = ""
    if PIPELINE in labels:
        more, why_not_pipeline = suggest_pipeline(pipeline, table, typical.step)
        suggestions = sorted(suggestions + more, key=lambda s: -s.gain_pct)
    suggestions, unbound = bound_suggestions(suggestions, typical, frame)  # held to what they
    warnings += unbound                                                     # can recover
    # what fixes the verdict first, then by gain: the top suggestion is about the main bottleneck
    suggestions = sorted(suggestions, key=lambda s: (s.addresses != verdict.label, -s.gain_pct))
    if verdict.label == PIPELINE and why_not_pipeline and not any(
            s.addresses == PIPELINE for s in suggestions):
        warnings.append(f"no suggestion for {PIPELINE}: {why_not_pipeline}")
    elif verdict.label != COMPUTE:
        why = unaddressed(found, verdict.label, suggestions)
        if why:
            warnings.append(why)
    if len(table.ranks) == 1 and table.world_size > 1:
        warnings.append("only one rank's data: waiting for other ranks cannot be told apart from "
                        "transfer, so imbalance is not detected")
    analysed = RunTable(frame, table.source, table.path, table.ranks, table.world_size,
                        table.warnings, table.telemetry, table.gpu_breakdown, table.comm)
    ranks = summarize_ranks(table, frame, telemetry, by_kind,
                            per_rank)  # the telemetry join only added columns
    report = Report(table.source, table.path, int(table.world_size), verdict,
                    step_results(steps), ranks, stragglers, suggestions, th, jitter=jitter,
                    knobs=knobs, warnings=warnings, early_ranks=sorted(roles.early),
                    layout=layout.to_dict() if layout.groups or layout.pipelined else {},
                    pipeline=pipeline, dataparallel=dp_section, stopped_ranks=stopped,
                    missing_ranks=missing, table=analysed)
    wrong = violations(report)  # a bug if any: said, and it costs confidence
    warnings += [f"did not add up: {w}" for w in wrong]
    evidence = Evidence(steps=len(steps), ranks=len(table.ranks), world=int(table.world_size),
                        step_markers=all(i.meta.get("step_markers", True)
                                         for i in table.ranks.values()),
                        comm_seen=not unseen, clocks_aligned=clocks_aligned(table),
                        stragglers=bool(stragglers),
                        broken_rules=len(broken) + len(unbound) + len(wrong))
    report.verdict = earn(verdict, evidence, steps, th)
    return report


def clocks_aligned(table: RunTable) -> bool:
    """False when ranks sit on several hosts and no clock offset between them could be found
    (traces; recorded runs carry unix time from each host's synchronized clock)."""
    hosts = {i.host for i in table.ranks.values() if i.host}
    if len(hosts) < 2 or table.source != "kineto":
        return True
    return any("clock_offset_ns" in i.meta for i in table.ranks.values())
