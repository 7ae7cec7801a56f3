"""One rank's traces -> what the reader keeps of them: its step rows and collectives, the
HTA-compatible breakdown, the op, message and kernel views (summed per step and name), its
allocator's peaks per step, and the few facts the knobs and warnings need. A few hundred KB
where the events of a 150 MB trace are ~60 MB: worked out where a file is parsed (a forked
process, a Ray task), so that only this travels and stays, and reading every rank of a job
needs the memory of one file per process, not of the job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .colls import Colls
from .events import STEP, RankEvents, p2p_masks
from .hta import gpu_breakdown_of
from .memory_steps import memory_rows
from .ops import kernel_breakdown, kernel_type_time, op_views
from .steps import last_step, rank_rows
from .sync_sources import sync_sources

#: the sources of a rank's syncs kept (most syncs first)
SOURCES_KEPT = 4


@dataclass
class RankSummary:
    """What the reader's table needs of one rank's trace file(s)."""

    rank: int
    rows: list              # rank_rows: one dict per step
    colls: object           # ... its collectives (collectives.Colls)
    row_warnings: list      # ... what it said
    hta: object             # GpuBreakdown or None
    ops: dict               # op_views' op view (columns)
    messages: dict          # ... and collectives with their messages
    kernels: dict           # HTA's kernel breakdown (per kernel name)
    kernel_types: dict | None  # time per kernel type, where the device was profiled
    memory: list            # the allocator's peaks per step (memory_steps)
    warnings: list          # each file's damage (file_warnings)
    loader: str             # "single-process", "multi-process" or ""
    has_device: bool        # device events recorded
    p2p: bool               # point-to-point communication seen
    step_markers: bool      # ProfilerStep ranges present
    gpu_not_recorded: bool  # launches but no device event: the GPU was not profiled
    events: int             # events in the file(s)
    span: tuple             # (first, last) ns of the events
    step_thread: int        # the training thread
    sync_sources: dict = field(default_factory=dict)  # where its host syncs come from


def file_warnings(path: str, ev: RankEvents) -> list[str]:
    """One warning per kind of damage found in a file's events."""
    name, c, out = os.path.basename(path), ev.counts, []
    if c.get("salvaged"):
        out.append(f"{name}: not valid JSON as a whole (cut mid-write or damaged): read event "
                   f"by event, {c.get('events', 0)} read")
    if c.get("bad_json"):
        out.append(f"{name}: {c['bad_json']} damaged event(s) that do not parse skipped")
    if c.get("bad_time"):
        out.append(f"{name}: {c['bad_time']} event(s) with a negative, huge or non-numeric time "
                   "or duration skipped")
    if ev.odd_comm:
        shown = ", ".join(n.split("(", 1)[0][:80] for n in ev.odd_comm[:3])
        more = f" and {len(ev.odd_comm) - 3} more" if len(ev.odd_comm) > 3 else ""
        out.append(f"{name}: kernel(s) {shown}{more} look like communication but match no known "
                   "family (docs/rules.md): counted as communication")
    if c.get("bad_id"):
        out.append(f"{name}: stream or correlation ids past 64 bits in {c['bad_id']} batch(es) "
                   "of events read as unknown")
    return out


def span(ev: RankEvents) -> tuple[int, int]:
    """(first, last) ns of a file's events (0, 0 without any)."""
    starts = [a.min() for a in (ev.host_start, ev.dev_start) if a.size]
    ends = [a.max() for a in (ev.host_end, ev.dev_end) if a.size]
    return (int(min(starts)), int(max(ends))) if starts else (0, 0)


def summarize(rank: int, files: list[tuple[str, RankEvents]]) -> RankSummary:
    """One rank's summary from its file(s) (several: repeated profiler cycles of one process,
    joined). Each file's last step is left out (HTA's default: its work may be cut off)."""
    evs = [e for _, e in files]
    ev = RankEvents.concat(evs) if len(evs) > 1 else evs[0]
    lasts = [last_step(e) for e in evs]
    drop = frozenset(x for x in lasts if x is not None)
    files_hta = [(e, x is not None) for e, x in zip(evs, lasts)]
    rows, colls, said = rank_rows(ev, rank, drop)
    got = op_views(ev, drop)
    spans = [span(e) for e in evs]
    return RankSummary(
        rank=rank, rows=rows, colls=Colls.of(colls), row_warnings=list(said),
        hta=gpu_breakdown_of(files_hta), ops=got["ops"], messages=got["messages"],
        kernels=kernel_breakdown(files_hta),
        kernel_types=kernel_type_time(files_hta) if ev.dev_kind.size else None,
        memory=memory_rows(ev, rank, rows),
        warnings=[w for f, e in files for w in file_warnings(f, e)],
        loader=ev.loader, has_device=bool(ev.dev_kind.size),
        p2p=any(bool(m.any()) for m in p2p_masks(ev)),
        step_markers=bool((ev.host_kind == STEP).any()),
        gpu_not_recorded=bool(ev.n_runtime >= 10 and not ev.dev_kind.size),
        events=sum(e.counts.get("events", 0) for e in evs),
        span=(min(s[0] for s in spans), max(s[1] for s in spans)),
        step_thread=int(ev.step_thread),
        sync_sources={k: round(v) for k, v in sync_sources(ev).most_common(SOURCES_KEPT)})
