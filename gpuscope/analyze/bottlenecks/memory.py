"""Memory: growth that will end the run, peaks near capacity, allocator retries, and what an
out-of-memory error left behind.

Evidence: `RunTable.memory` (recorded runs: the resident set and, on CUDA, the allocator's peaks
per flush; profiler traces with profile_memory=True: the device and CPU allocators' peaks per
step), each rank's capacity (its record header; not in traces) and end record.

- **growth**: per rank, the slope of memory over the analysed steps (Theil-Sen: the median of
  the slopes between each step and the one half the span later, which a few outliers do not
  move), called growth when over the span it adds at least GROWTH_MIN_BYTES and four times the
  scatter around the line, and goes on all run long (each quarter's median above the last: one
  allocation that rises once and stays is not a leak). The forecast divides what is
  left by the rate: on a host, the ranks recorded there share its memory (or the cgroup's
  limit), so their rates add up; other processes' use is not known and not counted.
- **near capacity**: a device's peak reserved memory, or a host's ranks together, at
  NEAR_CAPACITY of what it holds or more.
- **allocator retries**: the caching allocator freed its cache and retried an allocation
  (fragmentation, or a peak at the edge); each costs a device synchronization.
- **out of memory**: a rank whose training raised an out-of-memory error: its step, what the
  failing allocation asked for (from the error's text), what memory held as it raised, and
  the ranks whose collective then failed, or that the launcher stopped (stopped.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...sections import Memory, MemorySeries
from ...stall_story import in_step
from ..stopped import died_in, failed_on_a_peer

GROWTH_MIN_BYTES = 16 << 20   # growth smaller than this over the run is not reported
NOISE_TIMES = 4.0              # ... nor growth within this many times the scatter
MIN_POINTS = 6                 # samples needed for a rate
NEAR_CAPACITY = 0.9
MiB = float(1 << 20)

_OOM = re.compile(r"OutOfMemoryError|out of memory|can't allocate memory|MemoryError|"
                  r"std::bad_alloc", re.IGNORECASE)
_ASKED = (re.compile(r"Tried to allocate ([\d.]+) ?([KMGTP]i?B|bytes)", re.IGNORECASE),
          re.compile(r"you tried to allocate (\d+) bytes", re.IGNORECASE))
_UNIT = {"b": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}


@dataclass(frozen=True)
class Series:
    """One rank's memory of one kind over the analysed steps."""

    rank: int
    kind: str                 # "host" (resident set) | "device" (allocator's peak allocated)
    points: int
    first_bytes: float
    last_bytes: float
    peak_bytes: float
    rate_bytes_per_step: float | None  # Theil-Sen slope (None: too few points to tell)
    noise_bytes: float          # scatter around the line (1.4826 x MAD)
    growing: bool | None        # None: too few points to tell, never "not growing"


@dataclass
class MemoryFindings:
    series: list[Series] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)  # kind, ranks, text, numbers


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, scatter): the median of the slopes between points half the span apart, and
    1.4826 x the median absolute deviation of the residuals."""
    n = len(x)
    h = max(n // 2, 1)
    dx = x[h:] - x[:-h]
    ok = dx > 0
    if not ok.any():
        return 0.0, 0.0
    slope = float(np.median((y[h:] - y[:-h])[ok] / dx[ok]))
    resid = y - slope * x
    resid -= np.median(resid)
    return slope, float(1.4826 * np.median(np.abs(resid)))


def spread_out(y: np.ndarray, span: float) -> bool:
    """Growth that goes on: the medians of the run's four quarters each at least a tenth of
    the growth above the one before (one allocation early on - a cache filled, a buffer sized
    on the first long batch - rises once and then stays: not a leak)."""
    q = [float(np.median(part)) for part in np.array_split(y, 4) if len(part)]
    return len(q) == 4 and all(b - a >= 0.1 * span for a, b in zip(q, q[1:]))


def series(mem: pd.DataFrame, column: str, kind: str, firsts: dict) -> list[Series]:
    """Per rank, `column` over the rank's analysed steps (from `firsts[rank]` on: warm-up left
    out), or over all of them when fewer than MIN_POINTS were analysed."""
    out = []
    for rank, g in mem[mem[column].notna()].groupby("rank"):
        keep = g["step"] >= firsts.get(int(rank), 0)
        g = g[keep] if keep.sum() >= MIN_POINTS else g
        x, y = g["step"].to_numpy(float), g[column].to_numpy(float)
        if not len(y):
            continue
        if len(y) < MIN_POINTS:  # too few samples to tell growth: unknown, not "no growth"
            out.append(Series(int(rank), kind, len(y), float(y[0]), float(y[-1]),
                              float(y.max()), None, 0.0, None))
            continue
        rate, noise = theil_sen(x, y)
        span = rate * (x[-1] - x[0])
        growing = (span >= GROWTH_MIN_BYTES and span >= NOISE_TIMES * noise
                   and y[-1] - y[0] >= 0.5 * span and spread_out(y, span))
        out.append(Series(int(rank), kind, len(y), float(y[0]), float(y[-1]), float(y.max()),
                          rate, noise, bool(growing)))
    return out


def _bytes(n: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20),
                       ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def asked_bytes(error: str) -> float | None:
    """What the failing allocation asked for, from an out-of-memory error's text."""
    for pat in _ASKED:
        m = pat.search(error)
        if m:
            unit = (m.group(2) if m.lastindex and m.lastindex >= 2 else "bytes").lower()
            return float(m.group(1)) * _UNIT.get(unit, 1)
    return None


