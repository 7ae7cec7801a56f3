"""The analysis: RunTable -> warm-up dropped -> wait split -> step labels -> stragglers ->
telemetry -> suggestions -> Report."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import InputError
from ..report import RankResult, Report
from ..runtable import RunTable
from ..thresholds import Thresholds
from ..vocab import PARTS
from .classify import classify_steps, jitter_cost, run_verdict, step_results
from .consistency import find_roles
from .groups import Groups
from .stragglers import find_stragglers
from .suggest import Findings, suggest
from .wait import estimate_wait


def drop_warmup(frame: pd.DataFrame, n: int, warnings: list[str]) -> pd.DataFrame:
    """Leave out the first `n` steps of each rank (all of them kept, with a warning, when that
    would leave nothing)."""
    if n <= 0 or frame.empty:
        return frame
    first = frame.groupby("rank")["step"].transform("min")
    kept = frame[frame["step"] >= first + n]
    if kept.empty:
        warnings.append(f"only {frame['step'].nunique()} step(s): warm-up steps kept in the analysis")
        return frame
    return kept


def summarize_ranks(table: RunTable, frame: pd.DataFrame, telemetry: dict) -> list[RankResult]:
    """Per rank: median ns of each part and its share of the rank's summed step time in %."""
    g = Groups(frame["rank"].to_numpy())
    med = {p: g.median(frame[f"{p}_ns"].to_numpy()).tolist() for p in ("step",) + PARTS}
    step_total = np.maximum(g.sum(frame["step_ns"].to_numpy()), 1.0)
    pct = {p: (100 * g.sum(frame[f"{p}_ns"].to_numpy()) / step_total).tolist() for p in PARTS}
    out = []
    for i, rank in enumerate(g.keys.tolist()):
        info = table.ranks.get(rank)
        out.append(RankResult(
            rank, info.host if info else "", int(g.counts[i]), med["step"][i],
            *(med[p][i] for p in PARTS), *(pct[p][i] for p in PARTS),
            telemetry=telemetry.get(rank), gpu_breakdown=table.gpu_breakdown.get(rank)))
    return out


def analyze_table(table: RunTable, thresholds: Thresholds | None = None,
                  skip: int | None = None) -> Report:
    """Analyse one RunTable. `skip`: warm-up steps to leave out per rank (default: the
    thresholds' warmup_steps, else 1 for recorded runs and 0 for profiler traces)."""
    th = thresholds or Thresholds()
    if skip is not None:
        th = th.with_overrides({"warmup_steps": skip})
    th = th.for_source(table.source)
    warnings = list(table.warnings)
    frame = table.frame
    if frame.empty:
        raise InputError(f"{table.path}: no steps to analyse (the run recorded none)")
    frame = drop_warmup(frame, th.warmup_steps, warnings)
    if table.source == "record":  # Kineto tables come with waits from matched collectives
        frame = estimate_wait(frame, warnings)
    roles = find_roles(frame, th.wait)
    if frame["rank"].nunique() > 1 and not roles.decided and (frame["wait_ns"] > 0).any():
        warnings.append(f"only {roles.n_steps} step(s) recorded on every rank: too few to tell a "
                        "consistent straggler from per-step jitter")
    steps = classify_steps(frame, th, roles)
    verdict = run_verdict(steps)
    hosts = {r: info.host for r, info in table.ranks.items()}
    stragglers = find_stragglers(frame, steps, th, roles, hosts)
    knobs = table.knobs()
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
    jitter = jitter_cost(steps)
    suggestions = suggest(Findings(frame, labels, th, knobs, stragglers, roles.early,
                                   float(steps["data_share"].median()), jitter))
    if len(table.ranks) == 1 and table.world_size > 1:
        warnings.append("only one rank's data: waiting for other ranks cannot be told apart from "
                        "transfer, so imbalance is not detected")
    analysed = RunTable(frame, table.source, table.path, table.ranks, table.world_size,
                        table.warnings, table.telemetry, table.gpu_breakdown)
    return Report(table.source, table.path, int(table.world_size), verdict, step_results(steps),
                  summarize_ranks(table, frame, telemetry), stragglers, suggestions, th,
                  jitter=jitter, knobs=knobs, warnings=warnings,
                  early_ranks=sorted(roles.early), table=analysed)
