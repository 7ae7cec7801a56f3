"""A recording's rank files assembled into the run's tables: step rows per rank (device times
applied where the GPU timed them), collectives, telemetry, then one step table for all ranks
(in a row block where the files were placed in one)."""

from __future__ import annotations

from itertools import chain
from operator import itemgetter

import numpy as np
import pandas as pd

from ...run_format import COLUMN_DEFAULTS, NVML_FIELDS, NVML_FIELDS_V1, STEP_COLUMNS, is_p2p
from ...runtable import empty_frame, key_parts, mask_of, parts_of_codes
from ..speed import bulk
from ..record_body import BLOCK_ROWS
from ..warm_split import merged, warm_columns, warm_frame
from ..validate import MAX_NS, Tally, column_bounds, is_int


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


def rank_frame(rank: int, cols: list[str], rows: list[list], lines: list[int],
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
    over the steps that had some (0.0 when none): see apply_device_times."""
    if "gpu_data_stall_ns" not in df or "gpu_comm_exposed_ns" not in df:
        return 0.0
    host = (df["gpu_data_stall_ns"].notna() & df["gpu_comm_exposed_ns"].isna()
            & (df["comm_ns"] > 0) & (df["step_ns"] > 0))
    if not host.any():
        return 0.0
    return float((df.loc[host, "comm_ns"] / df.loc[host, "step_ns"]).clip(upper=1).median())


def apply_device_times(df: pd.DataFrame, device: list[dict]) -> pd.DataFrame:
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
    as the step rows did (apply_device_times). The wait split reads this table: on the host a
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


def telemetry_frame(rank: int, samples: list) -> pd.DataFrame | None:
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


def step_table(frames: list, blocks: list, placed, warms: list, comm: list, spill
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
        if wf is not None:  # (all_split saw the files in order: not expected) put back
            frame, int_block, wf = pd.concat([wf, frame], ignore_index=True), None, None
        frame = frame.sort_values(["rank", "step"], kind="stable")
    frame = frame.reset_index(drop=True)
    comm_frame = _comm_frame(comm, spill) if comm else None
    if comm_frame is not None:
        frame = with_bubble(frame, comm_frame)
        wf = with_bubble(wf, comm_frame) if wf is not None else None
    return frame, int_block, comm_frame, wf


def all_split(files: list) -> bool:
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


def block_maker(spill: str | None):
    return lambda rows, n: _int_block(rows, n, spill)


def merger(warm: pd.DataFrame, names: list, make_block):
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
        from ..fork import shared_memory

        try:
            mm = shared_memory(8 * rows * n, spill, reserve=True)
            return np.frombuffer(mm, np.int64, rows * n).reshape(rows, n)
        except (OSError, ValueError, OverflowError):  # a full disk: in memory, as before
            pass
    return np.empty((rows, n), np.int64)
