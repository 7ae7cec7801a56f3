"""Reads a run dir written by gpuscope.record into a RunTable."""

from __future__ import annotations

import glob
import os

import msgspec
import numpy as np
import pandas as pd

from .errors import InputError, TraceFormatError
from .record_format import FILE_GLOB, SCHEMA, STEP_COLUMNS
from .runtable import RankInfo, RunTable, empty_frame

_decode = msgspec.json.Decoder().decode


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, FILE_GLOB)))


def read_rank_file(path: str, warnings: list[str]) -> tuple[dict, list[list], dict]:
    """Header, step rows and closing record of one rank file.

    A last line cut mid-write is dropped; a file without its end record (killed run) gets a warning.
    """
    with open(path, "rb") as fh:
        blob = fh.read()
    name = os.path.basename(path)
    lines = blob.split(b"\n")
    if not lines or not lines[0].strip():
        raise TraceFormatError(f"{path}: empty record file (the run wrote nothing)")
    try:
        header = _decode(lines[0])
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: first line is not a gpuscope header ({exc})") from None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise TraceFormatError(f"{path}: not a {SCHEMA} file (schema={header.get('schema')!r})"
                               if isinstance(header, dict) else f"{path}: not a gpuscope file")
    cols = header.get("columns") or list(STEP_COLUMNS)
    knobs = dict(header.get("knobs") or {})
    rows, end, bad = [], {}, 0
    body = lines[1:]
    cut_tail = bool(body) and body[-1] != b""  # file does not end with a newline
    for i, line in enumerate(body):
        if not line:
            continue
        try:
            obj = _decode(line)
        except msgspec.DecodeError:
            if i == len(body) - 1 and cut_tail:
                warnings.append(f"{name}: last line was cut mid-write and is ignored")
            else:
                bad += 1
            continue
        if isinstance(obj, list):
            rows.append(obj)
        elif isinstance(obj, dict):
            if "knobs" in obj:
                knobs.update(obj["knobs"])
            if "end" in obj:
                end = obj["end"]
    if bad:
        warnings.append(f"{name}: {bad} corrupt line(s) skipped")
    if not end:
        last = rows[-1][0] if rows else None
        warnings.append(f"{name}: no end record: the run was cut (killed or crashed) after step "
                        f"{last}; the last few steps may be missing")
    elif end.get("crashed"):
        warnings.append(f"{name}: training raised an exception after step {end.get('steps')}")
    if end.get("recorder_error"):
        warnings.append(f"{name}: recording stopped early: {end['recorder_error']}")
    header["knobs"] = knobs
    header["_columns"] = cols
    return header, rows, end


def _frame(rank: int, cols: list[str], rows: list[list]) -> pd.DataFrame:
    width = len(cols)
    fixed = [r[:width] for r in rows if len(r) >= width]
    arr = np.array(fixed, dtype=np.int64) if fixed else np.zeros((0, width), dtype=np.int64)
    df = pd.DataFrame(arr, columns=cols)
    df.insert(0, "rank", rank)
    extra = [r[width] if len(r) > width and isinstance(r[width], dict) else None for r in rows
             if len(r) >= width]
    if any(extra):
        df["phases"] = extra
    return df


def read_run_dir(path: str) -> RunTable:
    files = sorted(glob.glob(os.path.join(path, FILE_GLOB)))
    if not files:
        raise InputError(f"{path}: no gpuscope record files ({FILE_GLOB}) here")
    warnings: list[str] = []
    frames, ranks, world = [], {}, 0
    for f in files:
        header, rows, end = read_rank_file(f, warnings)
        rank = int(header.get("rank", -1))
        if rank in ranks:
            warnings.append(f"{os.path.basename(f)}: a second file for rank {rank}; appended")
        world = max(world, int(header.get("world_size") or 1))
        ranks[rank] = RankInfo(rank, header.get("host", ""), header["knobs"],
                               {k: header.get(k) for k in ("pid", "comm_timing", "start_unix_ns",
                                                           "placement_source", "local_rank")}
                               | {"end": end})
        if rows:
            frames.append(_frame(rank, header["_columns"], rows))
        else:
            warnings.append(f"{os.path.basename(f)}: rank {rank} recorded no steps")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no record file (ranks {shown}); "
                        "analysis covers the others")
    frame = pd.concat(frames, ignore_index=True) if frames else empty_frame()
    if "wait_ns" not in frame:
        frame["wait_ns"] = 0
    frame = frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
    return RunTable(frame, "record", path, ranks, world or len(ranks), warnings)
