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
    """Header, step rows and closing record of one rank file (device times and NVML samples
    go into header["_device"] and header["_nvml"]).

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
    device, nvml = [], []
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
            if isinstance(obj.get("device"), list):
                device += obj["device"]
            if isinstance(obj.get("nvml"), list):
                nvml += obj["nvml"]
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
    warnings += [f"{name}: {w}" for w in end.get("warnings", [])]  # the recorder's own
    header["knobs"] = knobs
    header["_columns"] = cols
    header["_device"] = device
    header["_nvml"] = nvml
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


def _apply_device_times(df: pd.DataFrame, device: list[dict]) -> pd.DataFrame:
    """On CUDA runs, the GPU's own timeline replaces host guesses where it was measured:
    data = the stall the GPU saw, comm = NCCL time, exposed = the last bucket's tail; compute
    is what remains of the step."""
    if not device or df.empty:
        return df
    dev = pd.DataFrame(device).drop_duplicates("step").set_index("step")
    df = df.join(dev, on="step")
    has = df.get("gpu_data_stall_ns", pd.Series(np.nan, index=df.index)).notna()
    if has.any():
        df.loc[has, "data_ns"] = df.loc[has, "gpu_data_stall_ns"].astype("int64")
        for col in ("gpu_comm_ns", "gpu_comm_exposed_ns"):
            if col not in df:
                df[col] = 0
        df.loc[has, "comm_ns"] = df.loc[has, "gpu_comm_ns"].fillna(0).astype("int64")
        df.loc[has, "comm_exposed_ns"] = (df.loc[has, "gpu_comm_exposed_ns"].fillna(0)
                                          .astype("int64").clip(upper=df.loc[has, "step_ns"]))
        rest = df["step_ns"] - df["data_ns"] - df["comm_exposed_ns"]
        df.loc[has, "compute_ns"] = rest[has].clip(lower=0)
        df.loc[has, "other_ns"] = 0
    return df


def _telemetry(rank: int, samples: list) -> pd.DataFrame | None:
    from .nvml import FIELDS

    good = [s for s in samples if isinstance(s, list) and len(s) == len(FIELDS)]
    if not good:
        return None
    t = pd.DataFrame(good, columns=list(FIELDS))
    t.insert(0, "rank", rank)
    return t


def read_run_dir(path: str) -> RunTable:
    files = sorted(glob.glob(os.path.join(path, FILE_GLOB)))
    if not files:
        raise InputError(f"{path}: no gpuscope record files ({FILE_GLOB}) here")
    warnings: list[str] = []
    frames, ranks, world, telemetry = [], {}, 0, []
    for f in files:
        try:
            header, rows, end = read_rank_file(f, warnings)
        except TraceFormatError as exc:
            if len(files) == 1:
                raise
            warnings.append(f"skipped: {exc}")  # the other ranks are still analysed
            continue
        rank = int(header.get("rank", -1))
        if rank in ranks:
            warnings.append(f"{os.path.basename(f)}: a second file for rank {rank}; appended")
        world = max(world, int(header.get("world_size") or 1))
        ranks[rank] = RankInfo(rank, header.get("host", ""), header["knobs"],
                               {k: header.get(k) for k in ("pid", "comm_timing", "start_unix_ns",
                                                           "placement_source", "local_rank", "gpu")}
                               | {"end": end})
        tel = _telemetry(rank, header["_nvml"])
        if tel is not None:
            telemetry.append(tel)
        if rows:
            frames.append(_apply_device_times(_frame(rank, header["_columns"], rows),
                                              header["_device"]))
        else:
            warnings.append(f"{os.path.basename(f)}: rank {rank} recorded no steps")
    if not ranks:
        raise TraceFormatError(f"{path}: no readable record file ({warnings[0][9:]})")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no readable record file (ranks {shown}); "
                        "analysis covers the others")
    frame = pd.concat(frames, ignore_index=True) if frames else empty_frame()
    if "wait_ns" not in frame:
        frame["wait_ns"] = 0
    frame = frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
    extras = {"telemetry": pd.concat(telemetry, ignore_index=True)} if telemetry else {}
    return RunTable(frame, "record", path, ranks, world or len(ranks), warnings, extras)
