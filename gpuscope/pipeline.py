"""The analysis pipeline: path -> RunTable -> wait split -> step labels -> stragglers -> suggestions."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from .classify import classify_steps, jitter_cost, run_verdict
from .consistency import find_roles
from .groups import Groups
from .errors import InputError
from .read_record import is_run_dir, read_run_dir
from .report import Report
from .runtable import RunTable
from .stragglers import find_stragglers
from .suggest import suggest
from .thresholds import Thresholds
from .wait import estimate_wait

PARTS = ("data", "compute", "comm", "comm_exposed", "wait", "other")


def load_table(path) -> RunTable:
    """Read a gpuscope run dir, or a torch.profiler trace folder or file (detected)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")
    if is_run_dir(path):
        return read_run_dir(path)
    from .kineto.detect import find_trace_files
    from .kineto.reader import read_kineto

    files = find_trace_files(path)
    if files:
        return read_kineto(path, files)
    raise InputError(f"{path}: neither a gpuscope run dir (rank-*.gpuscope.jsonl) nor torch.profiler "
                     "traces (*.pt.trace.json[.gz] / *.json[.gz])")


def _drop_warmup(frame: pd.DataFrame, n: int, warnings: list[str]) -> pd.DataFrame:
    if n <= 0 or frame.empty:
        return frame
    first = frame.groupby("rank")["step"].transform("min")
    kept = frame[frame["step"] >= first + n]
    if kept.empty:
        warnings.append(f"only {frame['step'].nunique()} step(s): warm-up steps kept in the analysis")
        return frame
    return kept


def summarize_ranks(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per rank: median ns of each part and its share of the summed step time in %."""
    g = Groups(frame["rank"].to_numpy())
    out = {"rank": g.keys}
    for c in [f"{p}_ns" for p in ("step",) + PARTS]:
        out[c] = g.median(frame[c].to_numpy())
    step_total = np.maximum(g.sum(frame["step_ns"].to_numpy()), 1.0)
    for p in PARTS:
        out[f"{p}_pct"] = 100 * g.sum(frame[f"{p}_ns"].to_numpy()) / step_total
    out["steps"] = g.counts
    return pd.DataFrame(out)


def analyze_table(table: RunTable, thresholds: Thresholds | None = None) -> Report:
    th = thresholds or Thresholds()
    warnings = list(table.warnings)
    frame = table.frame
    if frame.empty:
        raise InputError(f"{table.path}: no steps to analyse (the run recorded none)")
    if table.source == "record":  # a profiler schedule already skips warm-up; records do not
        frame = _drop_warmup(frame, th.warmup_steps, warnings)
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
    extras = dict(table.extras)
    tel = extras.get("telemetry")
    if tel is not None and len(tel):
        from .telemetry import join_steps, memory_used_fraction, straggler_evidence, summarize

        summary = summarize(tel)
        extras["telemetry_summary"] = summary
        frame = join_steps(frame, tel)
        for s in stragglers:
            s.extra["telemetry"] = straggler_evidence(summary, s.rank)
        used = memory_used_fraction(summary, table.ranks)
        if used is not None:
            knobs["memory_used_fraction"] = used
    # suggestions for the verdict and for any label holding a material share of the time
    labels = {verdict.label} | {k for k, v in verdict.time_by_label.items() if v >= 0.2}
    data_share = float(steps["data_share"].median())
    jitter = jitter_cost(steps)
    suggestions = suggest(frame, labels, stragglers, knobs, th, data_share, roles.early, jitter)
    if len(table.ranks) == 1 and table.world_size > 1:
        warnings.append("only one rank's data: waiting for other ranks cannot be told apart from "
                        "transfer, so imbalance is not detected")
    analysed = RunTable(frame, table.source, table.path, table.ranks, table.world_size,
                        table.warnings, extras)
    return Report(analysed, steps, summarize_ranks(frame), verdict, stragglers, suggestions, th,
                  warnings, analysed_steps=int(steps.shape[0]), jitter=jitter,
                  consistent_early=sorted(roles.early))


def analyze_path(path, thresholds: Thresholds | None = None) -> Report:
    return analyze_table(load_table(path), thresholds)
