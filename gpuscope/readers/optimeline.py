"""An op timeline: the compact per-operation table large jobs keep instead of profiler traces
(Megatron's timers, NDTimeline-style tracers) -> RunTable.

Input: a Parquet or CSV file, or a folder holding one (`*.parquet`, `*.csv`), one row per
operation, and beside it an optional layout file (`meta*.yaml`, `meta*.json`, or
`<table>.meta.yaml/json`):

- columns: `rank`, `step`, `optype` (or `op`), `start_ts` (or `start`), `duration` (or `dur`);
  optional `dp_rank`, `stage` (or `pp_rank`), `tp_rank`, `mc` (model chunk), `mb_id`
  (micro-batch). Times are seconds, unless the layout file says `time_unit: ms | us | ns`.
  Start times may be relative to each step (the same origin for every rank in a step) or
  absolute.
- layout: `dp_size`, `pp_size`, `tp_size`, `world_size` (and anything else, kept as knobs).

Op types map onto gpuscope's parts (OPS; Megatron's names, as in ByteDance's what-if analysis
artifact): forward / backward compute and the optimizer are compute; gradient reduce-scatters,
parameter all-gathers and gradient all-reduces are collectives of their group (a pipeline
stage's data-parallel ranks; the embedding's first and last stage; a tensor-parallel group);
forward / backward sends and receives are the pipeline's point-to-point communication, with the
neighbouring stage of the same data-parallel rank as peer; anything else ("gc", unknown names) is
other, and unknown names are said in a warning. A step spans, on every rank, from the step's
first op on any rank to its last op's end on any rank (synchronous training ends a step on all
ranks together). The time a rank ran none of its ops is idle: the least any rank idled in the
step is other; a rank's idle time beyond that is waiting for the others in a synchronization the
timeline does not hold (a barrier, a loss all-reduce, a host-side wait), a collective of all
ranks (`unrecorded_sync`), so an idle rank is never taken for a busy one.
"""

from __future__ import annotations

import glob
import json
import os
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..errors import InputError
from ..runtable import RankInfo, RunTable

SUFFIXES = (".parquet", ".csv")
#: op type -> (part, kind): part is forward / backward / optimizer / collective / p2p / other;
#: kind names the collective (gpuscope's vocabulary) or the point-to-point side
OPS = {
    "forward-compute": ("forward", ""), "forward": ("forward", ""),
    "backward-compute": ("backward", ""), "backward": ("backward", ""),
    "optimizer": ("optimizer", ""), "optimizer-clip-main-grad": ("optimizer", ""),
    "grads-reduce-scatter": ("collective", "reduce_scatter"),
    "params-all-gather": ("collective", "all_gather"),
    "separate-grads-all-reduce": ("collective", "all_reduce"),
    "embedding-grads-all-reduce": ("p2p", "stages_all_reduce"),
    "layernorm-grads-all-reduce": ("collective", "all_reduce"),
    "forward-send": ("p2p", "send_next"), "forward-recv": ("p2p", "recv_prev"),
    "backward-send": ("p2p", "send_prev"), "backward-recv": ("p2p", "recv_next"),
    "gc": ("other", ""),
}
#: which ranks a collective synchronizes: the data-parallel ranks of a stage, the embedding's
#: first and last stages of one data-parallel rank (whose waiting is the pipeline's drain:
#: run_format.is_p2p), or (not in the table) tensor-parallel peers
GROUP_OF = {"grads-reduce-scatter": "dp", "params-all-gather": "dp",
            "separate-grads-all-reduce": "dp", "embedding-grads-all-reduce": "embedding",
            "layernorm-grads-all-reduce": "tp"}
#: idle time beyond the least idle rank's: waiting in a synchronization the timeline lacks
SYNC_KEY = "unrecorded_sync:all"
ALIASES = {"op": "optype", "start": "start_ts", "dur": "duration", "pp_rank": "stage"}
UNITS = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}


def is_op_timeline(path: str) -> bool:
    """A table file, or a folder whose only tables are op timelines (by their columns)."""
    return bool(_table_files(path))


