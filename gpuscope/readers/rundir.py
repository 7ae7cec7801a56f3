"""Reads a run dir written by gpuscope.record into a RunTable.

A run dir can hold several recordings (a script run twice into the same dir): each wrote its own
rank files (rank-00000.gpuscope.jsonl, then rank-00000-2.gpuscope.jsonl, ...). They are never
merged: files are grouped into recordings (ranks of one recording ran at the same time, and share
the launcher's job id when it has one), and the newest recording is read, with a warning naming
the others; giving one rank file as the path reads the recording that file belongs to.
"""

from __future__ import annotations

import datetime
import glob
import os
from itertools import chain
from operator import itemgetter
from dataclasses import dataclass, field

import msgspec
import numpy as np
import pandas as pd

import gpuscope.progress as progress
from .._log import logger
from ..errors import InputError, TraceFormatError
from ..run_format import (COLUMN_DEFAULTS, FILE_GLOB, NVML_FIELDS, NVML_FIELDS_V1, SCHEMA,
                          STEP_COLUMNS, columns_path, is_p2p, is_record_file, parse_file_name)
from ..runtable import RankInfo, RunTable, empty_frame, key_parts, mask_of, parts_of_codes
from ..trace_files import file_size
from .speed import bulk, forks
from .record_body import BLOCK_ROWS, block_columns, coded, decode_body, with_implied
from .memory_records import capacity_of, memory_frame, memory_ok
from .module_records import modules_frame, modules_ok
from .routing_records import routing_frame, routing_ok
from .readahead import Ahead, advise_record
from .record_columns import read_columns
from .record_file import RecordBytes, unchanged_since_side
from .warm_split import WarmRows, merged, split_file, unsplit, warm_columns, warm_frame
from .validate import (MAX_NS, MAX_RANKS, MAX_STEP, MAX_UNIX_NS, Tally, clean_knobs,
                       column_bounds, is_int, is_num)

_decoder = msgspec.json.Decoder()
_decode, _decode_lines = _decoder.decode, _decoder.decode_lines


@dataclass
class RankFile:
    """One rank file, read: header (knobs merged), step rows, side records, end record."""

    path: str
    header: dict
    rows: list
    end: dict
    device: list = field(default_factory=list)
    nvml: list = field(default_factory=list)
    dataparallel: dict = field(default_factory=dict)  # the latest DataParallel totals
    memory: list = field(default_factory=list)  # memory records (memory_records.py)
    routing: list = field(default_factory=list)  # all-to-all rows (routing_records.py)
    modules: list = field(default_factory=list)  # module forward times (module_records.py)
    stalls: list = field(default_factory=list)  # the stall watcher's records (stall.py)
    stall_ends: list = field(default_factory=list)  # ... and when steps resumed after each
    warnings: list[str] = field(default_factory=list)
    row_lines: list[int] = field(default_factory=list)  # line number of each row
    tally: Tally | None = None  # what was skipped while reading
    frame: pd.DataFrame | None = None  # the step rows as read (built; then rows keeps only
    comm: tuple | None = None          # the first and the last row) and their collectives
    n_rows: int = 0
    block: np.ndarray | None = None  # record_body.BLOCK_ROWS x rows: frame's columns are its rows
    warm: dict | None = None  # its first rows, set apart from frame and block (warm_split.py)

    def __getstate__(self) -> dict:
        """Pickled (the Ray engine's tasks) without the frame's views of the block: they would
        travel as copies of it."""
        state = dict(self.__dict__)
        if self.block is not None and self.frame is not None:
            state["frame"] = {k: v for k, v in self.frame.items() if k not in BLOCK_ROWS}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self.block, np.ndarray) and self.frame is not None:
            self.frame = {**block_columns(self.block), **self.frame}

    @property
    def rank(self) -> int:
        return int(self.header.get("rank", -1))

    @property
    def run_id(self) -> str:
        rid = self.header.get("run_id")
        return rid if isinstance(rid, str) else ""

    def span(self) -> tuple[int, int]:
        """[start, end] of the recording on this rank, unix ns."""
        start = self.header.get("start_unix_ns")
        if not is_int(start, 0, MAX_UNIX_NS):
            first = self.rows[0] if self.rows else None
            start = first[1] if first and len(first) > 1 and is_int(first[1], 0, MAX_UNIX_NS) else 0
        ends = [start]
        if isinstance(self.end.get("end_unix_ns"), int):
            ends.append(self.end["end_unix_ns"])
        last = self.rows[-1] if self.rows else None
        if last and len(last) > 2 and is_int(last[1], 0, MAX_UNIX_NS) and is_int(last[2]):
            ends.append(last[1] + last[2])
        return start, max(ends)


def _header(path: str, line: bytes) -> dict:
    try:
        header = _decode(line)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: first line is not a gpuscope header ({exc})") from None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise TraceFormatError(f"{path}: not a {SCHEMA} file (schema={header.get('schema')!r})"
                               if isinstance(header, dict) else f"{path}: not a gpuscope file")
    return header


def _check_header(header: dict, name: str, tally: Tally) -> None:
    """Fields of the header that do not fit are replaced by what can be known without them."""
    if not is_int(header.get("rank"), 0, MAX_RANKS - 1):
        parsed = parse_file_name(name)
        header["rank"] = parsed[0] if parsed else 0
        tally.add("header field(s) ('rank': taken from the file name)", 1)
    for key, lo, hi in (("world_size", 1, MAX_RANKS), ("start_unix_ns", 0, MAX_UNIX_NS),
                        ("pid", 0, 1 << 40), ("local_rank", 0, 1 << 31)):
        if key in header and header[key] is not None and not is_int(header[key], lo, hi):
            del header[key]
            tally.add(f"header field(s) ('{key}')", 1)
    for key in ("host", "run_id", "comm_timing", "placement_source", "comm_key"):
        if key in header and not isinstance(header[key], str):
            del header[key]
            tally.add(f"header field(s) ('{key}')", 1)
    cols = header.get("columns")
    if not (isinstance(cols, list) and cols and all(isinstance(c, str) for c in cols)
            and len(set(cols)) == len(cols) and cols[:3] == list(STEP_COLUMNS[:3])):
        if cols is not None:
            tally.add("header field(s) ('columns': the current layout assumed)", 1)
        header["columns"] = list(STEP_COLUMNS)


def _device_ok(item) -> bool:
    return (isinstance(item, dict) and is_int(item.get("step"), 0, MAX_STEP)
            and all(isinstance(k, str) and is_int(v) for k, v in item.items()))


def _nvml_ok(sample) -> bool:
    return (isinstance(sample, list) and len(sample) in (NVML_FIELDS_V1, len(NVML_FIELDS))
            and is_int(sample[0], 0, MAX_UNIX_NS)
            and all(v is None or is_num(v, 0.0, 1e18) for v in sample[1:]))