_ALLOWED = re.compile(r"([\d.]+) ?([KMGTP]i?B) allowed", re.IGNORECASE)


def device_capacity(meta: dict) -> tuple[float | None, str]:
    """(the bytes of device memory this process could use, what that is): the least of the
    device's total, the share a per-process memory fraction allows (the header's
    `device_limit_bytes`, or "N GiB allowed" in an out-of-memory error's text), and what was
    free for it as it started (other processes' memory, a MIG or partition slice:
    `device_usable_bytes`); (None, "") when none is known."""
    cap = meta.get("capacity") or {}
    total = cap.get("device_total_bytes")
    found: list[tuple[float, str]] = []
    if total:
        found.append((float(total), f"the device's memory ({_bytes(total)})"))
    limit = cap.get("device_limit_bytes")
    if limit and (not total or limit < total):
        found.append((float(limit), f"the {_bytes(limit)} this process may use (its per-process "
                                    "memory fraction" + (f", {limit / total:.2f} of "
                                                         f"{_bytes(total)}" if total else "")
                      + ")"))
    usable = cap.get("device_usable_bytes")
    if usable and (not total or usable < total):
        found.append((float(usable), f"the {_bytes(usable)} free for this process as it started "
                                     "(other processes, or its own CUDA context, held the rest"
                      + (f" of {_bytes(total)}" if total else "") + ")"))
    end = meta.get("end") or {}
    m = _ALLOWED.search(str(end.get("error") or "")) if isinstance(end, dict) else None
    if m:
        allowed = float(m.group(1)) * _UNIT.get(m.group(2).lower(), 1)
        found.append((allowed, f"the {_bytes(allowed)} this process was allowed (its "
                               "out-of-memory error says so: a per-process memory fraction)"
                      + (f" of the device's {_bytes(total)}" if total else "")))
    if not found:
        return None, ""
    return min(found, key=lambda f: f[0])


def host_capacity(meta: dict) -> tuple[float | None, str]:
    cap = meta.get("capacity") or {}
    if cap.get("host_limit_bytes"):
        return float(cap["host_limit_bytes"]), "its cgroup's limit"
    if cap.get("host_total_bytes"):
        return float(cap["host_total_bytes"]), "the host's memory"
    return None, ""


def growth_findings(host: list[Series], device: list[Series], ranks: dict,
                    step_s: float | None, host_alloc: list[Series] = (),
                    died: dict | None = None) -> list[dict]:
    """Growth per host and device; `died`: {rank: the out-of-memory finding} of the ranks that
    ran out of memory, whose growth has no forecast: it already filled what they could use."""
    died = died or {}
    out = []
    by_host: dict[str, list[Series]] = {}
    for s in host:
        if s.growing:
            by_host.setdefault(ranks[s.rank].host if s.rank in ranks else "", []).append(s)
    for name, grow in by_host.items():
        on_host = [s for s in host if (ranks[s.rank].host if s.rank in ranks else "") == name]
        capacity = host_capacity(ranks[grow[0].rank].meta if grow[0].rank in ranks else {})
        used = sum(s.last_bytes for s in on_host)
        out.append(_growth("host", grow, used, capacity, step_s, name))
    for s in device:
        if s.growing:
            capacity = device_capacity(ranks[s.rank].meta) if s.rank in ranks else (None, "")
            out.append(_growth("device", [s], s.last_bytes, capacity, step_s,
                               oom=died.get(s.rank)))
    for s in host_alloc:  # a trace's CPU allocator: what the host holds is not in it
        if s.growing:
            out.append(_growth("host_alloc", [s], s.last_bytes, (None, ""), step_s))
    return out


