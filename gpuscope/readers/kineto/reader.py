"""A folder (or file) of torch.profiler traces -> RunTable, with the HTA-compatible breakdown.

1. Decode each file (in parallel processes when there are several large ones) into numbers.
2. Find each file's rank (distributedInfo, else file name, else reported as unknown); files of the
   same rank (repeated profiler cycles) are concatenated.
3. Per rank: the HTA-compatible GPU breakdown and one row per ProfilerStep.
4. Across ranks: match collectives to split exposed communication into waiting and transfer.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import msgspec
import numpy as np
import pandas as pd

import gpuscope.progress as progress
from ...errors import InputError, TraceFormatError
from ...runtable import RankInfo, RunTable, empty_frame
from ..fork import _can_fork, _in_child  # noqa: F401 (tests reach them here)
from .collectives import match_collectives, sync_points
from ...trace_files import file_size
from .decode import (BATCH, Salvaged, batches, decode_trace, events_of, read_bytes,
                     split_events)
from .events import STEP, RankEvents, p2p_masks, sort_events
from .hta import gpu_breakdown
from .rank import RankId, identify
from .steps import rank_rows

PARALLEL_MIN_BYTES = 4 << 20  # a process pool pays for itself above this (more than 2 cores)


SPLIT_MIN_EVENTS = 4 * BATCH  # a file this big is sorted by two processes when allowed
SPLIT_TEXT_BYTES = 16 << 20   # JSON text from which the text itself is cut in two


def parse_file(path: str, split: bool = False) -> tuple[str, object, RankEvents]:
    """Decode and sort one file. With `split`, a big file's text is cut in two at an event
    boundary and each half is decoded and sorted by its own process (fork); the halves are
    joined like two profiler cycles. Anything unexpected falls back to one process."""
    blob = None
    if split and _can_fork() and file_size(path) >= SPLIT_TEXT_BYTES // 64:
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
    if not (split and len(raws) >= SPLIT_MIN_EVENTS and _can_fork()):
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
    return path, info, ev


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
    if c.get("bad_id"):
        out.append(f"{name}: stream or correlation ids past 64 bits in {c['bad_id']} batch(es) "
                   "of events read as unknown")
    return out


def _parse_all(files: list[str], jobs: int | None) -> list:
    """Parse every file: two processes share the work when there are two cores (files split
    in two groups by size, or one big file in two halves); a pool when there are more."""
    jobs = jobs if jobs is not None else min(max(len(files), 2), os.cpu_count() or 1)

    def parse(f, **kw):
        out = parse_file(f, **kw)
        progress.advance(file_size(f))
        return out

    if jobs <= 1 or not _can_fork():
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
    """(path, info, events, (rank, drop_last, rank_rows' result, GPU breakdown)): the rows of
    the file's rank as if it were that rank's only file, with the last step dropped when the
    file alone has two steps or more. _table uses them when both turn out so, and works them
    out itself otherwise."""
    f, info, ev = item[:3]
    rid, _ = identify(f, info)
    if rid.rank is None:
        return f, info, ev, None
    drop_last = np.unique(ev.step_id[ev.host_kind == STEP]).size >= 2
    return f, info, ev, (rid.rank, drop_last, rank_rows(ev, rid.rank, drop_last),
                         gpu_breakdown(ev, drop_last))


def process_of(path: str) -> str:
    """`{host}_{pid}` of tensorboard_trace_handler's `{host}_{pid}.{ts}.pt.trace.json`, or ""."""
    head = os.path.basename(path).split(".", 1)[0]
    host, sep, pid = head.rpartition("_")
    return head if host and sep and pid.isdigit() else ""


def host_of(path: str) -> str:
    """`{host}_{pid}.{ts}.pt.trace.json` -> host (tensorboard_trace_handler's naming)."""
    head = os.path.basename(path).split(".", 1)[0]
    host, sep, pid = head.rpartition("_")
    return host if sep and pid.isdigit() else ""


def read_kineto(path: str, files: list[str], jobs: int | None = None) -> RunTable:
    warnings: list[str] = []
    parsed, bad = [], []
    with progress.reading(sum(file_size(f) for f in files), len(files), path):
        parsed, bad = _parse_or_skip(path, files, jobs)
    warnings += [f"skipped: {b}" for b in bad]
    if not parsed:
        raise TraceFormatError(f"{path}: no readable torch.profiler trace ({bad[0] if bad else ''})")
    return _table(path, parsed, warnings)


def _parse_or_skip(path: str, files: list[str], jobs: int | None) -> tuple[list, list]:
    """Every file parsed; with several, a bad one is skipped (its error returned)."""
    parsed, bad = [], []
    try:
        parsed = _parse_all(files, jobs)
    except TraceFormatError as exc:
        if len(files) == 1:
            raise
        bad.append(str(exc))  # one bad file among many: parse the rest one by one
        for f in files:
            try:
                parsed.append(parse_file(f))
            except TraceFormatError as err:
                if str(err) not in bad:
                    bad.append(str(err))
    return parsed, bad


def _table(path: str, parsed: list, warnings: list[str]) -> RunTable:
    """The RunTable of the parsed files."""
    by_rank: dict[int, list] = {}
    ids: dict[int, RankId] = {}
    unknown = []
    ready = {item[0]: item[3] for item in parsed if len(item) > 3 and item[3] is not None}
    for f, info, ev, *_ in parsed:
        warnings += file_warnings(f, ev)
        rid, w = identify(f, info)
        warnings += w
        if rid.rank is None:
            unknown.append((f, rid, ev))
            continue
        by_rank.setdefault(rid.rank, []).append((f, ev))
        ids.setdefault(rid.rank, rid)
    procs: dict[str, set] = {}  # {host}_{pid} of tensorboard_trace_handler's names -> ranks
    for rank, items in by_rank.items():
        for f, _ in items:
            if process_of(f):
                procs.setdefault(process_of(f), set()).add(rank)
    next_free = max(by_rank, default=-1) + 1
    for f, rid, ev in unknown:  # reported above; numbered after the known ranks
        same = procs.get(process_of(f)) or set()
        if len(same) == 1:  # another profiler cycle of the same process names its rank
            rank = next(iter(same))
            by_rank[rank].append((f, ev))
            warnings.append(f"{os.path.basename(f)}: analysed as rank {rank}, the rank of the "
                            "same process's other trace(s)")
            continue
        by_rank[next_free] = [(f, ev)]
        ids[next_free] = rid
        warnings.append(f"{os.path.basename(f)}: analysed as rank {next_free}")
        next_free += 1

    step_names = set()
    for items in by_rank.values():
        for _, ev in items:
            step_names.update(ev.step_id[ev.host_kind == STEP].tolist())
    drop_last = len(step_names) >= 2  # HTA's default: the last step's work may be cut off

    rows, colls, ranks, breakdown = [], {}, {}, {}
    for rank in sorted(by_rank):
        items = by_rank[rank]
        ev = RankEvents.concat([e for _, e in items])
        if len(items) > 1:
            warnings.append(f"rank {rank}: {len(items)} trace files (repeated profiler cycles) "
                            "merged")
        pre = ready.get(items[0][0]) if len(items) == 1 else None
        if pre is not None and pre[:2] == (rank, drop_last):  # worked out beside the parse
            (r_rows, r_colls, w), hta = pre[2], pre[3]
        else:
            (r_rows, r_colls, w), hta = rank_rows(ev, rank, drop_last), gpu_breakdown(ev, drop_last)
        micro = [r.pop("microbatches") for r in r_rows]
        warnings += [f"rank {rank}: {x}" for x in w]
        rows += r_rows
        colls[rank] = r_colls
        if hta:
            breakdown[rank] = hta
        knobs = {}
        if ev.loader == "single-process":
            knobs["num_workers"] = 0
        if ids[rank].backend:
            knobs["backend"] = ids[rank].backend
        knobs["device"] = "cuda" if ev.dev_kind.size else "cpu"
        if ids[rank].groups:
            knobs["process_groups"] = ids[rank].groups
        if any(m.any() for m in p2p_masks(ev)):
            knobs["p2p"] = True
        if micro and int(np.median(micro)) > 1:  # a pipeline schedule's micro-batches
            knobs["forwards_per_step"] = int(np.median(micro))
        ranks[rank] = RankInfo(rank, host_of(items[0][0]), knobs,
                               {"files": [os.path.basename(f) for f, _ in items],
                                "rank_source": ids[rank].source,
                                "events": ev.counts.get("events", 0)})
    frame = pd.DataFrame(rows) if rows else empty_frame()
    if not frame.empty:
        frame = frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
        frame = match_collectives(colls, frame, warnings)
    hosts = {r: info.host for r, info in ranks.items()}
    if len(set(hosts.values()) - {""}) > 1:  # several hosts: several clocks (clocks.py)
        from ...clocks import host_offsets

        for r, shift in host_offsets(*sync_points(colls), hosts).items():
            ranks[r].meta["clock_offset_ns"] = shift
    worlds = [r.world_size for r in ids.values() if r.world_size]
    world = max(worlds + [len(ranks), max(ranks, default=-1) + 1])
    if world > len(ranks):
        warnings.append(f"traces for {len(ranks)} of {world} ranks; the others are missing")
    if frame.empty:
        raise InputError(f"{path}: the traces hold no events gpuscope can use")
    return RunTable(frame, "kineto", path, ranks, world, warnings, gpu_breakdown=breakdown)