def _dataparallel_ok(d) -> bool:
    def ns_map(m):
        return m is None or (isinstance(m, dict) and all(is_int(v, 0, MAX_UNIX_NS)
                                                         for v in m.values()))

    return (isinstance(d, dict) and isinstance(d.get("devices", []), list)
            and all(isinstance(x, (str, int)) for x in d.get("devices", []))
            and (d.get("steps") is None or is_int(d.get("steps"), 0, MAX_STEP))
            and all(ns_map(d.get(k)) for k in ("forward_n", "forward_ns", "host_ns"))
            and (d.get("peak_bytes") is None or (isinstance(d["peak_bytes"], dict) and all(
                v is None or is_int(v, 0, 1 << 60) for v in d["peak_bytes"].values()))))


def _end_ok(end) -> bool:
    return (isinstance(end, dict)
            and all(is_int(end[k], 0, MAX_UNIX_NS) for k in ("steps", "end_unix_ns") if
                    end.get(k) is not None)
            and isinstance(end.get("warnings", []), list)
            and all(isinstance(end[k], str) for k in ("recorder_error", "comm_hook", "terminated",
                                                    "error")
                    if end.get(k) is not None))


def _stall_ok(x) -> bool:
    """A stall record (or its end): a dict with the step and times the watcher writes."""
    return isinstance(x, dict) and is_int(x.get("step"), 0, MAX_STEP) and all(
        is_int(x[k], 0, MAX_UNIX_NS) for k in ("since_unix_ns", "noticed_unix_ns",
                                                "resumed_unix_ns") if k in x)


def _knobs_record(value, out: "RankFile", knobs: dict, tally: Tally, at: int) -> None:
    clean, bad = clean_knobs(value)
    knobs.update(clean)
    if bad:
        tally.add("knob value(s) of the wrong type", at, bad)


def _end_record(value, out: "RankFile", knobs: dict, tally: Tally, at: int) -> None:
    if _end_ok(value):
        out.end = value
    else:
        tally.add("malformed end record(s)", at)


def _samples(attr: str, ok, what: str):
    """A record holding a list of samples: the good ones join `attr`, the rest are counted."""
    def handle(value, out, knobs, tally, at):
        items = value if isinstance(value, list) else [None]
        good = [x for x in items if ok(x)]
        getattr(out, attr).extend(good)
        if len(good) < len(items):
            tally.add(what, at, len(items) - len(good))
    return handle


def _one(attr: str, ok, what: str, replaces: bool = False):
    """A record that is one item: appended to `attr` (or replacing it), else counted."""
    def handle(value, out, knobs, tally, at):
        if not ok(value):
            tally.add(what, at)
        elif replaces:
            setattr(out, attr, value)
        else:
            getattr(out, attr).append(value)
    return handle


#: one handler for each of run_format.SIDE_RECORDS (tests/test_vocabulary.py checks they agree)
SIDE_HANDLERS = {
    "knobs": _knobs_record,
    "end": _end_record,
    "device": _samples("device", _device_ok, "malformed device time(s)"),
    "nvml": _samples("nvml", _nvml_ok, "malformed NVML sample(s)"),
    "memory": _one("memory", memory_ok, "malformed memory record(s)"),
    "routing": _one("routing", routing_ok, "malformed all-to-all row record(s)"),
    "modules": _one("modules", modules_ok, "malformed module time record(s)"),
    "dataparallel": _one("dataparallel", _dataparallel_ok, "malformed DataParallel record(s)",
                         replaces=True),
    "stall": _one("stalls", _stall_ok, "malformed stall record(s)"),
    "stall_end": _one("stall_ends", _stall_ok, "malformed stall_end record(s)"),
}


def _side_record(obj: dict, out: "RankFile", knobs: dict, tally: Tally, at: int) -> None:
    """A side record (run_format.SIDE_RECORDS): its handler; keys it does not know are
    left (a newer recorder's)."""
    for key, value in obj.items():
        handle = SIDE_HANDLERS.get(key)
        if handle is not None:
            handle(value, out, knobs, tally, at)


_BAD = object()  # a line that is not JSON


def _objects(body: list, text: bytes = b"") -> tuple[list | None, list]:
    """(indices in body or None when the i-th object is line i, the decoded objects, _BAD for a
    line that is not JSON) of the non-blank lines. All lines are decoded in one call (msgspec's
    decode_lines: each line on its own, blank ones skipped; a call per line costs more than the
    parsing); when that fails (a corrupt or cut line), line by line. `text`: the body's lines
    as one buffer, when the caller has it."""
    n = len(body) - (1 if body and not body[-1] else 0)  # a last newline ends the last line
    idx = [i for i, line in enumerate(body) if line and not line.isspace()]
    if not bulk():
        return idx, _one_by_one(body, idx)
    try:
        objs = _decode_lines(text or b"\n".join(body))
        if len(objs) == n and min(map(len, body[:n]), default=1):  # no blank line: 1 object each
            return None, objs
    except msgspec.DecodeError:
        objs = None
    if objs is not None and len(objs) == len(idx):
        return idx, objs
    return idx, _one_by_one(body, idx)


def _one_by_one(body: list, idx: list) -> list:
    """The lines at `idx` decoded one by one, _BAD for one that is not JSON."""
    out = []
    for i in idx:
        try:
            out.append(_decode(body[i]))
        except msgspec.DecodeError:
            out.append(_BAD)
    return out


def read_rank_file(path: str, build: bool = False, place=None) -> RankFile:
    """One rank file. What does not fit is skipped and counted (one warning per kind); a last
    line cut mid-write is dropped; a file without its end record (killed run) gets a warning.
    Only a file without a readable header is an error. `build`: the step rows are turned into
    `frame` / `comm` columns, and only the first and the last are kept in `rows`; `place`:
    where their block goes (rowblock.Region.place)."""
    quick = build and bulk() and unchanged_since_side(path)  # the side file may stand for it
    record = _readable(path, lambda: RecordBytes.read(path, head=quick))
    blob = record.data
    name = os.path.basename(path)
    cut = blob.find(b"\n")
    first = blob if cut < 0 else blob[:cut]
    if not first.strip():
        raise TraceFormatError(f"{path}: empty record file (the run wrote nothing)")
    header = _header(path, first)
    tally = Tally(name)
    _check_header(header, name, tally)
    knobs, bad = clean_knobs(header.get("knobs") or {})
    if bad:
        tally.add("knob value(s) of the wrong type", 1, bad)
    out = RankFile(path, header, [], {})
    fast = None
    if build and cut >= 0 and bulk():  # the column side file, else the common shape
        fast = read_columns(path, record, cut + 1, header["columns"], out.rank, place)
        blob = blob if fast is not None else _readable(path, record.whole)
        fast = fast or decode_body(blob[cut + 1:], header["columns"], out.rank, place)
    if fast is not None:
        for at, obj in fast.side:
            _side_record(obj, out, knobs, tally, at)
        comm = fast.comm if fast.coded else coded(fast.comm)
        out.frame, out.comm = (fast.columns, comm) if fast.n_rows else (None, None)
        out.block = fast.block if fast.n_rows else None
        out.rows, out.n_rows = fast.ends, fast.n_rows
    else:
        _read_body(blob, first, out, knobs, tally)
        if build:
            out.n_rows = len(out.rows)
            if out.rows:
                out.frame, comm = _frame(out.rank, header["columns"], out.rows, out.row_lines,
                                         tally)
                out.comm = coded(comm)
                out.rows, out.row_lines = [out.rows[0], out.rows[-1]], []
    key = header.get("comm_key")
    if out.frame is not None and isinstance(key, str) and key:
        out.comm = with_implied(out.frame, out.comm, key)
    out.tally = tally
    _end_warnings(out, name)
    header["knobs"] = knobs
    return out


