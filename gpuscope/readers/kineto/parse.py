"""Trace files -> events (and, beside the parse, what the reader keeps of each file that is its
rank's only one: summary.py), with numpy and msgspec only: no pandas, so that the command line can start this work in forked processes before it
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
from ..fork import in_child
from .decode import Salvaged, batches, decode_trace, events_of, read_bytes, split_events
from .events import RankEvents, sort_events

from .rank import identify, shared_info
from .summary import summarize
from .text import let_go

PARALLEL_MIN_BYTES = 4 << 20  # a process pool pays for itself above this (more than 2 cores)


SPLIT_TEXT_BYTES = 16 << 20   # JSON text from which a second process takes half of a file
SEGMENT_BYTES = 4 << 20    # the text is decoded in pieces of about this size


def parse_file(path: str, split: bool = False) -> tuple[str, object, RankEvents]:
    """Decode and sort one file. Its text is cut at event boundaries into pieces of about
    SEGMENT_BYTES, decoded and sorted one after the other, each piece's bytes let go of once its
    events are columns (text.py): the text shrinks as the columns grow. With `split`, a second
    process (fork) takes the second half of the pieces, and each process lets go of the other's
    half; the parts are joined like profiler cycles. Anything unexpected falls back to one piece
    in one process, from a fresh read."""
    blob = read_bytes(path)
    n = -(-len(blob) // SEGMENT_BYTES)
    two = split and forks() and len(blob) >= SPLIT_TEXT_BYTES
    cut = split_events(blob, max(n, 2 if two else 1)) if n > 1 or two else None
    if cut is not None:
        info, pieces, spans = cut
        del cut
        half = len(pieces) // 2 if two and len(pieces) > 1 else len(pieces)
        ev = None
        try:
            if half < len(pieces):
                middle = spans[half][0]

                def theirs():
                    let_go(blob, 0, middle)  # the parent's half
                    return _sorted(pieces[half:], blob, spans[half:])

                with in_child(theirs) as collect:
                    let_go(blob, middle, len(blob))  # the child's half (it holds its own pages)
                    mine = _sorted(pieces[:half], blob, spans[:half])
                    status, other = collect()
                if status == "ok":
                    ev = RankEvents.concat([mine, other])
            else:
                ev = _sorted(pieces, blob, spans)
        except msgspec.DecodeError:
            ev = None
        del pieces
        if ev is not None:
            return path, shared_info(info), _checked(path, ev, -1)
        blob = None  # the cut was refused: decode the file in one piece, from a fresh read
    raws, info = decode_trace(path, blob)  # (the cuts patched bytes of this text)
    blob = None
    damaged = raws.damaged if isinstance(raws, Salvaged) else -1
    return path, shared_info(info), _checked(path, sort_events(batches(raws)), damaged)


def _sorted(pieces: list, text=None, spans=()) -> RankEvents:
    """The events of some pieces of a file's text (JSON arrays), decoded one piece at a time;
    with the `text` they are views of and their `spans` in it, each piece's bytes let go of
    once its events are columns."""
    parts = []
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], None
        parts.append(sort_events(batches(events_of(piece))))
        try:
            piece.release()
        except BufferError:  # something still reads these bytes: they stay
            continue
        if text is not None:  # nothing reads these bytes again: hand them back
            let_go(text, *spans[i])
    return RankEvents.concat(parts)


def _checked(path: str, ev: RankEvents, damaged: int) -> RankEvents:
    """A file's events, with the damage counted (`damaged` >= 0: read event by event), or an
    error where it holds no event torch.profiler writes."""
    if damaged >= 0:  # read event by event: the file as a whole is not JSON
        ev.counts["bad_json"] = ev.counts.get("bad_json", 0) + damaged
        ev.counts["salvaged"] = 1
    elif not has_profiler_events(ev):  # trace events, but none torch.profiler writes
        from ...errors import TraceFormatError
        from .what import looks_like

        raise TraceFormatError(looks_like(path))
    return ev


def has_profiler_events(ev: RankEvents) -> bool:
    """Whether the events hold anything torch.profiler writes: a host range or op, a device
    event, a runtime launch, or an allocator instant."""
    return bool(len(ev.host_kind) or len(ev.dev_kind) or len(ev.launch_corr) or ev.n_runtime
                or len(ev.mem_ts))


def parse_all(files: list[str], jobs: int | None) -> list:
    """Parse every file: two processes share the work when there are two cores (files split
    in two groups by size, or one big file in two halves); a pool when there are more."""
    jobs = jobs if jobs is not None else min(max(len(files), 2), os.cpu_count() or 1)

    # each file that is its process's only trace is summed up where it is parsed (prepared):
    # its events do not travel or stay, whatever the number of ranks
    alone = alone_files(files)

    def parse(i, **kw):
        out = parse_file(files[i], **kw)
        progress.advance(file_size(files[i]))
        return prepared(out) if alone[i] else out

    if jobs <= 1 or not forks():
        return [parse(i) for i in range(len(files))]
    if len(files) == 1:
        return [parse(0, split=True)]
    sizes = [file_size(f) for f in files]
    if jobs > 2 and len(files) > 2 and sum(sizes) >= PARALLEL_MIN_BYTES:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork")) as pool:
            out = []
            for f, got in zip(files, pool.map(parse_alone, files, alone)):
                out.append((got[0], shared_info(got[1]), *got[2:]))  # each came pickled apart
                progress.advance(file_size(f))
            return out
    order = sorted(range(len(files)), key=lambda i: -sizes[i])
    groups, load = ([], []), [0, 0]
    for i in order:  # greedy split into two groups of about equal bytes
        g = 0 if load[0] <= load[1] else 1
        groups[g].append(i)
        load[g] += sizes[i]
    mine, theirs = groups
    with in_child(lambda: [parse_alone(files[i], alone[i]) for i in theirs]) as collect:
        done = {i: parse(i) for i in mine}
        status, value = collect()
    if status == "ok":
        done.update(zip(theirs, value))
        progress.advance(load[1])
    else:  # e.g. a bad file in the child's group: redo here, where the error is raised
        done.update({i: parse(i) for i in theirs})
    return [done[i] for i in range(len(files))]


def prepared(item: tuple) -> tuple:
    """(path, info, None, RankSummary) of a file that is its rank's only one: what the reader
    keeps of it, worked out here, its events let go (summary.py); (path, info, events, None)
    when the file does not say its rank (the reader places it among the others)."""
    f, info, ev = item[:3]
    rid, _ = identify(f, info)
    if rid.rank is None:
        return f, info, ev, None
    return f, info, None, summarize(rid.rank, [(f, ev)])


def parse_alone(path: str, alone: bool) -> tuple:
    """parse_file, then `prepared` where the file is its process's only one."""
    item = parse_file(path)
    return prepared(item) if alone else item


def alone_files(files: list[str]) -> list[bool]:
    """Per file: whether it is its process's only trace (tensorboard_trace_handler's names
    tell; a name of another form: taken as alone)."""
    per_process = Counter(map(process_of, files))
    return [not process_of(f) or per_process[process_of(f)] == 1 for f in files]


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