def _table_files(path: str) -> list[str]:
    if os.path.isfile(path):
        files = [path] if path.endswith(SUFFIXES) else []
    elif os.path.isdir(path):
        files = sorted(f for s in SUFFIXES for f in glob.glob(os.path.join(path, "*" + s)))
    else:
        return []
    return [f for f in files if {"rank", "step", "duration"} <= set(_columns(f))]


def _columns(path: str) -> list[str]:
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
        else:
            with open(path) as fh:
                names = fh.readline().strip().split(",")
    except Exception:
        return []
    return [ALIASES.get(n, n) for n in names]


def _meta(table_path: str) -> tuple[dict, str | None]:
    """The layout file beside a table: `<table>.meta.*`, else the folder's one `meta*.*`."""
    base = os.path.splitext(table_path)[0]
    folder = os.path.dirname(table_path)
    cands = [base + ".meta.yaml", base + ".meta.yml", base + ".meta.json"]
    stem = os.path.basename(base)
    tail = stem.split("-", 1)[1] if "-" in stem else None  # trace-AR.parquet -> meta-AR.yaml
    if tail:
        cands += [os.path.join(folder, f"meta-{tail}{e}") for e in (".yaml", ".yml", ".json")]
    metas = sorted(glob.glob(os.path.join(folder, "meta*.y*ml"))
                   + glob.glob(os.path.join(folder, "meta*.json")))
    if len(metas) == 1:
        cands.append(metas[0])
    for c in cands:
        if os.path.isfile(c):
            with open(c) as fh:
                text = fh.read()
            try:
                if c.endswith(".json"):
                    got = json.loads(text)
                else:
                    import yaml

                    got = yaml.safe_load(text)
            except Exception as exc:
                raise InputError(f"{c}: not a layout file ({exc})") from None
            if not isinstance(got, dict):
                raise InputError(f"{c}: a layout file holds a mapping (dp_size: 4, ...)")
            return got, c
    return {}, None


def read_op_timeline(path: str) -> RunTable:
    files = _table_files(path)
    if not files:
        raise InputError(f"{path}: no op-timeline table (.parquet / .csv with rank, step, "
                         "optype, start_ts, duration)")
    if len(files) > 1:
        raise InputError(f"{path}: {len(files)} op-timeline tables; give one file")
    table_path = files[0]
    meta, meta_path = _meta(table_path)
    try:
        df = (pd.read_parquet(table_path) if table_path.endswith(".parquet")
              else pd.read_csv(table_path))
    except Exception as exc:
        raise InputError(f"{table_path}: cannot read the table ({exc})") from None
    df = df.rename(columns={k: v for k, v in ALIASES.items() if k in df and v not in df})
    missing = [c for c in ("rank", "step", "optype", "start_ts", "duration") if c not in df]
    if missing:
        raise InputError(f"{table_path}: no column {', '.join(missing)}")
    unit = str(meta.get("time_unit", "s"))
    if unit not in UNITS:
        raise InputError(f"{meta_path}: time_unit {unit!r}: one of {', '.join(UNITS)}")
    warnings: list[str] = []
    df = _clean(df, UNITS[unit], warnings, table_path)
    frame, comm, per_rank = _steps(df)
    world = int(meta["world_size"]) if isinstance(meta.get("world_size"), int) else \
        int(df["rank"].max()) + 1
    layout_knobs = {k: v for k, v in meta.items() if isinstance(v, (int, float, str, bool))}
    groups = _groups(df)
    ranks = {}
    for r, extra in per_rank.items():
        knobs = {**layout_knobs, "world_size": world, "process_groups": groups,
                 "device": "unknown", **extra}
        ranks[r] = RankInfo(int(r), "", knobs, {"files": [table_path], "op_timeline": True})
    kept = len(per_rank)
    tp = meta.get("tp_size")
    if kept < world:
        warnings.append(
            f"the op timeline holds {kept} of the {world} ranks"
            + (f" (one per tensor-parallel group of {tp}: its peers do the same work)"
               if isinstance(tp, int) and tp > 1 and kept * tp >= world else "")
            + "; the others are not analysed")
    return RunTable(frame, "timeline", table_path, ranks, world, warnings, comm=comm)