def _readable(path: str, read):
    """read(), its OSError one clear error naming the file."""
    try:
        return read()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_body(blob: bytes, first: bytes, out: RankFile, knobs: dict, tally: Tally) -> None:
    """The careful path: line by line where needed, every bad value skipped and counted."""
    lines = blob.split(b"\n")
    warnings, name = out.warnings, os.path.basename(out.path)
    body = lines[1:]
    cut_tail = bool(body) and body[-1] != b""  # file does not end with a newline
    idx, objs = _objects(body, blob[len(first) + 1:])
    types = list(map(type, objs))
    n_rows = types.count(list)
    if idx is None and n_rows == len(objs):  # step rows only (a record without knobs)
        out.rows, out.row_lines = objs, range(2, len(objs) + 2)
        items = []
    elif idx is None and (len(objs) - n_rows) * 8 < len(objs):  # rows and a few records
        out.rows = [o for o, t in zip(objs, types) if t is list]
        out.row_lines = [i + 2 for i, t in enumerate(types) if t is list]
        items = [(i, o) for i, (o, t) in enumerate(zip(objs, types)) if t is not list]
    else:
        items = list(zip(idx if idx is not None else range(len(objs)), objs))
    for i, obj in items:
        if obj is _BAD:
            if i == len(body) - 1 and cut_tail:
                warnings.append(f"{name}: last line was cut mid-write and is ignored")
            else:
                tally.add("corrupt line(s)", i + 2)
            continue
        if type(obj) is list:
            out.rows.append(obj)
            out.row_lines.append(i + 2)
        elif isinstance(obj, dict):
            _side_record(obj, out, knobs, tally, i + 2)
        else:
            tally.add("line(s) that are neither a step row nor a record", i + 2)


def _end_warnings(out: RankFile, name: str) -> None:
    """How the recording ended, when not cleanly."""
    from ..stall_story import in_step

    warnings, end = out.warnings, out.end
    if not end:
        last = out.rows[-1][0] if out.rows and out.rows[-1] else None
        warnings.append(f"{name}: no end record: the run was cut (killed or crashed) "
                        + (f"after its recorded step {last}; the last few steps may be missing"
                           if isinstance(last, int) else "before any of its steps was written"))
    elif end.get("terminated"):
        warnings.append(f"{name}: terminated by {end['terminated']} "
                        + (in_step(end.get("steps")) or "") + " (the recording was closed first)")
    elif end.get("crashed"):
        warnings.append(f"{name}: training raised an exception "
                        + (in_step(end.get("steps")) or ""))
    if end.get("recorder_error"):
        warnings.append(f"{name}: recording stopped early: {end['recorder_error']}")
    warnings += [f"{name}: {w}" for w in end.get("warnings", []) if isinstance(w, str)]


def load_rank_file(path: str, region=None, warm: int = 0) -> RankFile:
    """read_rank_file, with the step rows turned into columns right away and the decoded rows
    let go (only the first and the last are kept, for the recording's span); `region`: a
    rowblock.Region the columns are written into, the first `warm` rows set apart
    (warm_split.split_file) where asked."""
    if region is None:
        return read_rank_file(path, build=True)
    got = read_rank_file(path, build=True, place=region.place)
    if warm > 0:
        split_file(got, region, warm)
    region.commit(got.block)
    return got


#: read files in two processes from this many files or bytes on (fork: a second core)
PARALLEL_MIN_FILES = 64
PARALLEL_MIN_BYTES = 32 << 20
CHILD_SHARE = 0.45  # of the bytes: it also copies what it read into the shared arena
ARENA_PER_BYTE = 4  # bytes of columns per byte of file, at most (see _load_all)


def _child_cut(sizes: list[int]) -> int:
    """How many of the files (their sizes, in order) the child process reads: the first ones,
    up to CHILD_SHARE of the bytes (it also copies its collectives into the shared arena, so it
    takes a little less)."""
    total, acc = sum(sizes), 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= CHILD_SHARE * total:
            return i + 1
    return len(sizes)


def _row_block(n_rows: int, spill, warnings: list[str]):
    """One block for every file's step rows: in a file under `spill` where the plan spills
    (held in memory instead when that file cannot be made, and said), else in memory; None
    when it cannot be mapped at all (each file then its own arrays)."""
    from .rowblock import RowBlock

    for where in (spill, None) if spill is not None else (None,):
        try:
            return RowBlock(n_rows, where)
        except OSError as exc:
            if where is not None:  # a full disk: the table stays in memory, and that is said
                warnings.append(f"the step table could not be kept in a file under {where} "
                                f"({exc.strerror or exc}): it is held in memory")
        except (ValueError, OverflowError):  # no room to map it: each file its own arrays
            return None
    return None


def _load_files(batch: list[str], scale: float = 1.0, region=None,
                sizes: list[int] | None = None, warm: int = 0) -> list:
    """(name, RankFile or the TraceFormatError) per file of `batch`, read in this process.
    `scale`: each file counted that many times on the bar (the child reads meanwhile); a
    region filled from its right end takes the files last to first. `sizes`: the files'
    bytes, in batch order, where the caller has them."""
    down = region is not None and region.downward
    out = []
    order = list(reversed(batch) if down else batch)
    sizes = [file_size(n) for n in batch] if sizes is None else list(sizes)
    if down:
        sizes.reverse()
    # the disk asked for the next files while one is decoded: a record file and its side
    # file (about as large) each, or the side file and the record file's head (advise_record)
    ahead = Ahead(order, [2 * b for b in sizes], ask=advise_record)
    for i, name in enumerate(order):
        ahead.before(i)
        try:
            out.append((name, load_rank_file(name, region, warm)))
        except TraceFormatError as exc:
            out.append((name, exc))
        progress.advance(int(sizes[i] * scale))
    return out[::-1] if down else out


