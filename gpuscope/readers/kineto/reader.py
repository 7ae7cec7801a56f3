"""A folder (or file) of torch.profiler traces -> RunTable, with the HTA-compatible breakdown.

1. Decode each file (in parallel processes when there are several large ones) into numbers.
2. Find each file's rank (distributedInfo, else file name, else reported as unknown); files of the
   same rank (repeated profiler cycles) are concatenated.
3. Per rank: the HTA-compatible GPU breakdown and one row per ProfilerStep.
4. The collectives of every rank, as the table the analysis splits waiting from transfer with.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

import gpuscope.progress as progress
from ...errors import InputError, TraceFormatError
from ...runtable import RankInfo, RunTable, empty_frame
from ...trace_files import file_size
from .collectives import comm_table, sync_points
from .decode import DEVICE_KEY, head_facts
from ..memory_records import MEMORY_COLUMNS
from .parse import parse_all, alone_files, host_of, parse_alone, parse_file, process_of
from .rank import identify
from .summary import RankSummary, file_warnings, span, summarize


def read_kineto(path: str, files: list[str], jobs: int | None = None, parsed_ahead=None) -> RunTable:
    """`parsed_ahead`: a prefetch.Prefetch whose processes parsed some of `files` already (the
    command line's), or None."""
    with progress.reading(sum(file_size(f) for f in files), len(files), path):
        parsed, bad = _parse_or_skip(path, files, jobs, parsed_ahead)
    return table_of(path, parsed, bad)


def table_of(path: str, parsed: list, bad: list[str], facts: dict | None = None) -> RunTable:
    """The RunTable of the files parsed (here, or by the Ray engine's tasks: `facts`, what each
    file's head told, read where the file was); `bad`: the errors of those that could not be."""
    warnings = [f"skipped: {b}" for b in bad]
    if not parsed:
        raise TraceFormatError(f"{path}: no readable torch.profiler trace ({bad[0] if bad else ''})")
    return _table(path, parsed, warnings, facts)


def _parse_or_skip(path: str, files: list[str], jobs: int | None,
                   ahead=None) -> tuple[list, list]:
    """Every file parsed (those parsed already by processes the command line started first,
    `ahead`, are taken as they came); with several, a bad one is skipped (its error returned)."""
    early = ahead.take(files) if ahead is not None else {}  # the progress bar advanced as they came
    todo = [f for f in files if f not in early]
    parsed, bad = [], []
    try:
        parsed = parse_all(todo, jobs) if todo else []
    except TraceFormatError as exc:
        if len(files) == 1:
            raise
        bad.append(str(exc))  # one bad file among many: parse the rest one by one
        parsed = []
        alone = dict(zip(todo, alone_files(todo)))
        for f in todo if len(todo) > 1 else []:  # one left to parse: exc is its error
            try:
                parsed.append(parse_alone(f, alone[f]))
            except TraceFormatError as err:
                if str(err) not in bad:
                    bad.append(str(err))
    got = {item[0]: item for item in parsed}
    got.update(early)
    return [got[f] for f in files if f in got], bad


def _ranks_of_files(parsed: list, warnings: list[str], facts: dict | None) -> dict:
    """{rank: [(file, events or None, RankSummary or None)]} of the parsed files: each file's
    rank from its trace (or file name), several files of one rank kept to one run, files with
    no rank numbered after the known ones (joined to their process's or profiling session's
    rank where one is known). A file summed up where it was parsed (parse.prepared) comes
    without its events."""
    by_rank: dict[int, list] = {}
    worlds_of: dict[str, int | None] = {}
    unknown = []
    for f, info, ev, *rest in parsed:
        summary = rest[0] if rest else None
        warnings.extend(summary.warnings if summary is not None else file_warnings(f, ev))
        rid, w = identify(f, info)
        warnings.extend(w)
        if rid.rank is None:
            unknown.append((f, rid, ev))
            continue
        by_rank.setdefault(rid.rank, []).append((f, ev, summary, rid))
        worlds_of[f] = rid.world_size
    for rank in list(by_rank):
        if len(by_rank[rank]) > 1:
            by_rank[rank], said = one_run(rank, by_rank[rank], worlds_of, facts)
            warnings.extend(said)
    procs: dict[str, set] = {}  # {host}_{pid} of tensorboard_trace_handler's names -> ranks
    for rank, items in by_rank.items():
        for f, *_ in items:
            if process_of(f):
                procs.setdefault(process_of(f), set()).add(rank)
    next_free = max(by_rank, default=-1) + 1
    sessions: dict[tuple, int] = {}  # (file prefix, training thread) of unknown-rank files
    for f, rid, ev in unknown:  # reported above; numbered after the known ranks
        same = procs.get(process_of(f)) or set()
        if len(same) == 1:  # another profiler cycle of the same process names its rank
            rank = next(iter(same))
            by_rank[rank].append((f, ev, None, rid))
            warnings.append(f"{os.path.basename(f)}: analysed as rank {rank}, the rank of the "
                            "same process's other trace(s)")
            continue
        session = (os.path.basename(f).split(".", 1)[0], ev.step_thread)
        if session in sessions:  # one process profiled again: the same name, the same thread
            rank = sessions[session]
            by_rank[rank].append((f, ev, None, rid))
            warnings.append(f"{os.path.basename(f)}: analysed as rank {rank}: another profiling "
                            f"session of the same process (file prefix {session[0]!r}, "
                            f"training thread {session[1]})")
            continue
        sessions[session] = next_free
        by_rank[next_free] = [(f, ev, None, rid)]
        warnings.append(f"{os.path.basename(f)}: analysed as rank {next_free}")
        next_free += 1
    return by_rank


def _one_job(by_rank: dict, warnings: list[str]) -> dict:
    """The ranks of one run: one job's ranks are profiled at the same time, so their spans
    overlap; ranks on one host (or hosts unknown) whose spans do not are other runs (two
    unrelated traces in one folder, minutes apart, were analysed as one job's two ranks, with
    confidence high). The newest run is kept and the others named; ranks on several hosts are
    left as they are (their clocks differ)."""
    if len(by_rank) < 2 or len({host_of(it[0]) for v in by_rank.values() for it in v} - {""}) > 1:
        return by_rank
    spans = {}
    for rank, items in by_rank.items():
        got = [it[2].span if it[2] is not None else span(it[1]) for it in items]
        got = [x for x in got if x != (0, 0)]
        if got:
            spans[rank] = (min(a for a, _ in got), max(b for _, b in got))
    runs: list[list[int]] = []
    reach = 0
    for rank, (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        if runs and a <= reach:
            runs[-1].append(rank)
            reach = max(reach, b)
        else:
            runs.append([rank])
            reach = b
    if len(runs) < 2:
        return by_rank
    keep = set(runs[-1])
    left = sorted(os.path.basename(it[0]) for r, v in by_rank.items()
                  if r in spans and r not in keep for it in v)
    warnings.append(f"these traces are of {len(runs)} runs that did not run at the same time "
                    f"(one job's ranks are profiled together): analysed the newest, rank(s) "
                    f"{', '.join(map(str, sorted(keep)))}; left out {len(left)} file(s) "
                    f"({', '.join(left[:4])}{' ...' if len(left) > 4 else ''}): analyse them "
                    "apart")
    return {r: v for r, v in by_rank.items() if r in keep or r not in spans}


def _summary(rank: int, items: list) -> RankSummary:
    """The rank's summary: the one its only file came with, else made of its files' events
    (a file summed up where it was parsed, now joined to others, is parsed again here)."""
    if len(items) == 1 and items[0][2] is not None and items[0][2].rank == rank:
        return items[0][2]
    files = [(f, ev if ev is not None else parse_file(f)[2]) for f, ev, *_ in items]
    return summarize(rank, files)


def _trace_knobs(got: RankSummary, rid, first: str, facts: dict | None, in_flight: bool,
                 micro: list) -> tuple[dict, str]:
    """(A rank's knobs, the device its trace says it ran on) from its traces (`first`: its
    first file): the loader, the backend and the device, DDP's window in flight, the facts
    gpuscope.record told the profiler (cores, loading), its process groups, p2p, a pipeline's
    micro-batches."""
    knobs: dict = {}
    if got.loader == "single-process":
        knobs["num_workers"] = 0
    if rid.backend:
        knobs["backend"] = rid.backend
    knobs["device"] = "cuda" if got.has_device else "cpu"
    if in_flight:  # its rows' hidden communication is DDP's window in flight (steps.py)
        knobs["hidden_comm"] = "in_flight"
    # gpuscope.record beside the profiler: cores, loading
    told = dict(head_facts(first) if facts is None else facts.get(first, {}))
    device = told.pop(DEVICE_KEY, "")
    for k, v in told.items():
        knobs.setdefault(k, v)
    if rid.groups:
        knobs["process_groups"] = rid.groups
    if rid.mesh_dims:
        knobs["mesh_dims"] = rid.mesh_dims
    if got.p2p:
        knobs["p2p"] = True
    if micro and int(np.median(micro)) > 1:  # a pipeline schedule's micro-batches
        knobs["forwards_per_step"] = int(np.median(micro))
    return knobs, device


def _table(path: str, parsed: list, warnings: list[str], facts: dict | None = None) -> RunTable:
    """The RunTable of the parsed files, rank by rank from their summaries (summary.py): a
    rank's events, where they came at all, are let go once it is summed up."""
    by_rank = _one_job(_ranks_of_files(parsed, warnings, facts), warnings)
    del parsed[:]  # the caller's list: the events it held go with their rank below
    rows, colls, ranks, breakdown, memory = [], {}, {}, {}, []
    views: dict = {"ops": [], "messages": [], "kernels": []}
    kernel_types: dict = {}
    ids = {rank: items[0][3] for rank, items in by_rank.items()}
    for rank in sorted(by_rank):
        items = by_rank.pop(rank)
        got = _summary(rank, items)
        first = items[0][0]
        names = [os.path.basename(f) for f, *_ in items]
        del items
        if len(names) > 1:
            warnings.append(f"rank {rank}: {len(names)} trace files (repeated profiler cycles) "
                            "merged")
        r_rows = got.rows
        micro = [r.pop("microbatches") for r in r_rows]
        # (a list, not a generator: every row gives its key up, not only those before a hit)
        in_flight = any([r.pop("in_flight_ns", 0) > 0 for r in r_rows])
        views["ops"].append((rank, got.ops))
        views["messages"].append((rank, got.messages))
        views["kernels"].append((rank, got.kernels))
        if got.kernel_types is not None:
            kernel_types[rank] = got.kernel_types
        memory += got.memory
        warnings += [f"rank {rank}: {x}" for x in got.row_warnings]
        rows += r_rows
        colls[rank] = got.colls
        if got.hta:
            breakdown[rank] = got.hta
        knobs, device = _trace_knobs(got, ids[rank], first, facts, in_flight, micro)
        ranks[rank] = RankInfo(rank, host_of(first), knobs,
                               {"files": names, "rank_source": ids[rank].source,
                                "step_markers": got.step_markers,
                                # launches but no device event: the GPU was not profiled
                                "gpu_not_recorded": got.gpu_not_recorded,
                                "events": got.events,
                                **({"sync_sources": got.sync_sources} if got.sync_sources
                                   else {}),
                                # the device the trace says it ran on (deviceProperties)
                                **({"gpu": {"name": device}} if device and got.has_device
                                   else {})})
    frame = pd.DataFrame(rows) if rows else empty_frame()
    if not frame.empty:
        frame = frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
        frame["wait_ns"] = 0  # split from the collectives by the analysis (analyze/wait.py)
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
    mem = pd.DataFrame(memory, columns=list(MEMORY_COLUMNS)) if memory else None
    if mem is not None:
        mem[["rank", "step"]] = mem[["rank", "step"]].astype("int64")
    return RunTable(frame, "kineto", path, ranks, world, warnings, gpu_breakdown=breakdown,
                    comm=comm_table(colls), memory=mem, ops=_long(views["ops"]),
                    messages=_long(views["messages"]),
                    kernel_breakdown=_long(views["kernels"]), kernel_types=kernel_types)


def one_run(rank: int, items: list, worlds: dict, facts: dict | None) -> tuple[list, list[str]]:
    """A rank's files, less those that cannot be the same process profiled again: another
    device (deviceProperties), another world size (distributedInfo), another process
    (tensorboard_trace_handler's {host}_{pid}). Several kinds: the largest group is kept (the
    newest among equals); the others are named in a warning, to be analysed apart. Files of
    one process are merged as its profiler cycles, as before. `items`: (file, events or None,
    summary or None, rank id)."""
    def key(f):
        told = head_facts(f) if facts is None else facts.get(f, {})
        return (told.get(DEVICE_KEY, ""), worlds.get(f), process_of(f))

    def last(item):
        _, ev, summary, _ = item
        return summary.span[1] if summary is not None else span(ev)[1]

    groups: dict = {}
    for item in items:
        k = key(item[0])
        # an unknown part (no device written, no name of the handler's form) joins any group
        home = next((g for g in groups if all(a == b or not a or not b for a, b in zip(g, k))),
                    k)
        groups.setdefault(home, []).append(item)
    if len(groups) == 1:
        return items, []
    kept_key = max(groups, key=lambda g: (len(groups[g]), max(last(i) for i in groups[g])))
    kept = groups[kept_key]
    left = [i[0] for g, fs in groups.items() if g != kept_key for i in fs]
    what = []
    for i, name in ((0, "devices"), (1, "world sizes"), (2, "processes")):
        seen = sorted({str(g[i]) for g in groups if g[i]})
        if len(seen) > 1:
            what.append(f"{name} {', '.join(seen)}")
    return kept, [f"rank {rank}: {len(items)} trace files that cannot be one run ("
                  + "; ".join(what) + f"): analysed {', '.join(os.path.basename(i[0]) for i in kept)}"
                  f"; left out {', '.join(os.path.basename(f) for f in left)} (analyse them apart)"]


def _long(parts: list) -> pd.DataFrame | None:
    """One frame of the ranks' column dicts, a rank column first; None when all are empty.
    Each column joined once (a frame per rank, then their concat, took 5.6 s for 2,500
    ranks); ranks whose columns differ are joined as frames, as pandas joins them."""
    parts = [(r, c) for r, c in parts if len(next(iter(c.values())))]
    if not parts:
        return None
    names = list(parts[0][1])
    if all(list(c) == names for _, c in parts):
        sizes = [len(next(iter(c.values()))) for _, c in parts]
        out = pd.DataFrame({"rank": np.repeat(np.array([r for r, _ in parts], np.int64), sizes),
                            **{k: np.concatenate([np.asarray(c[k]) for _, c in parts])
                               for k in names}})
    else:
        out = pd.concat([pd.DataFrame({"rank": np.full(len(next(iter(c.values()))), r,
                                                         np.int64), **c})
                         for r, c in parts], ignore_index=True)
    for col in ("kind", "name", "type", "group", "collective", "dtype"):
        if col in out:
            out[col] = out[col].astype("category")
    return out
