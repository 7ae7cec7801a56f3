"""Micro-steps summed into optimizer steps (analyze/cycles.group_cycles): against pandas' groupby
on random recorded-like tables, with and without `synced`, partial last cycles and ranks of
different lengths."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope.analyze.cycles import SUMMED, group_cycles


def _reference(frame: pd.DataFrame, ends: np.ndarray):
    """What group_cycles means, said with pandas' groupby (slower, plainly right)."""
    rank = frame["rank"].to_numpy()
    cycle = np.zeros(len(frame), np.int64)
    for r in np.unique(rank):
        at = np.flatnonzero(rank == r)
        e = ends[at]
        cycle[at] = np.cumsum(e) - e
    g = frame.assign(cycle=cycle).groupby(["rank", "cycle"], sort=True)
    cols = [c for c in SUMMED if c in frame]
    out = g[cols].sum()
    if "data_cpu_ns" in frame:  # one micro-step's loading CPU not measured (-1): the cycle's
        out["data_cpu_ns"] = out["data_cpu_ns"].where(g["data_cpu_ns"].min() >= 0, -1)
    out["start_ns"] = g["start_ns"].min()
    out["step"] = g["step"].max()
    out["micro_steps"] = g["step"].size()
    if "synced" in frame:
        out["synced"] = g["synced"].max()
    out = out.reset_index()
    mapping = pd.DataFrame({"rank": rank, "cycle": cycle, "step": frame["step"].to_numpy()}).merge(
        out[["rank", "cycle", "step"]].rename(columns={"step": "cycle_step"}),
        on=["rank", "cycle"], how="left")
    return out.drop(columns="cycle"), mapping[["rank", "step", "cycle_step"]]


def _frame(rng: np.random.Generator, synced: bool) -> tuple[pd.DataFrame, np.ndarray]:
    rows = []
    for r in range(rng.integers(1, 5)):
        n = int(rng.integers(0, 30))
        steps = np.sort(rng.choice(200, n, replace=False))
        for s in steps:
            rows.append({"rank": r, "step": int(s), "start_ns": int(rng.integers(0, 10**12)),
                         **{c: int(rng.integers(0, 10**9)) for c in SUMMED[:8]}})
    frame = pd.DataFrame(rows, columns=["rank", "step", "start_ns", *SUMMED[:8]]).astype("int64")
    if synced:
        frame["synced"] = rng.integers(0, 2, len(frame))
        # loading's CPU, measured on most micro-steps (-1 on the others)
        cpu = rng.integers(0, 10**6, len(frame))
        frame["data_cpu_ns"] = np.where(rng.random(len(frame)) < 0.1, -1, cpu)
    return frame, rng.random(len(frame)) < 0.3


def test_group_cycles_matches_a_groupby():
    for seed in range(120):
        rng = np.random.default_rng(seed)
        frame, ends = _frame(rng, synced=bool(seed % 2))
        got, got_map = group_cycles(frame, ends)
        want, want_map = _reference(frame, ends)
        pd.testing.assert_frame_equal(got, want, check_dtype=True)
        pd.testing.assert_frame_equal(got_map, want_map, check_dtype=True)