def _load_all(names: list[str], warnings: list[str], warm: int = 0) -> tuple[list, tuple | None]:
    """(name, RankFile or the TraceFormatError) per file, and (the RowBlock their columns were
    written into, its regions) or None; a big run dir is read by two processes (the child takes
    the first files), anything unexpected falls back to one. A run dir that may need more
    memory than is available says so first (`warnings`, and the log, before it is read)."""
    from .fork import SharedArena, in_child
    from .rowblock import Region, memory_plan, rows_bound, side_rows_bound

    big = len(names) >= PARALLEL_MIN_FILES or (
        len(names) >= 2 and sum(file_size(n) for n in names) >= PARALLEL_MIN_BYTES)
    if not big:
        return _load_files(names), None
    sides = [side_rows_bound(n) for n in names]
    # files without a side file are not counted: their JSON's bound is too loose to warn on
    too_big, spill = memory_plan(sum(b for b in sides if b is not None), shared=forks())
    if too_big is not None:  # said before reading: the analysis may be stopped for memory
        logger.warning("gpuscope: %s: %s", os.path.dirname(names[0]) or ".", too_big)
        warnings.append(too_big)
    if not forks():
        return _load_files(names), None
    sizes = [file_size(n) for n in names]
    cut = _child_cut(sizes)
    theirs, mine = names[:cut], names[cut:]
    share = sum(sizes[cut:]) / max(sum(sizes), 1)
    # the child's collectives come back through shared memory: a row of the file takes at
    # least 32 bytes, a collective at least 12 and gives 40
    try:
        arena = SharedArena(ARENA_PER_BYTE * sum(sizes[:cut]) + (1 << 20), spill)
    except (OSError, ValueError, OverflowError):  # no room to map it: pickled through the pipe
        arena = SharedArena(0)
    bounds = [b if b is not None else rows_bound(n) for n, b in zip(names, sides)]
    rows = _row_block(sum(bounds), spill, warnings)
    # the child's region fills leftwards from the parent's: they meet with no gap to close
    regions = ([Region(rows, 0, sum(bounds[:cut]), downward=True),
                Region(rows, sum(bounds[:cut]), sum(bounds[cut:]))]
               if rows is not None else [None, None])

    def child():
        out = []
        for name, got in _load_files(theirs, region=regions[0], sizes=sizes[:cut], warm=warm):
            if rows is not None and isinstance(got, RankFile):
                got.block = rows.marker(got.block)
            out.append((name, _packed(got, arena.put)))
        return out, regions[0].used if regions[0] is not None else 0

    with in_child(child) as collect:
        # the bar tracks the parent's half
        done = _load_files(mine, 1.0 / max(share, 1e-9), regions[1], sizes[cut:], warm)
        status, value = collect()
    if status == "ok":
        value, used = value
        if regions[0] is not None:
            regions[0].used = used  # what the child wrote into its region
        for name, got in value:
            got = _packed(got, arena.get)
            if rows is not None and isinstance(got, RankFile) and got.block is not None:
                got.block = rows.view(got.block)
                got.frame = {**block_columns(got.block), **(got.frame or {})}
            done.append((name, got))
    else:
        if regions[0] is not None:
            regions[0].used = 0
        done += _load_files(theirs, 0.0, regions[0], sizes[:cut], warm)
    order = {n: i for i, n in enumerate(names)}
    return sorted(done, key=lambda item: order[item[0]]), (
        (rows, regions) if rows is not None else None)


def _packed(got, move):
    """A RankFile with each array of its columns passed through `move` (into or out of the
    shared arena); an error as it is. A block moves once, as a whole (the frame's views of it
    are made again where it arrives); one already placed (rowblock.InBlock) as it is."""
    if isinstance(got, RankFile):
        if got.block is not None and got.frame is not None:
            got.block = move(got.block)
            rest = {k: move(v) for k, v in got.frame.items() if k not in BLOCK_ROWS}
            got.frame = ({**block_columns(got.block), **rest}
                         if isinstance(got.block, np.ndarray) else rest)
        elif got.frame is not None:
            got.frame = {k: move(v) for k, v in got.frame.items()}
        if got.comm is not None:
            got.comm = tuple(move(v) for v in got.comm)
        if got.warm is not None:
            got.warm = {k: move(v) for k, v in got.warm.items()}
    return got


def group_recordings(files: list[RankFile]) -> list[list[RankFile]]:
    """Split rank files into recordings, oldest first.

    Ranks of one recording run at the same time, so their [start, end] spans overlap; a later
    recording into the same dir starts after the earlier one ended. Files are swept in order of
    start: a file joins the current recording when it starts before that recording's last end
    and its job id (when both have one) is the same; otherwise it starts a new recording."""
    groups: list[list[RankFile]] = []
    reach = None
    ids: set = set()
    # a file with a job id and nothing after its header (the rank killed before its first
    # flush) has no span of its own: it joins the recording of its job that it started in
    bare = [f for f in files if f.run_id and not f.rows and not f.end]
    spare = {id(f) for f in bare}
    for f in sorted((f for f in files if id(f) not in spare), key=lambda f: f.span()[0]):
        start, end = f.span()
        rid = f.run_id
        if groups and start <= reach and (not rid or not ids or ids == {rid}):
            groups[-1].append(f)
            reach = max(reach, end)
            ids |= {rid} - {""}
        else:
            groups.append([f])
            reach, ids = end, {rid} - {""}
    for f in bare:
        mine = [g for g in groups if any(x.run_id == f.run_id for x in g)]
        start = f.span()[0]
        # the first recording of its job that ends after it started (they start together)
        home = next((g for g in mine if max(x.span()[1] for x in g) >= start), None)
        if home is not None:
            home.append(f)
        else:
            groups.append([f])
    groups.sort(key=lambda g: min(x.span()[0] for x in g))
    return groups


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="seconds")


def _pick_recording(path: str, files: list[RankFile], want: str | None,
                    warnings: list[str]) -> list[RankFile]:
    groups = group_recordings(files)
    if want is None:
        chosen = groups[-1]
    else:
        chosen = next(g for g in groups if any(f.path == want for f in g))
    if len(groups) > 1:
        others = sorted(os.path.basename(f.path) for g in groups if g is not chosen for f in g)
        which = "the newest" if want is None else "the one that holds " + os.path.basename(want)
        warnings.append(
            f"this run dir holds {len(groups)} recordings; analysed {which} (started "
            f"{_when(min(f.span()[0] for f in chosen))}, {len(chosen)} rank file(s)); left out "
            f"{len(others)} file(s) of the other recording(s) ({', '.join(others[:4])}"
            f"{' ...' if len(others) > 4 else ''}): give one of them as the path to analyse its "
            "recording")
    by_rank: dict[int, RankFile] = {}
    for f in chosen:
        seen = by_rank.get(f.rank)
        if seen is None:
            by_rank[f.rank] = f
            continue
        keep, drop = (f, seen) if f.n_rows > seen.n_rows else (seen, f)
        by_rank[f.rank] = keep
        warnings.append(f"two files for rank {f.rank} in one recording; kept "
                        f"{os.path.basename(keep.path)} ({keep.n_rows} steps), left out "
                        f"{os.path.basename(drop.path)}")
    return [by_rank[r] for r in sorted(by_rank)]


def _bounds(cols: list[str]) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = zip(*map(column_bounds, cols)) if cols else ((), ())
    return np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)


