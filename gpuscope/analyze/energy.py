"""Energy per rank and step from NVML, what the waiting costs, and (given a price) what each
bottleneck costs per 1,000 steps.

A step's energy is the device's total energy counter (NVML, mJ) read at the step's start and end,
interpolated between the sampler's readings (1-10 Hz); steps outside the sampled span are left
out. Without the counter (a GPU before Volta, older record files), the rank's mean power over
its samples times the step's time (`source`: "power samples"). Within a step the power is taken
as even: the energy spent waiting for data, on exposed transfer and waiting for other ranks is
the step's energy times each part's share of the step's time (`assumes` says so).

Cost needs `price_per_gpu_hour` (record option or knob): GPUs x the mean step x 1,000 steps,
and each bottleneck's share of it by time, energy or not.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd

from ..sections import Energy
from .rowgroups import count_distinct

PARTS = (("data", "data_ns"), ("comm", None), ("waiting", "wait_ns"))


def _part_ns(g: pd.DataFrame, part: str, col: str | None) -> np.ndarray:
    if part == "comm":  # exposed transfer: exposed less the waiting for other ranks
        wait = g["wait_ns"].to_numpy(float) if "wait_ns" in g else 0.0
        return np.clip(g["comm_exposed_ns"].to_numpy(float) - wait, 0, None)
    return g[col].to_numpy(float) if col in g else np.zeros(len(g))


def step_joules(g: pd.DataFrame, t: pd.DataFrame) -> tuple[np.ndarray, str]:
    """Joules of each of a rank's steps (NaN where not covered), and how they were had."""
    start = g["start_ns"].to_numpy(float)
    end = start + g["step_ns"].to_numpy(float)
    e = t[t["energy_mj"].notna()] if "energy_mj" in t else t.iloc[:0]
    if len(e) >= 2:
        tt, ee = e["t_ns"].to_numpy(float), e["energy_mj"].to_numpy(float)
        order = np.argsort(tt)
        tt, ee = tt[order], ee[order]
        if (np.diff(ee) >= 0).all():  # a counter that went back (a driver reload): not used
            ok = (start >= tt[0]) & (end <= tt[-1])
            j = (np.interp(end, tt, ee) - np.interp(start, tt, ee)) / 1000.0
            return np.where(ok, j, np.nan), "NVML energy counter"
    p = t["power_w"].dropna() if "power_w" in t else pd.Series(dtype=float)
    if len(p):
        return float(p.mean()) * (end - start) / 1e9, "power samples"
    return np.full(len(g), np.nan), ""


def energy_section(frame: pd.DataFrame, telemetry: pd.DataFrame | None,
                   knobs: dict) -> Energy | None:
    """The report's `energy` section (None with neither NVML samples nor a price)."""
    out: dict = {}
    batch = knobs.get("batch_size") if isinstance(knobs.get("batch_size"), int) else None
    if telemetry is not None and len(telemetry) and len(frame):
        ranks, sources, shares = [], set(), {p: 0.0 for p, _ in PARTS}
        total = 0.0
        for rank, g in frame.groupby("rank"):
            j, source = step_joules(g, telemetry[telemetry["rank"] == rank])
            ok = ~np.isnan(j)
            if not ok.any():
                continue
            sources.add(source)
            step = g["step_ns"].to_numpy(float)
            jj, ss = j[ok], step[ok]
            for part, col in PARTS:
                shares[part] += float((jj * _part_ns(g, part, col)[ok] / np.maximum(ss, 1)).sum())
            total += float(jj.sum())
            r = {"rank": int(rank), "steps": int(ok.sum()),
                 "joules_per_step": round(float(np.mean(jj)), 3),
                 "watts": round(float(jj.sum() / (ss.sum() / 1e9)), 1)}
            if batch:
                r["joules_per_sample"] = round(float(np.mean(jj)) / batch, 4)
            ranks.append(r)
        if ranks:
            out = {"source": ", ".join(sorted(sources)), "per_rank": ranks,
                   "joules_per_step": round(sum(r["joules_per_step"] for r in ranks), 3),
                   "waiting_pct": {p: round(100 * v / total, 2) if total else 0.0
                                   for p, v in shares.items()},
                   "assumes": "power even within a step: each part's energy is its share of "
                              "the step's time"}
            if batch:
                out["joules_per_sample"] = round(out["joules_per_step"] / (batch * len(ranks)), 4)
    price = knobs.get("price_per_gpu_hour")
    if isinstance(price, (int, float)) and price > 0 and len(frame):
        gpus = count_distinct(frame["rank"].to_numpy())
        mean_s = float(frame.groupby("rank")["step_ns"].mean().max()) / 1e9
        per_k = gpus * mean_s * 1000 / 3600 * float(price)
        step = frame["step_ns"].to_numpy(float)
        cost = {"price_per_gpu_hour": float(price), "per_1000_steps": round(per_k, 4)}
        for part, col in PARTS:
            share = float((_part_ns(frame, part, col) / np.maximum(step, 1)).mean())
            cost[part] = round(per_k * share, 4)
        out["cost"] = cost
    return msgspec.convert(out, Energy) if out else None
