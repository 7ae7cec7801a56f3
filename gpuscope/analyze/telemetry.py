"""Joins NVML samples to steps and ranks: utilization, memory headroom, clocks, temperature and
throttling, as evidence for the suggestions and the straggler explanation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..run_format import throttle_names
from ..results import TelemetrySummary


def summarize(tel: pd.DataFrame) -> dict[int, TelemetrySummary]:
    """Per rank: mean utilization, peak memory share, mean power, SM clock, peak temperature,
    throttle reasons seen (idle excluded)."""
    out = {}
    for rank, g in tel.groupby("rank"):
        mask = int(np.bitwise_or.reduce(g["throttle"].to_numpy(np.int64))) if len(g) else 0
        out[int(rank)] = TelemetrySummary(
            samples=int(len(g)),
            util_pct=round(float(g["util_pct"].mean()), 1),
            mem_used_max_pct=round(float((g["mem_used_bytes"] / g["mem_total_bytes"]
                                          .clip(lower=1)).max() * 100), 1),
            power_w=round(float(g["power_w"].mean()), 1),
            sm_clock_mhz=round(float(g["sm_clock_mhz"].mean()), 0),
            sm_clock_min_mhz=int(g["sm_clock_mhz"].min()),
            temp_max_c=int(g["temp_c"].max()),
            throttle=tuple(throttle_names(mask)))
    return out


def join_steps(frame: pd.DataFrame, tel: pd.DataFrame) -> pd.DataFrame:
    """Adds gpu_util_pct and sm_clock_mhz (means over the samples inside each step)."""
    parts = []
    for rank, g in frame.groupby("rank", sort=False):
        t = tel[tel["rank"] == rank]
        g = g.copy()
        if t.empty:
            parts.append(g)
            continue
        starts = g["start_ns"].to_numpy()
        ends = starts + g["step_ns"].to_numpy()
        order = np.argsort(starts)
        idx = np.searchsorted(starts[order], t["t_ns"].to_numpy(), side="right") - 1
        ok = (idx >= 0) & (t["t_ns"].to_numpy() < ends[order][np.clip(idx, 0, None)])
        pos = order[idx[ok]]
        s = pd.DataFrame({"pos": pos, "util": t["util_pct"].to_numpy()[ok],
                          "clock": t["sm_clock_mhz"].to_numpy()[ok]}).groupby("pos").mean()
        util = np.full(len(g), np.nan)
        clock = np.full(len(g), np.nan)
        util[s.index.to_numpy()] = s["util"].to_numpy()
        clock[s.index.to_numpy()] = s["clock"].to_numpy()
        g["gpu_util_pct"], g["sm_clock_mhz"] = util, clock
        parts.append(g)
    return pd.concat(parts) if parts else frame


def straggler_evidence(summary: dict[int, TelemetrySummary], rank: int) -> str:
    """What the straggler's GPU shows against the others: lower clocks, heat, throttling."""
    me = summary.get(rank)
    others = [v for r, v in summary.items() if r != rank]
    if not me or not others:
        return ""
    notes = []
    clock = float(np.median([o.sm_clock_mhz for o in others]))
    if clock > 0 and me.sm_clock_mhz < 0.95 * clock:
        notes.append(f"its SM clock averages {me.sm_clock_mhz:.0f} MHz against {clock:.0f} MHz "
                     "on the others")
    temp = float(np.median([o.temp_max_c for o in others]))
    if me.temp_max_c >= temp + 8:
        notes.append(f"it runs hotter ({me.temp_max_c} °C against {temp:.0f} °C)")
    if me.throttle:
        notes.append(f"NVML reports clock throttling: {', '.join(me.throttle)}")
    util = float(np.median([o.util_pct for o in others]))
    if me.util_pct > util + 15:
        notes.append(f"its GPU is busier ({me.util_pct:.0f}% against {util:.0f}%): other work "
                     "may share it")
    return "; ".join(notes)


def memory_used_fraction(summary: dict[int, TelemetrySummary], ranks_meta: dict) -> float | None:
    """Largest share of GPU memory in use on any rank (NVML, or torch's peak allocation)."""
    fracs = [v.mem_used_max_pct / 100 for v in summary.values()]
    for info in ranks_meta.values():
        peak = (info.meta.get("end") or {}).get("max_memory_allocated_bytes")
        total = (info.meta.get("gpu") or {}).get("mem_total_bytes")
        if peak and total:
            fracs.append(peak / total)
    return max(fracs) if fracs else None