def _int_rows(rows: list, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows x width int64 array, mask of the rows whose first `width` values are all ints; a
    row of ints past int64 is all -2, out of range). Fast path: every value an int (one pass
    over their types), numpy takes them all at once; else row by row."""
    fixed = list(map(itemgetter(slice(0, width)), rows))
    flat = list(chain.from_iterable(fixed))
    if len(flat) == len(fixed) * width and set(map(type, flat)) == {int}:
        try:
            return (np.fromiter(flat, np.int64, len(flat)).reshape(len(fixed), width),
                    np.ones(len(fixed), dtype=bool))
        except OverflowError:  # an int past int64: row by row below
            pass
    try:
        arr = np.array(fixed)
        if arr.ndim == 2 and arr.dtype.kind == "i":
            return arr.astype(np.int64, copy=False), np.ones(len(fixed), dtype=bool)
    except (ValueError, TypeError, OverflowError):
        pass
    ok = np.array([all(type(v) is int for v in r) for r in fixed], dtype=bool)
    fits = np.array([k and all(-(1 << 63) <= v < (1 << 63) for v in r)
                     for r, k in zip(fixed, ok.tolist())], dtype=bool)
    arr = np.full((len(fixed), width), -2, dtype=np.int64)  # -2: out of every column's range
    good = [r for r, k in zip(fixed, fits.tolist()) if k]
    if good:
        arr[fits] = np.array(good, dtype=np.int64)
    return arr, ok


def _extra(e, tally: Tally, line: int) -> tuple[dict | None, list, int]:
    """A row's trailing object: (named phases, collectives [(key, comm, exposed, count)],
    batch samples or -1), values that do not fit dropped and counted."""
    if not isinstance(e, dict):
        if e is not None:
            tally.add("trailing value(s) of step rows (not an object)", line)
        return None, [], -1
    phases, comm, samples, bad = {}, [], -1, 0
    for key, v in e.items():
        if key == "_comm":
            for k, c in (v.items() if isinstance(v, dict) else [(None, None)]):
                if isinstance(k, str) and isinstance(c, list) and len(c) == 3 and \
                        all(is_int(x) for x in c):
                    comm.append((k, *c))
                else:
                    bad += 1
        elif key == "_samples":
            if is_int(v, 0, 1 << 40):
                samples = v
            else:
                bad += 1
        elif is_int(v):
            phases[key] = v
        else:
            bad += 1
    if bad:
        tally.add("phase or collective value(s) of the wrong type or out of range", line, bad)
    return phases or None, comm, samples


def _frame(rank: int, cols: list[str], rows: list[list], lines: list[int],
           tally: Tally) -> tuple[dict, tuple | None]:
    """The rank's step rows as columns ({name: array}: "rank", STEP_COLUMNS (those a file of an
    older version lacks get their default), "phases" / "samples" where rows have them), and its
    collectives as columns (steps, keys, [[comm_ns, exposed_ns, count]]).
    Rows too short, with values of the wrong type, out of range, or repeating a step already
    read are skipped and counted."""
    width = len(cols)
    long_enough = [len(r) >= width for r in rows]
    if not all(long_enough):
        tally.add("step row(s) with too few values", lines[long_enough.index(False)],
                  long_enough.count(False))
        rows = [r for r, k in zip(rows, long_enough) if k]
        lines = [n for n, k in zip(lines, long_enough) if k]
    arr, ok = _int_rows(rows, width) if rows else (np.zeros((0, width), np.int64),
                                                    np.zeros(0, bool))
    if not ok.all():
        tally.add("step row(s) with values of the wrong type", lines[int(np.argmin(ok))],
                  int((~ok).sum()))
    lo, hi = _bounds(cols)
    inside = ok & ((arr >= lo) & (arr <= hi)).all(axis=1)
    if (ok & ~inside).any():
        tally.add("step row(s) with values out of range (negative or huge)",
                  lines[int(np.argmax(ok & ~inside))], int((ok & ~inside).sum()))
    step_col = cols.index("step")
    _, first = np.unique(np.where(inside, arr[:, step_col], -1), return_index=True)
    keep = np.zeros(len(rows), dtype=bool)
    keep[first] = True
    keep &= inside
    dup = inside & ~keep
    if dup.any():
        tally.add("step row(s) repeating a step already read", lines[int(np.argmax(dup))],
                  int(dup.sum()))
    idx = np.flatnonzero(keep)
    at = {c: i for i, c in enumerate(cols)}
    kept = arr[idx] if idx.size < len(arr) else arr
    df = {"rank": np.full(idx.size, rank, np.int64)}
    for col in STEP_COLUMNS:
        df[col] = (np.ascontiguousarray(kept[:, at[col]]) if col in at else
                   np.full(idx.size, COLUMN_DEFAULTS.get(col, 0), np.int64))
    lengths = set(map(len, rows))
    if lengths == {width}:
        return df, None
    if lengths == {width + 1} and idx.size == len(rows):  # every row has its trailing object
        extras = list(map(itemgetter(width), rows))
    else:
        extras = [rows[i][width] if len(rows[i]) > width else None for i in idx.tolist()]
    if all(e is None for e in extras):
        return df, None
    steps = df["step"]
    fast = _comm_only(steps, extras) if bulk() else None
    if fast is not None:
        return df, fast
    phases, samples, at, keys, vals = [], [], [], [], []
    for step, e, i in zip(steps.tolist(), extras, idx.tolist()):
        ph, cm, n = _extra(e, tally, lines[i])
        for key, *v in cm:
            at.append(step)
            keys.append(key)
            vals.append(v)
        phases.append(ph)
        samples.append(n)
    if any(phases):
        df["phases"] = phases
    if any(n >= 0 for n in samples):
        df["samples"] = np.array(samples, np.int64)  # the batch's size where it differed
    comm = (np.array(at, np.int64), keys, np.array(vals, np.int64).reshape(-1, 3)) if keys else None
    return df, comm


def _comm_only(steps: np.ndarray, extras: list) -> tuple | None:
    """The common case, checked in bulk: every trailing object is {"_comm": {key: [3 ints in
    range]}} (or absent). Returns the collectives as columns, or None to read row by row."""
    try:
        present = extras if None not in extras else [e for e in extras if e is not None]
        if set(map(type, present)) != {dict} or set(map(len, present)) != {1}:
            return None
        comms = [e["_comm"] for e in present]
        if set(map(type, comms)) != {dict}:
            return None
        counts = list(map(len, comms))
        keys = list(chain.from_iterable(comms))
        vals = list(chain.from_iterable(map(dict.values, comms)))
    except (TypeError, KeyError):  # no "_comm"
        return None
    if not vals or set(map(type, keys)) != {str}:
        return None
    if len(present) < len(extras):  # rows without collectives (no_sync micro-steps)
        counts = iter(counts)
        counts = [0 if e is None else next(counts) for e in extras]
    try:
        arr = np.array(vals)
    except (ValueError, TypeError, OverflowError):
        return None
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.dtype.kind != "i" or (arr < 0).any() \
            or (arr > MAX_NS).any():
        return None
    return np.repeat(steps, counts), keys, arr.astype(np.int64, copy=False)


def host_comm_share(df: pd.DataFrame) -> float:
    """On a CUDA run, the median share of the step that collectives timed on the host only took,
    over the steps that had some (0.0 when none): see _apply_device_times."""
    if "gpu_data_stall_ns" not in df or "gpu_comm_exposed_ns" not in df:
        return 0.0
    host = (df["gpu_data_stall_ns"].notna() & df["gpu_comm_exposed_ns"].isna()
            & (df["comm_ns"] > 0) & (df["step_ns"] > 0))
    if not host.any():
        return 0.0
    return float((df.loc[host, "comm_ns"] / df.loc[host, "step_ns"]).clip(upper=1).median())


def _apply_device_times(df: pd.DataFrame, device: list[dict]) -> pd.DataFrame:
    """On CUDA runs, the GPU's own timeline replaces host guesses where it was measured.

    The GPU's idle time while the host was blocked in next() is the data stall it saw (capped
    at the host's data wait); the GPU's idle time before the host asked for the batch, when
    nothing of the step was queued yet, the host spent elsewhere (a checkpoint, a profiler
    writing its trace, logging) and is "other". (Files of older recorders carry one gap, from
    the previous step's end to the batch: min(gap, host wait) is the stall, the rest other.)
    comm = NCCL time on the GPU, exposed = the last bucket's tail; compute is what remains of
    the step. A step whose collectives were not timed on the device (FSDP's, tensor parallel's,
    the loop's own: NCCL runs them on its streams, where no event of ours is) keeps the host's
    times: comm from each launch to its completion, exposed what the host blocked on (a lower
    bound: the GPU may wait for a collective while the host runs ahead); `host_comm_share` below
    says how much of such steps those collectives took."""
    if not device or df.empty:
        return df
    dev = pd.DataFrame(device).drop_duplicates("step").set_index("step")
    df = df.join(dev, on="step")
    has = df.get("gpu_data_stall_ns", pd.Series(np.nan, index=df.index)).notna()
    if has.any():
        gap = df.loc[has, "gpu_data_stall_ns"].astype("int64")
        stall = np.minimum(gap, df.loc[has, "data_ns"])
        df.loc[has, "data_ns"] = stall
        if "gpu_comm_ns" not in df:
            df["gpu_comm_ns"] = 0
        if "gpu_comm_exposed_ns" not in df:  # no step had DDP buckets timed on the device
            df["gpu_comm_exposed_ns"] = np.nan
        timed = has & df["gpu_comm_exposed_ns"].notna()  # DDP's buckets, on the device
        df.loc[timed, "comm_ns"] = df.loc[timed, "gpu_comm_ns"].astype("int64")
        df.loc[timed, "comm_exposed_ns"] = (df.loc[timed, "gpu_comm_exposed_ns"].astype("int64")
                                            .clip(upper=df.loc[timed, "step_ns"]))
        host = has & ~timed
        df.loc[host, "comm_exposed_ns"] = np.minimum(
            df.loc[host, "comm_exposed_ns"], (df["step_ns"] - df["data_ns"]).clip(lower=0)[host])
        # the GPU idle before the host asked for the batch (new files: measured from the
        # fetch's own event, 0 when the step queued work first); older files: the gap's rest
        before = gap - stall
        if "gpu_idle_before_data_ns" in df:
            idle = df.loc[has, "gpu_idle_before_data_ns"]
            before = before.where(idle.isna(), idle.fillna(0).astype("int64"))
        other = np.minimum(before, (df["step_ns"] - df["data_ns"]
                                    - df["comm_exposed_ns"]).clip(lower=0)[has])
        df.loc[has, "other_ns"] = other
        rest = df["step_ns"] - df["data_ns"] - df["comm_exposed_ns"] - df["other_ns"]
        df.loc[has, "compute_ns"] = rest[has].clip(lower=0)
    return df


def device_comm(comm: tuple | None, df: pd.DataFrame, key: str | None) -> tuple | None:
    """The rank's collectives (coded: steps, keys, codes, values) with DDP's key (`key`, the
    header's comm_key) at the steps whose buckets the device timed taking the device's times,
    as the step rows did (_apply_device_times). The wait split reads this table: on the host a
    rank whose own kernels were still queued blocks in the all-reduce as long as the peers that
    wait for it (gloo copies the gradients once the stream reaches them; NCCL's host blocks on
    neither), while on the device the late rank's stream reaches the collective last and waits
    least, so only the device's times tell the waiting ranks from the late one."""
    if comm is None or not key or "gpu_comm_exposed_ns" not in df or \
            "gpu_data_stall_ns" not in df:
        return comm
    steps, names, codes, vals = comm
    if key not in names or not len(steps):
        return comm
    timed = (df["gpu_comm_exposed_ns"].notna() & df["gpu_data_stall_ns"].notna()).to_numpy()
    if not timed.any():
        return comm
    dev_steps = df["step"].to_numpy()[timed]
    order = np.argsort(dev_steps, kind="stable")
    dev_steps = dev_steps[order]
    at = np.searchsorted(dev_steps, steps)
    at_ok = np.minimum(at, len(dev_steps) - 1)
    hit = (codes == names.index(key)) & (at < len(dev_steps)) & (dev_steps[at_ok] == steps)
    if not hit.any():
        return comm
    vals = vals.reshape(-1, 3).copy()
    for col, name in ((0, "comm_ns"), (1, "comm_exposed_ns")):
        vals[hit, col] = df[name].to_numpy()[timed][order][at_ok[hit]].astype(np.int64)
    return steps, names, codes, vals


def _telemetry(rank: int, samples: list) -> pd.DataFrame | None:
    n = len(NVML_FIELDS)
    good = [s if len(s) == n else s + [None] * (n - len(s)) for s in samples
            if isinstance(s, list) and len(s) in (NVML_FIELDS_V1, n)]  # older: energy unknown
    if not good:
        return None
    t = pd.DataFrame(good, columns=list(NVML_FIELDS))
    t.insert(0, "rank", rank)
    return t


def with_bubble(frame: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """`bubble_ns`: the step's exposed point-to-point communication (waiting on another
    pipeline stage), from the collectives table."""
    p2p = comm[mask_of(key_parts(comm)[0], is_p2p)]
    if p2p.empty:
        return frame
    bubble = p2p.groupby(["rank", "step"])["exposed_ns"].sum().rename("bubble_ns")
    frame = frame.join(bubble, on=["rank", "step"])
    frame["bubble_ns"] = frame["bubble_ns"].fillna(0).astype("int64").clip(
        upper=frame["comm_exposed_ns"])
    return frame


def _step_table(frames: list, blocks: list, placed, warms: list, comm: list, spill
                ) -> tuple:
    """(the step frame, its int block, the collectives' frame, the set-apart rows' frame or
    None) from the files' columns, sorted by rank and step, pipeline bubbles joined."""
    frame, int_block = _concat(frames, blocks, placed, warms) if frames else (empty_frame(), None)
    split = int_block is not None and bool(warms) and warms[0] is not None
    if "wait_ns" not in frame:
        frame["wait_ns"] = 0
    wf = warm_frame(warms, list(frame.columns)) if split else None
    r, st = frame["rank"].to_numpy(), frame["step"].to_numpy()
    if not ((r[1:] > r[:-1]) | ((r[1:] == r[:-1]) & (st[1:] > st[:-1]))).all():
        if wf is not None:  # (_all_split saw the files in order: not expected) put back
            frame, int_block, wf = pd.concat([wf, frame], ignore_index=True), None, None
        frame = frame.sort_values(["rank", "step"], kind="stable")
    frame = frame.reset_index(drop=True)
    comm_frame = _comm_frame(comm, spill) if comm else None
    if comm_frame is not None:
        frame = with_bubble(frame, comm_frame)
        wf = with_bubble(wf, comm_frame) if wf is not None else None
    return frame, int_block, comm_frame, wf


def _all_split(files: list) -> bool:
    """Whether every file with rows had its first rows set apart (warm_split.split_file), needs
    no device times joined to them (those come per step, the set-apart ones too), and the files
    follow one another in rank and step order (each rank's set-apart rows are its first)."""
    with_rows = [f for f in files if f.frame is not None and len(f.frame["step"])]
    if not with_rows or not all(f.warm is not None and not f.device for f in with_rows):
        return False
    last = None
    for f in with_rows:
        first = (int(f.warm["block"][0, 0]), int(f.warm["block"][1, 0]))
        if last is not None and first <= last:
            return False
        last = (int(f.frame["rank"][-1]), int(f.frame["step"][-1]))
    return True


def _block_maker(spill: str | None):
    return lambda rows, n: _int_block(rows, n, spill)


def _merger(warm: pd.DataFrame, names: list, make_block):
    """WarmRows.merge: (kept frame) -> the whole frame and its int block."""
    return lambda kept: merged(kept, warm, names, make_block)


def _concat(frames: list, blocks: list, placed: tuple | None = None, warms: list | None = None
            ) -> tuple[pd.DataFrame, tuple | None]:
    """One frame of the ranks' columns (dicts; DataFrames where device times were joined). The
    int columns every rank has, and wait_ns (zeros, filled by the analysis), are concatenated
    straight into one 2-D block that the frame keeps as it is (no copy to consolidate);
    `blocks`: each rank's column-major block (record_body.BLOCK_ROWS) or None, copied whole;
    `placed`: (rowblock.RowBlock, its regions) the blocks were written into, kept as the
    frame's block when they fill the regions in order. `warms`: each frame's set-apart first
    rows (warm_split.py), put back in front of it where the blocks are copied (warms[0] is
    then None). Returns the frame and (its int block, the block's column names)
    (RunTable.int_block), or None."""
    if any(isinstance(f, pd.DataFrame) for f in frames):
        return pd.concat([f if isinstance(f, pd.DataFrame) else pd.DataFrame(f) for f in frames],
                         ignore_index=True), None
    joined = placed[0].joined(blocks, placed[1]) if placed is not None else None
    if joined is None and warms and warms[0] is not None:
        frames = [{k: np.concatenate([w[k], v]) if k in w else v for k, v in f.items()}
                  for f, w in zip(frames, map(warm_columns, warms))]
        blocks = [None] * len(frames)
        warms[0] = None
    n = sum(len(f["step"]) for f in frames)
    if joined is not None:
        ints = list(BLOCK_ROWS)
        block = joined
    elif all(b is not None for b in blocks):
        ints = list(BLOCK_ROWS)
        block = np.empty((len(ints) + 1, n), np.int64)
        at = 0
        for b in blocks:
            block[:-1, at:at + b.shape[1]] = b
            at += b.shape[1]
    else:
        ints = [name for name in frames[0] if name not in ("phases", "samples", "wait_ns")
                and all(name in f and f[name].dtype == np.int64 for f in frames)]
        block = np.empty((len(ints) + 1, n), np.int64)
        for i, name in enumerate(ints):
            np.concatenate([f[name] for f in frames], out=block[i])
    block[-1] = 0
    out = pd.DataFrame(block.T, columns=ints + ["wait_ns"], copy=False)
    for name, fill in (("phases", None), ("samples", -1)):
        if not any(name in f for f in frames):
            continue
        parts = [f[name] if name in f else [fill] * len(f["step"]) for f in frames]
        out.insert(len(out.columns) - 1, name,  # wait_ns stays last
                   [x for p in parts for x in p] if name == "phases" else
                   np.concatenate([np.asarray(p, np.int64) for p in parts]))
    return out, (block, ints + ["wait_ns"])


def _comm_frame(parts: list, spill: str | None = None) -> pd.DataFrame:
    """The collectives table (COMM_COLUMNS, plus each key's kind and group) from per-rank
    columns; keys are categorical (a handful of distinct keys over up to millions of rows).
    The int columns are filled into one 2-D block the frame keeps as it is (in a file under
    `spill` when the step table went there: fork.shared_memory)."""
    names: dict = {}  # key -> code, over all ranks
    codes, counts, last = [], [], None
    for _, c in parts:
        if c[1] != last:  # each rank's own codes -> the run's (ranks mostly share their keys)
            last = c[1]
            local = np.array([names.setdefault(k, len(names)) for k in last], np.int64)
            same = bool((local == np.arange(len(local))).all())
        codes.append(c[2] if same else local[c[2]])
        counts.append(len(c[0]))
    m = sum(counts)
    block = _int_block(5, m, spill)
    block[0] = np.repeat(np.array([r for r, _ in parts], np.int64), counts)
    np.concatenate([c[0] for _, c in parts], out=block[1])
    np.concatenate([c[3].reshape(-1, 3).T for _, c in parts], axis=1, out=block[2:])
    out = pd.DataFrame(block.T, columns=["rank", "step", "comm_ns", "exposed_ns", "count"],
                       copy=False)
    code = np.concatenate(codes)
    out.insert(2, "key", pd.Categorical.from_codes(code, categories=list(names)))
    out["kind"], out["group"] = parts_of_codes(code, list(names))
    return out


def _int_block(rows: int, n: int, spill: str | None) -> np.ndarray:
    """An empty int64 (rows, n) array: in a file under `spill` when given and its disk can be
    had (fork.shared_memory), else in memory."""
    if spill is not None:
        from .fork import shared_memory

        try:
            mm = shared_memory(8 * rows * n, spill, reserve=True)
            return np.frombuffer(mm, np.int64, rows * n).reshape(rows, n)
        except (OSError, ValueError, OverflowError):  # a full disk: in memory, as before
            pass
    return np.empty((rows, n), np.int64)



def ddp_sampled(iteration: int) -> int:
    """How many iterations DDP's logging has sampled up to `iteration`: 1-10, then every 100th
    (its default rate)."""
    return min(iteration, 10) + (iteration // 100 if iteration >= 100 else 0)


def hidden_share(logging: dict) -> float | None:
    """The part of backward during which DDP's gradient communication was in flight, from DDP's
    own sampled iterations: from the first bucket's launch to the end of backward compute, over
    backward compute. A ratio of two times of the same iterations, so the slow first iterations
    a short run's averages lean on weigh on both alike. The iterations sampled before DDP knew
    the order gradients come in ("first_sample": its first one, whose buckets launch only at
    the end: 0.09 ms of overlap in a 15.7 ms backward, then 9-14 ms in 11-19 ms) are set apart
    where later ones were sampled. None where either is missing."""
    keys = ("avg_backward_compute_comm_overlap_time", "avg_backward_compute_time")
    overlap, compute = (logging.get(k) for k in keys)
    first, last = logging.get("first_sample"), logging.get("iteration")
    if isinstance(first, dict) and all(isinstance(first.get(k), int) for k in keys) and \
            isinstance(first.get("iteration"), int) and isinstance(last, int) and \
            isinstance(overlap, int) and isinstance(compute, int):
        n, k = ddp_sampled(last), ddp_sampled(first["iteration"])
        if n > k > 0:  # the mean of the later samples alone
            overlap = (n * overlap - k * first[keys[0]]) // (n - k)
            compute = (n * compute - k * first[keys[1]]) // (n - k)
    if not (isinstance(overlap, int) and isinstance(compute, int) and 0 < overlap
            and 0 < compute < 1 << 50):
        return None
    return round(min(overlap / compute, 1.0), 4)


def _chosen_files(path: str, loaded: list | None, warnings: list, warm: int = 0) -> tuple:
    """(the run dir, the rank files of the recording read, where their rows were placed): every
    record file read (or `loaded`'s), those that cannot be skipped, the newest recording (or
    the one a rank file given as `path` belongs to)."""
    want = None
    url = "://" in path
    if is_record_file(path):
        want = path if url else os.path.abspath(path)
        path = os.path.dirname(want)
    if loaded is None:
        names = sorted(glob.glob(os.path.join(path, FILE_GLOB)))
        if not names:
            raise InputError(f"{path}: no gpuscope record files ({FILE_GLOB}) here")
        with progress.reading(sum(file_size(n) for n in names), len(names), path):
            loaded, placed = _load_all(names, warnings, warm)
    else:
        placed = None
    names = [n for n, _ in loaded]
    files: list[RankFile] = []
    for name, got in loaded:
        if isinstance(got, TraceFormatError):
            if len(names) == 1 or (want is not None and (name if url else
                                                         os.path.abspath(name)) == want):
                raise got
            warnings.append(f"skipped: {got}")  # the other ranks are still analysed
        else:
            files.append(got)
    if not files:
        raise TraceFormatError(f"{path}: no readable record file ({warnings[0][9:]})")
    if want is not None and not url:
        for f in files:
            f.path = os.path.abspath(f.path)
    return path, _pick_recording(path, files, want, warnings), placed


def _rank_info(f: "RankFile") -> RankInfo:
    """A rank file's RankInfo: its knobs (with what its end record adds: the comm hook, what
    DDP's logging says backward hid) and what else the analysis reads of it (meta)."""
    header = f.header
    knobs = header["knobs"]
    if isinstance(f.end, dict) and isinstance(f.end.get("comm_hook"), str):
        knobs = {**knobs, "comm_hook": f.end["comm_hook"]}  # known when the run ends
    if "ddp_tail" in str(header.get("comm_timing", "")).split("+"):
        # DDP timed by its backward's tail: what backward hid is not in the rows; DDP's own
        # logging (its sampled iterations) may say
        knobs = {**knobs, "hidden_comm": "unmeasured"}
        overlap = ((f.end or {}).get("ddp_logging") or {}).get(
            "avg_backward_compute_comm_overlap_time") if isinstance(f.end, dict) else None
        if isinstance(overlap, int) and 0 < overlap < 1 << 50:
            knobs["hidden_comm_ns"] = overlap
            share = hidden_share(f.end["ddp_logging"])
            if share is not None:
                knobs["hidden_comm_share"] = share
    meta = {k: header.get(k) for k in ("pid", "comm_timing", "start_unix_ns", "placement_source",
                                       "local_rank", "gpu", "run_id", "flush")}
    meta |= {"end": f.end, "file": os.path.basename(f.path), "capacity": capacity_of(header)}
    if f.dataparallel:
        meta["dataparallel"] = f.dataparallel
    if f.stalls or f.stall_ends:
        meta |= {"stalls": f.stalls, "stall_ends": f.stall_ends}
    if not f.end:  # killed: by a fatal signal, where its trace says so (readers/fatal.py)
        from .fatal import read_fatal

        fatal = read_fatal(f.path)
        if fatal:
            meta["fatal"] = fatal
    return RankInfo(f.rank, header.get("host", ""), knobs, meta)


def read_run_dir(path: str, loaded: list | None = None, warm: int = 0) -> RunTable:
    """A run dir (its newest recording), or one rank file (the recording it belongs to).
    `loaded`: (name, RankFile or TraceFormatError) per record file, read elsewhere (the Ray
    engine's tasks); else they are read here. `warm`: each rank's first rows the analysis
    leaves out, set apart as the files are read where they can be (RunTable.warm)."""
    warnings: list[str] = []
    path, chosen, placed = _chosen_files(path, loaded, warnings, warm)
    split = placed is not None and _all_split(chosen)
    if not split:
        for f in chosen:
            unsplit(f)
    frames, blocks, ranks, world, telemetry, comm = [], [], {}, 0, [], []  # comm: (rank, columns)
    memory, routing, modules = [], [], []  # (rank, its memory / all-to-all / module records)
    host_timed: list[int] = []  # CUDA ranks with collectives the device did not time
    for f in chosen:
        warnings += f.warnings
        header, rank = f.header, f.rank
        world = max(world, int(header.get("world_size") or 1))
        ranks[rank] = _rank_info(f)
        tel = _telemetry(rank, f.nvml)
        if tel is not None:
            telemetry.append(tel)
        if f.memory:
            memory.append((rank, f.memory))
        if f.routing:
            routing.append((rank, f.routing))
        if f.modules:
            modules.append((rank, f.modules))
        frame = f.frame
        rank_comm = f.comm
        warnings += f.tally.warnings()
        if frame is not None and len(frame["step"]):
            if f.device:
                frame = _apply_device_times(pd.DataFrame(frame), f.device)
                rank_comm = device_comm(rank_comm, frame, header.get("comm_key"))
                share = host_comm_share(frame)
                if share > 0:
                    ranks[rank].meta["host_comm_share"] = share
                    host_timed.append(rank)
            frames.append(frame)
            blocks.append(None if f.device else f.block)
        else:
            warnings.append(f"{os.path.basename(f.path)}: rank {rank} recorded no "
                            f"{'usable ' if f.n_rows else ''}steps")
        if rank_comm is not None:
            comm.append((rank, rank_comm))
    if host_timed:
        worst = max(ranks[r].meta["host_comm_share"] for r in host_timed)
        warnings.append(
            f"rank(s) {', '.join(map(str, host_timed[:8]))}: collectives outside DDP on the GPU "
            f"(up to {worst:.0%} of the step) are timed on the host, from launch to completion; "
            "how long the GPU waited for them is not seen (exposed counts what the host blocked "
            "on, a lower bound): torch.profiler traces give the device's view")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no readable record file (ranks {shown}); "
                        "analysis covers the others")
    warms = [f.warm for f in chosen if f.frame is not None and len(f.frame["step"])] \
        if split else []
    spill = placed[0].spill_dir if placed is not None else None
    frame, int_block, comm_frame, wf = _step_table(frames, blocks, placed, warms, comm, spill)
    tel = pd.concat(telemetry, ignore_index=True) if telemetry else None
    table = RunTable(frame, "record", path, ranks, world or len(ranks), warnings, telemetry=tel,
                     comm=comm_frame, memory=memory_frame(memory),
                     routing=routing_frame(routing), int_block=int_block,
                     ops=modules_frame(modules),
                     warm=None if wf is None else WarmRows(wf, warm, _merger(
                         wf, int_block[1], _block_maker(spill))))
    if os.path.isdir(path):
        from .flight_recorder import find  # torch's and the stall watcher's, beside the records

        dumps, bad = find(path, quiet=True)
        table.flight_recorder = (dumps, bad) if dumps else None
    return table