def _growth(kind: str, grow: list, used: float, capacity: tuple, step_s, host: str = "",
            oom: dict | None = None) -> dict:
    """The finding of memory of `kind` growing on the ranks of `grow` (their series; on `host`
    for resident memory): `used` now, `capacity` (bytes, what holds them; None: not known),
    when it fills at `step_s` a step, or the out-of-memory error it ended in (`oom`)."""
    ranks_ = [s.rank for s in grow]
    rate = sum(s.rate_bytes_per_step for s in grow)
    cap, what = capacity
    who = f"rank {ranks_[0]}" if len(ranks_) == 1 else f"ranks {', '.join(map(str, ranks_))}"
    span = "; ".join(f"rank {s.rank}: {_bytes(s.first_bytes)} -> {_bytes(s.last_bytes)} over "
                     f"{s.points} steps" for s in grow[:4])
    mem = {"host": "resident memory", "device": "device memory allocated at peak",
           "host_alloc": "memory held by torch's CPU allocator"}[kind]
    text = (f"{mem} grows {_bytes(rate / len(grow))}/step on {who} ({span}): a leak, a cache "
            "that is never emptied, or a graph kept alive (a loss or output kept across steps "
            "without .item() / .detach())")
    d = {"kind": "growth", "memory": kind, "ranks": ranks_, "host": host,
         "rate_bytes_per_step": round(rate, 1), "used_bytes": int(used)}
    if oom is not None:  # no forecast: it ran out already
        d.update(capacity_bytes=int(cap) if cap else None, forecast_steps=None)
        d["text"] = text + (f"; it filled {what}" if cap else "") + \
            f": the out-of-memory error in step {oom.get('step')}"
        return d
    if cap:
        left = max(cap - used, 0.0)
        steps = left / rate if rate > 0 else None
        d.update(capacity_bytes=int(cap), forecast_steps=round(steps) if steps is not None else None)
        if steps is not None:
            when = f"~{steps:,.0f} steps" + (f" (~{_duration(steps * step_s)})" if step_s else "")
            who_fills = f"the {len(grow)} ranks together fill" if len(grow) > 1 else "it fills"
            text += f"; at this rate {who_fills} {what} ({_bytes(cap)}) in {when}"
            if kind == "host":
                text += " (other processes' memory not counted)"
            if step_s:
                d["forecast_s"] = round(steps * step_s, 1)
    else:
        d["capacity_bytes"] = None
        text += f"; {what if what else 'the capacity'} is not known: no forecast"
    d["text"] = text
    return d


def capacity_findings(host: list[Series], mem: pd.DataFrame, ranks: dict,
                      died: dict | None = None) -> list[dict]:
    """Peaks near what a device (or a host) holds; not for a rank that ran out of it already
    (`died`: its out-of-memory finding says what it held)."""
    out = []
    if "device_reserved_bytes" in mem:
        peak = mem.groupby("rank")["device_reserved_bytes"].max()
        for rank, p in peak.dropna().items():
            if rank in (died or {}):
                continue
            cap, what = device_capacity(ranks[rank].meta) if rank in ranks else (None, "")
            if cap and p / cap >= NEAR_CAPACITY:
                out.append({"kind": "near_capacity", "memory": "device", "ranks": [int(rank)],
                            "peak_bytes": int(p), "capacity_bytes": int(cap),
                            "text": f"rank {rank}'s allocator reserved {_bytes(p)} of "
                                    f"{what} ({p / cap:.0%}) at its peak: an "
                                    "out-of-memory error is close; a bigger batch will not fit"})
    by_host: dict[str, list[Series]] = {}
    for s in host:
        by_host.setdefault(ranks[s.rank].host if s.rank in ranks else "", []).append(s)
    for name, ss in by_host.items():
        cap, what = host_capacity(ranks[ss[0].rank].meta if ss[0].rank in ranks else {})
        used = sum(s.peak_bytes for s in ss)
        if cap and used / cap >= NEAR_CAPACITY:
            out.append({"kind": "near_capacity", "memory": "host", "host": name,
                        "ranks": [s.rank for s in ss], "peak_bytes": int(used),
                        "capacity_bytes": int(cap),
                        "text": f"the ranks on host {name or '?'} together held {_bytes(used)} "
                                f"resident, {used / cap:.0%} of {what} ({_bytes(cap)})"})
    return out


