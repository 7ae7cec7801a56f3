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
from dataclasses import dataclass, field

import msgspec
import numpy as np
import pandas as pd

from ..errors import InputError, TraceFormatError
from ..record_format import (COLUMN_DEFAULTS, FILE_GLOB, FILE_SUFFIX, NVML_FIELDS, SCHEMA,
                             STEP_COLUMNS, comm_kind, is_p2p)
from ..runtable import COMM_COLUMNS, RankInfo, RunTable, empty_frame

_decode = msgspec.json.Decoder().decode


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, FILE_GLOB)))


def is_record_file(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(FILE_SUFFIX)


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
    warnings: list[str] = field(default_factory=list)

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
        if not isinstance(start, int):
            start = self.rows[0][1] if self.rows else 0
        ends = [start]
        if isinstance(self.end.get("end_unix_ns"), int):
            ends.append(self.end["end_unix_ns"])
        if self.rows and len(self.rows[-1]) > 2:
            ends.append(self.rows[-1][1] + self.rows[-1][2])
        return start, max(ends)


def read_rank_file(path: str) -> RankFile:
    """One rank file. A last line cut mid-write is dropped; a file without its end record
    (killed run) gets a warning."""
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
    knobs = dict(header.get("knobs") or {})
    out = RankFile(path, header, [], {})
    warnings = out.warnings
    bad = 0
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
            out.rows.append(obj)
        elif isinstance(obj, dict):
            if "knobs" in obj:
                knobs.update(obj["knobs"])
            if "end" in obj:
                out.end = obj["end"]
            if isinstance(obj.get("device"), list):
                out.device += obj["device"]
            if isinstance(obj.get("nvml"), list):
                out.nvml += obj["nvml"]
            if isinstance(obj.get("dataparallel"), dict):
                out.dataparallel = obj["dataparallel"]
    if bad:
        warnings.append(f"{name}: {bad} corrupt line(s) skipped")
    end = out.end
    if not end:
        last = out.rows[-1][0] if out.rows else None
        warnings.append(f"{name}: no end record: the run was cut (killed or crashed) after step "
                        f"{last}; the last few steps may be missing")
    elif end.get("crashed"):
        warnings.append(f"{name}: training raised an exception after step {end.get('steps')}")
    if end.get("recorder_error"):
        warnings.append(f"{name}: recording stopped early: {end['recorder_error']}")
    warnings += [f"{name}: {w}" for w in end.get("warnings", [])]  # the recorder's own
    header["knobs"] = knobs
    if not isinstance(header.get("columns"), list) or not header["columns"]:
        header["columns"] = list(STEP_COLUMNS)
    return out


def group_recordings(files: list[RankFile]) -> list[list[RankFile]]:
    """Split rank files into recordings, oldest first.

    Ranks of one recording run at the same time, so their [start, end] spans overlap; a later
    recording into the same dir starts after the earlier one ended. Files are swept in order of
    start: a file joins the current recording when it starts before that recording's last end
    and its job id (when both have one) is the same; otherwise it starts a new recording."""
    groups: list[list[RankFile]] = []
    reach = None
    ids: set = set()
    for f in sorted(files, key=lambda f: f.span()[0]):
        start, end = f.span()
        rid = f.run_id
        if groups and start <= reach and (not rid or not ids or ids == {rid}):
            groups[-1].append(f)
            reach = max(reach, end)
            ids |= {rid} - {""}
        else:
            groups.append([f])
            reach, ids = end, {rid} - {""}
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
        keep, drop = (f, seen) if len(f.rows) > len(seen.rows) else (seen, f)
        by_rank[f.rank] = keep
        warnings.append(f"two files for rank {f.rank} in one recording; kept "
                        f"{os.path.basename(keep.path)} ({len(keep.rows)} steps), left out "
                        f"{os.path.basename(drop.path)}")
    return [by_rank[r] for r in sorted(by_rank)]


def _frame(rank: int, cols: list[str], rows: list[list]) -> tuple[pd.DataFrame, list]:
    """The rank's step rows as a frame (columns a file of an older version lacks get their
    default), and its collectives as (rank, step, key, comm_ns, exposed_ns, count) records."""
    width = len(cols)
    fixed = [r[:width] for r in rows if len(r) >= width]
    arr = np.array(fixed, dtype=np.int64) if fixed else np.zeros((0, width), dtype=np.int64)
    df = pd.DataFrame(arr, columns=cols)
    df.insert(0, "rank", rank)
    for col, default in COLUMN_DEFAULTS.items():
        if col not in df:
            df[col] = default
    extra = [r[width] if len(r) > width and isinstance(r[width], dict) else None for r in rows
             if len(r) >= width]
    comm = []
    if any(extra):
        phases, samples = [], []
        for step, e in zip(df["step"].tolist(), extra):
            n = -1
            if e and ("_comm" in e or "_samples" in e):
                e = dict(e)
                for key, v in (e.pop("_comm", None) or {}).items():
                    if isinstance(v, list) and len(v) == 3:
                        comm.append((rank, step, str(key), *v))
                v = e.pop("_samples", -1)
                n = v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else -1
            phases.append(e or None)
            samples.append(n)
        if any(phases):
            df["phases"] = phases
        if any(n >= 0 for n in samples):
            df["samples"] = samples  # the batch's size where it differed from the first
    return df, comm


def _apply_device_times(df: pd.DataFrame, device: list[dict]) -> pd.DataFrame:
    """On CUDA runs, the GPU's own timeline replaces host guesses where it was measured.

    The GPU sits idle from the end of the previous step's work until the batch arrives (the
    gap). The part of that gap the host spent blocked in next() is the data stall the GPU saw
    (min(gap, host data wait): the gap ends when the batch arrives, and so does the wait); the
    rest of the gap the host spent elsewhere (a checkpoint, a profiler writing its trace,
    logging) and is "other". comm = NCCL time on the GPU, exposed = the last bucket's tail;
    compute is what remains of the step."""
    if not device or df.empty:
        return df
    dev = pd.DataFrame(device).drop_duplicates("step").set_index("step")
    df = df.join(dev, on="step")
    has = df.get("gpu_data_stall_ns", pd.Series(np.nan, index=df.index)).notna()
    if has.any():
        gap = df.loc[has, "gpu_data_stall_ns"].astype("int64")
        stall = np.minimum(gap, df.loc[has, "data_ns"])
        df.loc[has, "data_ns"] = stall
        for col in ("gpu_comm_ns", "gpu_comm_exposed_ns"):
            if col not in df:
                df[col] = 0
        df.loc[has, "comm_ns"] = df.loc[has, "gpu_comm_ns"].fillna(0).astype("int64")
        df.loc[has, "comm_exposed_ns"] = (df.loc[has, "gpu_comm_exposed_ns"].fillna(0)
                                          .astype("int64").clip(upper=df.loc[has, "step_ns"]))
        other = np.minimum(gap - stall, (df["step_ns"] - df["data_ns"]
                                         - df["comm_exposed_ns"]).clip(lower=0)[has])
        df.loc[has, "other_ns"] = other
        rest = df["step_ns"] - df["data_ns"] - df["comm_exposed_ns"] - df["other_ns"]
        df.loc[has, "compute_ns"] = rest[has].clip(lower=0)
    return df


def _telemetry(rank: int, samples: list) -> pd.DataFrame | None:
    good = [s for s in samples if isinstance(s, list) and len(s) == len(NVML_FIELDS)]
    if not good:
        return None
    t = pd.DataFrame(good, columns=list(NVML_FIELDS))
    t.insert(0, "rank", rank)
    return t


def with_bubble(frame: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """`bubble_ns`: the step's exposed point-to-point communication (waiting on another
    pipeline stage), from the collectives table."""
    p2p = comm[[is_p2p(comm_kind(k)) for k in comm["key"].tolist()]]
    if p2p.empty:
        return frame
    bubble = p2p.groupby(["rank", "step"])["exposed_ns"].sum().rename("bubble_ns")
    frame = frame.join(bubble, on=["rank", "step"])
    frame["bubble_ns"] = frame["bubble_ns"].fillna(0).astype("int64").clip(
        upper=frame["comm_exposed_ns"])
    return frame


def read_run_dir(path: str) -> RunTable:
    """A run dir (its newest recording), or one rank file (the recording it belongs to)."""
    want = None
    if is_record_file(path):
        want, path = os.path.abspath(path), os.path.dirname(os.path.abspath(path))
    names = sorted(glob.glob(os.path.join(path, FILE_GLOB)))
    if not names:
        raise InputError(f"{path}: no gpuscope record files ({FILE_GLOB}) here")
    warnings: list[str] = []
    files: list[RankFile] = []
    for name in names:
        try:
            files.append(read_rank_file(name))
        except TraceFormatError as exc:
            if len(names) == 1 or (want is not None and os.path.abspath(name) == want):
                raise
            warnings.append(f"skipped: {exc}")  # the other ranks are still analysed
    if not files:
        raise TraceFormatError(f"{path}: no readable record file ({warnings[0][9:]})")
    if want is not None:
        for f in files:
            f.path = os.path.abspath(f.path)
    chosen = _pick_recording(path, files, want, warnings)
    frames, ranks, world, telemetry, comm = [], {}, 0, [], []
    for f in chosen:
        warnings += f.warnings
        header, rank = f.header, f.rank
        world = max(world, int(header.get("world_size") or 1))
        knobs = header["knobs"]
        if isinstance(f.end, dict) and isinstance(f.end.get("comm_hook"), str):
            knobs = {**knobs, "comm_hook": f.end["comm_hook"]}  # known when the run ends
        ranks[rank] = RankInfo(rank, header.get("host", ""), knobs,
                               {k: header.get(k) for k in ("pid", "comm_timing", "start_unix_ns",
                                                           "placement_source", "local_rank", "gpu",
                                                           "run_id")}
                               | {"end": f.end, "file": os.path.basename(f.path)}
                               | ({"dataparallel": f.dataparallel} if f.dataparallel else {}))
        tel = _telemetry(rank, f.nvml)
        if tel is not None:
            telemetry.append(tel)
        if f.rows:
            frame, rank_comm = _frame(rank, header["columns"], f.rows)
            frames.append(_apply_device_times(frame, f.device))
            comm += rank_comm
        else:
            warnings.append(f"{os.path.basename(f.path)}: rank {rank} recorded no steps")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no readable record file (ranks {shown}); "
                        "analysis covers the others")
    frame = pd.concat(frames, ignore_index=True) if frames else empty_frame()
    if "wait_ns" not in frame:
        frame["wait_ns"] = 0
    frame = frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
    tel = pd.concat(telemetry, ignore_index=True) if telemetry else None
    comm_frame = pd.DataFrame(comm, columns=list(COMM_COLUMNS)) if comm else None
    if comm_frame is not None:
        frame = with_bubble(frame, comm_frame)
    return RunTable(frame, "record", path, ranks, world or len(ranks), warnings, telemetry=tel,
                    comm=comm_frame)
