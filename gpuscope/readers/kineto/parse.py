"""Trace files -> events (and, beside the parse, each file's step rows), with numpy and msgspec
only: no pandas, so that the command line can start this work in forked processes before it
imports the analysis stack (prefetch.py)."""

from __future__ import annotations

import os
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import msgspec

import gpuscope.progress as progress
from ...trace_files import file_size
from ..speed import forks
from ..fork import _in_child
from .decode import (BATCH, Salvaged, batches, decode_trace, events_of, read_bytes,
                     split_events)
from .events import RankEvents, sort_events
from .hta import gpu_breakdown
from .rank import identify
from .steps import last_step, rank_rows

PARALLEL_MIN_BYTES = 4 << 20  # a process pool pays for itself above this (more than 2 cores)


SPLIT_MIN_EVENTS = 4 * BATCH  # a file this big is sorted by two processes when allowed
SPLIT_TEXT_BYTES = 16 << 20   # JSON text from which the text itself is cut in two


def parse_file(path: str, split: bool = False) -> tuple[str, object, RankEvents]:
    """Decode and sort one file. With `split`, a big file's text is cut in two at an event
    boundary and each half is decoded and sorted by its own process (fork); the halves are
    joined like two profiler cycles. Anything unexpected falls back to one process."""
    blob = None
    if split and forks() and file_size(path) >= SPLIT_TEXT_BYTES // 64:
        blob = read_bytes(path)
        cut = split_events(blob) if len(blob) >= SPLIT_TEXT_BYTES else None
        if cut is not None:
            info, first, second = cut
            with _in_child(lambda: sort_events(batches(events_of(second)))) as collect:
                try:
                    mine = sort_events(batches(events_of(first)))
                except msgspec.DecodeError:
                    mine = None
                status, theirs = collect()
            if mine is not None and status == "ok":
                return path, info, RankEvents.concat([mine, theirs])
            # the cut was refused: decode the file in one piece, from a fresh read (the cut
            # patched two bytes of this text)
            cut = first = second = blob = None
    raws, info = decode_trace(path, blob)
    blob = None
    damaged = raws.damaged if isinstance(raws, Salvaged) else -1
    if not (split and len(raws) >= SPLIT_MIN_EVENTS and forks()):
        ev = sort_events(batches(raws))
    else:
        mid = (len(raws) // 2) // BATCH * BATCH
        with _in_child(lambda: sort_events(batches(raws[mid:]))) as collect:
            first = sort_events(batches(raws[:mid]))
            status, second = collect()
        if status != "ok":
            second = sort_events(batches(raws[mid:]))
        ev = RankEvents.concat([first, second])
    if damaged >= 0:  # read event by event: the file as a whole is not JSON
        ev.counts["bad_json"] = ev.counts.get("bad_json", 0) + damaged
        ev.counts["salvaged"] = 1
    elif not has_profiler_events(ev):  # trace events, but none torch.profiler writes
        from ...errors import TraceFormatError
        from .what import looks_like

        raise TraceFormatError(looks_like(path))
    return path, info, ev


def has_profiler_events(ev: RankEvents) -> bool:
    """Whether the events hold anything torch.profiler writes: a host range or op, a device
    event, a runtime launch, or an allocator instant."""
    return bool(len(ev.host_kind) or len(ev.dev_kind) or len(ev.launch_corr) or ev.n_runtime
                or len(ev.mem_ts))


def _parse_all(files: list[str], jobs: int | None) -> list:
    """Parse every file: two processes share the work when there are two cores (files split
    in two groups by size, or one big file in two halves); a pool when there are more."""
    jobs = jobs if jobs is not None else min(max(len(files), 2), os.cpu_count() or 1)

    def parse(f, **kw):
        out = parse_file(f, **kw)
        progress.advance(file_size(f))
        return out

    if jobs <= 1 or not forks():
        return [parse(f) for f in files]
    if len(files) == 1:
        return [parse(files[0], split=True)]
    sizes = [file_size(f) for f in files]
    if jobs > 2 and len(files) > 2 and sum(sizes) >= PARALLEL_MIN_BYTES:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork")) as pool:
            out = []
            for f, got in zip(files, pool.map(parse_file, files)):
                out.append(got)
                progress.advance(file_size(f))
            return out
    order = sorted(range(len(files)), key=lambda i: -sizes[i])
    groups, load = ([], []), [0, 0]
    for i in order:  # greedy split into two groups of about equal bytes
        g = 0 if load[0] <= load[1] else 1
        groups[g].append(i)
        load[g] += sizes[i]
    mine, theirs = groups
    # each process also works out the step rows of its files that are their rank's only one
    # (a profiler cycle of its own process: tensorboard_trace_handler's names tell), meanwhile
    per_process = Counter(map(process_of, files))
    alone = [not process_of(f) or per_process[process_of(f)] == 1 for f in files]

    def rows_too(i, item):
        return prepared(item) if alone[i] else item

    with _in_child(lambda: [rows_too(i, parse_file(files[i])) for i in theirs]) as collect:
        done = {i: rows_too(i, parse(files[i])) for i in mine}
        status, value = collect()
    if status == "ok":
        done.update(zip(theirs, value))
        progress.advance(load[1])
    else:  # e.g. a bad file in the child's group: redo here, where the error is raised
        done.update({i: parse(files[i]) for i in theirs})
    return [done[i] for i in range(len(files))]


def prepared(item: tuple) -> tuple:
    """(path, info, events, (rank, rank_rows' result, GPU breakdown)): the rows of the file's
    rank as if it were that rank's only file. _table uses them when it turns out so, and works
    them out itself otherwise."""
    f, info, ev = item[:3]
    rid, _ = identify(f, info)
    if rid.rank is None:
        return f, info, ev, None
    last = last_step(ev)
    drop = frozenset() if last is None else frozenset({last})
    return f, info, ev, (rid.rank, rank_rows(ev, rid.rank, drop), gpu_breakdown(ev, last is not None))


#: a host name as RFC 1123 allows it: labels of letters, digits and hyphens, not starting or
#: ending with a hyphen; so "worker0_step" (from "worker0_step_12.<ts>.json") is not one
_HOST = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")


def _host_pid(path: str) -> tuple[str, str]:
    """(host, pid) of tensorboard_trace_handler's `{host}_{pid}.{ts}.pt.trace.json`, or ("", "")
    when the name is not of that form with a real host name."""
    head = os.path.basename(path).split(".", 1)[0]
    host, sep, pid = head.rpartition("_")
    if sep and pid.isdigit() and len(host) <= 253 and _HOST.fullmatch(host):
        return host, pid
    return "", ""


def process_of(path: str) -> str:
    """`{host}_{pid}` of tensorboard_trace_handler's names, or ""."""
    host, pid = _host_pid(path)
    return f"{host}_{pid}" if host else ""


def host_of(path: str) -> str:
    """The host of tensorboard_trace_handler's names, "" (unknown) for any other name."""
    return _host_pid(path)[0]