def _clean(df: pd.DataFrame, scale: float, warnings: list[str], path: str) -> pd.DataFrame:
    """Integer ns, rows with a time that is no number dropped and counted."""
    start = pd.to_numeric(df["start_ts"], errors="coerce").to_numpy(np.float64)
    dur = pd.to_numeric(df["duration"], errors="coerce").to_numpy(np.float64)
    ok = np.isfinite(start) & np.isfinite(dur) & (dur >= 0)
    ok &= pd.to_numeric(df["rank"], errors="coerce").notna().to_numpy()
    ok &= pd.to_numeric(df["step"], errors="coerce").notna().to_numpy()
    if not ok.all():
        warnings.append(f"{path}: {int((~ok).sum())} row(s) with no usable rank, step, start or "
                        "duration skipped")
    out = pd.DataFrame({
        "rank": df["rank"].to_numpy()[ok].astype(np.int64),
        "step": df["step"].to_numpy()[ok].astype(np.int64),
        "optype": df["optype"].astype(str).to_numpy()[ok],
        "start": np.round(start[ok] * scale).astype(np.int64),
        "dur": np.round(dur[ok] * scale).astype(np.int64)})
    for c in ("dp_rank", "stage", "tp_rank", "mc", "mb_id"):
        if c in df:
            out[c] = pd.to_numeric(df[c], errors="coerce").fillna(-1).to_numpy()[ok].astype(
                np.int64)
    unknown = sorted(set(out["optype"].unique()) - set(OPS))
    if unknown:
        warnings.append(f"{path}: op type(s) {', '.join(unknown[:8])} not known: counted as "
                        "other")
    if out.empty:
        raise InputError(f"{path}: no operation to analyse")
    return out


def _peer(df: pd.DataFrame) -> dict:
    """(dp_rank, stage) -> rank."""
    if "dp_rank" not in df or "stage" not in df:
        return {}
    g = df.groupby("rank")[["dp_rank", "stage"]].first()
    return {(int(d), int(s)): int(r) for r, (d, s) in zip(g.index, g.to_numpy())}


def _groups(df: pd.DataFrame) -> dict[str, list[int]]:
    """The data-parallel group of each stage (ranks of one stage), as process groups."""
    if "stage" not in df:
        return {}
    g = df.groupby("rank")["stage"].first()
    return {f"dp.stage{int(s)}": sorted(int(r) for r in g.index[g == s])
            for s in sorted(g.unique())}