def retry_findings(mem: pd.DataFrame) -> list[dict]:
    out = []
    if "alloc_retries" not in mem:
        return out
    for rank, g in mem[mem["alloc_retries"].notna()].groupby("rank"):
        n = int(g["alloc_retries"].max() - (g["alloc_retries"].min() if len(g) > 1 else 0))
        if n > 0:
            out.append({"kind": "alloc_retries", "memory": "device", "ranks": [int(rank)],
                        "retries": n,
                        "text": f"rank {rank}: the caching allocator freed its cache and retried "
                                f"{n} allocation(s) (fragmentation, or peaks at the edge of the "
                                "device's memory; each costs a synchronization): try "
                                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, a smaller "
                                "batch, or fewer tensors kept alive across steps"})
    return out


def oom_findings(ranks: dict, last_step: dict) -> list[dict]:
    out = []
    for rank, info in sorted(ranks.items()):
        end = info.meta.get("end") or {}
        err = str(end.get("error") or "")
        if not (end.get("crashed") and _OOM.search(err)):
            continue
        asked = asked_bytes(err)
        held = end.get("memory_at_error") or {}
        waiting = sorted(int(r) for r, other in ranks.items() if r != rank
                         and failed_on_a_peer(other.meta.get("end")))
        step = died_in(end, last_step.get(rank))
        parts = [f"rank {rank} ran out of memory " + (in_step(step) or "(its step unknown)")]
        if asked is not None:
            parts.append(f"the failing allocation asked for {_bytes(asked)}")
        device_cap = None
        if "device_peak_reserved_bytes" in held:
            device_cap, what = device_capacity(info.meta)
            parts.append(f"the allocator held {_bytes(held['device_peak_reserved_bytes'])} at "
                         f"its peak" + (f", of {what}" if device_cap else ""))
        if "rss_bytes" in held:
            tot, what = host_capacity(info.meta)
            parts.append(f"resident {_bytes(held['rss_bytes'])}"
                         + (f" of {what} ({_bytes(tot)})" if tot else ""))
        if waiting:
            parts.append("rank(s) " + ", ".join(map(str, waiting)) + " stopped waiting on it")
        out.append({"kind": "out_of_memory", "ranks": [rank], "step": step,
                    "capacity_bytes": int(device_cap) if device_cap else None,
                    "asked_bytes": asked, "memory_at_error": held, "stopped_waiting": waiting,
                    "error": err.splitlines()[0][:300] if err else "",
                    "text": "; ".join(parts)})
    return out


def memory_findings(mem: pd.DataFrame | None, ranks: dict, firsts=None,
                    step_s: float | None = None, last_step: dict | None = None) -> MemoryFindings:
    """Everything above, from the memory table, the ranks (RankInfo: capacity, end record) and
    each rank's first analysed step (`firsts`: rank -> step, a mapping or Series; None: all)."""
    found = MemoryFindings()
    found.findings += oom_findings(ranks, last_step or {})
    died = {f["ranks"][0]: f for f in found.findings}
    if mem is None or mem.empty:
        return found
    firsts = {int(k): int(v) for k, v in dict(firsts if firsts is not None else {}).items()}
    host = series(mem, "rss_bytes", "host", firsts)
    device = series(mem, "device_peak_bytes", "device", firsts)
    host_alloc = series(mem, "host_alloc_bytes", "host_alloc", firsts) \
        if "host_alloc_bytes" in mem else []
    found.series = host + device + host_alloc
    found.findings += growth_findings(host, device, ranks, step_s, host_alloc, died)
    found.findings += capacity_findings(host, mem, ranks, died)
    found.findings += retry_findings(mem)
    return found


def report_section(found: MemoryFindings) -> Memory | None:
    """The report's `memory` section (bytes; None when nothing was measured)."""
    if not found.series and not found.findings:
        return None
    return Memory(series=[MemorySeries(
        rank=int(s.rank), memory=s.kind, points=int(s.points), first_bytes=int(s.first_bytes),
        last_bytes=int(s.last_bytes), peak_bytes=int(s.peak_bytes),
        rate_bytes_per_step=(None if s.rate_bytes_per_step is None
                             else round(float(s.rate_bytes_per_step), 1)),
        growing=None if s.growing is None else bool(s.growing)) for s in found.series],
        findings=found.findings)


def used_fraction(mem: pd.DataFrame | None, ranks: dict) -> float | None:
    """The largest share of what it could use (device_capacity) any rank's allocator reserved
    (None: unknown)."""
    if mem is None or "device_reserved_bytes" not in mem:
        return None
    peak = mem.groupby("rank")["device_reserved_bytes"].max().dropna()
    fracs = [p / cap for r, p in peak.items()
             if r in ranks and (cap := device_capacity(ranks[r].meta)[0])]
    return float(max(fracs)) if fracs else None
