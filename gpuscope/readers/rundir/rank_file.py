"""One rank file read: its header, step rows (as columns, in a row block where one is given), side
records and end record (RankFile); what does not fit is skipped and counted, only a file without
a readable header is an error."""

from __future__ import annotations

import os

import msgspec

from ...errors import TraceFormatError
from ..speed import bulk
from ..record_body import coded, decode_body, with_implied
from ..record_columns import read_columns
from ..record_file import RecordBytes, unchanged_since_side
from ..warm_split import split_file
from ..validate import Tally, clean_knobs
from .frames import rank_frame
from .rank_data import RankFile
from .side_records import check_header, read_header, side_record


_decoder = msgspec.json.Decoder()
_decode, _decode_lines = _decoder.decode, _decoder.decode_lines


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
    header = read_header(path, first)
    tally = Tally(name)
    check_header(header, name, tally)
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
            side_record(obj, out, knobs, tally, at)
        comm = fast.comm if fast.coded else coded(fast.comm)
        out.frame, out.comm = (fast.columns, comm) if fast.n_rows else (None, None)
        out.block = fast.block if fast.n_rows else None
        out.rows, out.n_rows = fast.ends, fast.n_rows
    else:
        _read_body(blob, first, out, knobs, tally)
        if build:
            out.n_rows = len(out.rows)
            if out.rows:
                out.frame, comm = rank_frame(out.rank, header["columns"], out.rows, out.row_lines,
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
            side_record(obj, out, knobs, tally, i + 2)
        else:
            tally.add("line(s) that are neither a step row nor a record", i + 2)


def _end_warnings(out: RankFile, name: str) -> None:
    """How the recording ended, when not cleanly."""
    from ...stall_story import in_step

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