def union_ns(start: np.ndarray, end: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    """Per group id in [0, n): the length of the union of its intervals [start, end). Sorted by
    group and start, each interval adds what reaches past the running end of those before it."""
    if start.size == 0:
        return np.zeros(n, dtype=np.int64)
    order = np.lexsort((start, group))
    s, e, g = start[order], end[order], group[order]
    reach = pd.Series(e).groupby(g).cummax().to_numpy()
    prev = np.empty_like(reach)
    prev[0] = np.iinfo(np.int64).min
    prev[1:] = reach[:-1]
    prev[np.r_[True, g[1:] != g[:-1]]] = np.iinfo(np.int64).min  # a group's first interval
    add = np.maximum(reach - np.maximum(s, prev), 0)
    return np.bincount(g, weights=add, minlength=n).astype(np.int64)


def _comm_keys(df: pd.DataFrame, kind: np.ndarray, comm_m: np.ndarray, stage_of: dict,
               dp_of: dict, where: dict) -> np.ndarray:
    """Each row's collective key ("" for a row that is not communication)."""
    # the collectives table: a key per collective kind and group, and per pipeline side (a send
    # and a receive with one neighbour often run as one call: Megatron's
    # send_forward_recv_backward, so they are one key, "sendrecv_next:<peer>")
    kinds = kind.astype(str)
    side = np.char.startswith(kinds, "send") | np.char.startswith(kinds, "recv")
    kinds = np.where(side, np.char.add("sendrecv_", np.char.rpartition(kinds, "_")[:, 2]), kinds)
    opname = np.where(side, "p2p", df["optype"].to_numpy().astype(str))
    rows_rank = df["rank"].to_numpy(np.int64)
    pairs = pd.DataFrame({"op": opname[comm_m], "kind": kinds[comm_m],
                          "rank": rows_rank[comm_m]}).drop_duplicates()
    key_of = {(o, k, r): _key(o, k, int(r), stage_of, dp_of, where)
              for o, k, r in pairs.itertuples(index=False)}
    comm_key = np.array([key_of.get((o, k, r), "") for o, k, r in
                         zip(opname, kinds, rows_rank)], dtype=object)
    return comm_key


def _steps(df: pd.DataFrame):
    """The rank x step frame, the collectives table (with point-to-point peers) and per-rank
    knobs. Every figure is a union of intervals per rank and step (lengths of A minus B as
    |A u B| - |B|), worked out for all groups at once."""
    where = _peer(df)
    stage_of = {r: s for (d, s), r in where.items()}
    dp_of = {r: d for (d, s), r in where.items()}
    ops = pd.Categorical(df["optype"])
    look = [OPS.get(str(o), ("other", "")) for o in ops.categories]
    part = np.array([p for p, _ in look] + ["other"], dtype=object)[ops.codes]
    kind = np.array([k for _, k in look] + [""], dtype=object)[ops.codes]
    start = df["start"].to_numpy(np.int64)
    end = start + df["dur"].to_numpy(np.int64)
    # one group per (rank, step)
    keys = pd.MultiIndex.from_arrays([df["rank"].to_numpy(), df["step"].to_numpy()])
    gid, uniq = pd.factorize(keys, sort=True)
    n = len(uniq)
    ranks = uniq.get_level_values(0).to_numpy(np.int64)
    steps = uniq.get_level_values(1).to_numpy(np.int64)
    # the step's span: from its first op on any rank to its last op's end on any rank
    window = pd.DataFrame({"step": df["step"].to_numpy(), "lo": start, "hi": end}) \
        .groupby("step").agg(lo=("lo", "min"), hi=("hi", "max"))
    lo, hi = window["lo"].to_numpy(), window["hi"].to_numpy()
    # relative times (every step from about 0): lay the steps end to end for the timeline
    relative = len(lo) > 1 and bool((lo[1:] < hi[:-1]).any())
    offset = (np.concatenate([[0], np.cumsum(hi - lo)[:-1]]) - lo if relative
              else np.zeros(len(lo), dtype=np.int64))
    at = window.index.get_indexer(steps)
    step_ns = (hi - lo)[at]

    def u(mask: np.ndarray) -> np.ndarray:
        return union_ns(start[mask], end[mask], gid[mask], n)

    is_ = {p: part == p for p in ("forward", "backward", "optimizer", "collective", "p2p",
                                  "other")}
    compute_m = is_["forward"] | is_["backward"] | is_["optimizer"]
    comm_m = is_["collective"] | is_["p2p"]
    compute = u(compute_m)
    busy = u(compute_m | comm_m)
    idle = np.maximum(step_ns - u(compute_m | comm_m | is_["other"]), 0)
    exposed = busy - compute
    bubble = np.minimum(u(compute_m | is_["p2p"]) - compute, exposed)
    n_comm = np.bincount(gid[is_["collective"]], minlength=n)
    micro = np.bincount(gid[df["optype"].to_numpy() == "forward-compute"], minlength=n)
    # a rank idles (runs none of its ops) while it waits for a synchronization the timeline
    # does not hold (a barrier, a loss all-reduce, a host-side wait): beyond the least any rank
    # idled in the step, that is waiting for the others, a collective of all ranks
    least = pd.Series(idle).groupby(steps).transform("min").to_numpy()
    sync = idle - least
    frame = pd.DataFrame({
        "rank": ranks, "step": steps, "start_ns": (lo + offset)[at], "step_ns": step_ns,
        "data_ns": 0, "compute_ns": compute, "comm_ns": u(comm_m) + sync,
        "comm_exposed_ns": exposed + sync, "wait_ns": 0,
        "other_ns": np.maximum(step_ns - busy - sync, 0),
        "forward_ns": u(is_["forward"]), "backward_ns": u(is_["backward"]),
        "optimizer_ns": u(is_["optimizer"]), "n_comm": n_comm, "data_cpu_ns": 0,
        "bubble_ns": bubble})
    comm_key = _comm_keys(df, kind, comm_m, stage_of, dp_of, where)
    comm = _comm_table(comm_key, comm_m, compute_m, OpSpans(start, end, gid), ranks, steps)
    sync_rows = pd.DataFrame({"rank": ranks, "step": steps, "key": SYNC_KEY, "comm_ns": sync,
                              "exposed_ns": sync, "count": 1})
    comm = pd.concat([comm, sync_rows], ignore_index=True).sort_values(
        ["rank", "step", "key"], ignore_index=True)
    per_rank = {}
    for r, m in pd.Series(micro).groupby(ranks).median().items():
        per_rank[int(r)] = {"forwards_per_step": int(m)} if m > 0 else {}
        if r in stage_of:
            per_rank[int(r)].update({"pipeline_stage": stage_of[r], "dp_rank": dp_of[r]})
    if not len(frame):
        raise InputError("no step to analyse in the op timeline")
    return frame, comm, per_rank


class OpSpans(NamedTuple):
    """Every op's start and end (ns) and its (rank, step) group's number."""
    start: np.ndarray
    end: np.ndarray
    gid: np.ndarray


def _comm_table(key, comm_m, compute_m, ops: OpSpans, ranks, steps) -> pd.DataFrame:
    """(rank, step, key): time in its calls (overlapping ones once: a send and a receive with
    one neighbour often run together), exposed time (its union with the rank's compute, less the
    compute), count; `ranks`, `steps`: each group's."""
    start, end, gid = ops
    codes, names = pd.factorize(key[comm_m])
    k = len(names)
    g2 = gid[comm_m] * k + codes                      # one group per (rank, step, key)
    n2 = int(gid.max() + 1) * k
    present = np.unique(g2)
    # the rank's compute, once for each key it has in that step
    c_g = gid[compute_m]
    per_step_keys = pd.DataFrame({"g": gid[comm_m], "c": codes}).drop_duplicates()
    rep = pd.DataFrame({"g": c_g, "i": np.arange(c_g.size)}).merge(per_step_keys, on="g")
    c_start, c_end = start[compute_m][rep["i"].to_numpy()], end[compute_m][rep["i"].to_numpy()]
    c_grp = rep["g"].to_numpy() * k + rep["c"].to_numpy()
    both = union_ns(np.r_[start[comm_m], c_start], np.r_[end[comm_m], c_end],
                    np.r_[g2, c_grp], n2)
    alone = union_ns(c_start, c_end, c_grp, n2)
    total = union_ns(start[comm_m], end[comm_m], g2, n2)  # overlapping calls of a key once
    count = np.bincount(g2, minlength=n2)
    g_of, c_of = present // k, present % k
    return pd.DataFrame({"rank": ranks[g_of], "step": steps[g_of],
                         "key": np.asarray(names, dtype=object)[c_of],
                         "comm_ns": total[present], "exposed_ns": (both - alone)[present],
                         "count": count[present]})


def _key(op: str, kind: str, rank: int, stage_of: dict, dp_of: dict, where: dict) -> str:
    """The collectives table's key: "kind:group", or for point-to-point "send_next:<peer>"."""
    stage, dp = stage_of.get(rank), dp_of.get(rank)
    if kind.startswith(("send", "recv")) and op == "p2p":
        if stage is None:
            return kind
        peer = where.get((dp, stage + (1 if kind.endswith("_next") else -1)))
        return f"{kind}:{peer}" if peer is not None else kind
    group = GROUP_OF.get(op, "dp")
    if group == "dp" and stage is not None:
        return f"{kind}:dp.stage{stage}"
    if group == "embedding" and dp is not None:
        return f"{kind}:embedding.dp{dp}"
    return f"{kind}:{group}.rank{rank}"  # peers not in the table: nobody to wait for here
