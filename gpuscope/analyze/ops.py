"""Down to the op: the report's `ops` section from the op and kernel views of profiler traces
(RunTable.ops, .messages, .kernel_breakdown; readers/kineto/ops.py).

1. Per rank, over its analysed steps: time per step by top-level torch op, record_function range
   and kernel (the few that matter, the rest summed as "other" so each kind adds up to its
   total). An op's or range's time is the device time of the kernels it launched where the rank
   ran a GPU (the host only queues them), its host time otherwise; a kernel's is its device time.
2. Across ranks: each name's time per step, the mean over the analysed ranks (a rank without it
   counts zero): what `gpuscope compare` diffs.
3. A straggler's excess down to the op: the ops and kernels whose time per step on the straggler
   exceeds the median of its peers (the ranks it is measured against), and those it alone runs.
   The slowest step likewise against the same rank's median step, when it stands out.
4. Collectives with their message: size (the larger of input and output, as NCCL's tests count
   it), group size, time, and the algorithm and bus bandwidth in the NCCL-tests convention
   (algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
   reduce-scatter and all-to-all, 1 otherwise). The time of one instance is the shortest across
   the ranks that ran it (matched by group, collective, size and order): the others include
   waiting for the last to arrive; with one rank's trace it includes that waiting, and the
   bandwidth is a lower bound, said so. Beside it, the link's peak where the device is known.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..sections import Ops
from ..vocab import MS
from .rowgroups import in_analysed, run_starts

#: the kinds of rows and their keys in the report: top-level torch ops, record_function ranges
#: (traces), modules (recorded with record(modules=...)), kernels (traces)
KINDS = (("op", "ops"), ("range", "ranges"), ("module", "modules"), ("kernel", "kernels"))
#: rows per rank and kind in the report; the rest is summed as "other"
TOP = 12
#: names per kind in the run-level table (what compare diffs: enough to say an op appeared or
#: vanished, the rest summed)
TOP_RUN = 500
#: an op's excess is named when it is at least this share of the straggler's own excess, or
#: this many ms per step where the excess is unknown
EXCESS_SHARE = 0.05
EXCESS_MIN_MS = 0.05
#: the slowest step is explained when it is this much longer than its rank's median step
SLOW_STEP = 1.25

#: peak NVLink / Infinity Fabric bandwidth per GPU and direction (GB/s), from the vendors'
#: datasheets: the bound on bus bandwidth inside one node (across nodes the network bounds it);
#: matched on the device name, first match wins
LINKS: tuple[tuple[str, str, float], ...] = (
    (r"A100.*PCIE", "A100 PCIe (PCIe 4.0 x16)", 32.0),
    (r"A100|A800", "A100 SXM (NVLink 3, 12 links)", 300.0),
    (r"H100.*PCIe", "H100 PCIe (PCIe 5.0 x16)", 64.0),
    (r"H100 NVL", "H100 NVL (NVLink bridge)", 300.0),
    (r"H800", "H800 SXM (NVLink 4, 8 links)", 200.0),
    (r"H100|H200|GH200", "H100 / H200 SXM (NVLink 4, 18 links)", 450.0),
    (r"B200|B100|GB200", "B200 (NVLink 5, 18 links)", 900.0),
    (r"V100.*PCIE", "V100 PCIe (PCIe 3.0 x16)", 16.0),
    (r"V100", "V100 SXM2 (NVLink 2, 6 links)", 150.0),
    (r"MI300X|MI325X", "MI300X (Infinity Fabric, 7 links)", 448.0),
)


def link_peak(name: str) -> tuple[float | None, str]:
    """(peak GB/s per direction inside a node, what it is) for a device name; (None, why)."""
    for pattern, label, gbps in LINKS:
        if re.search(pattern, name or "", re.IGNORECASE):
            return gbps, label
    return None, (f"device {name!r} is not in gpuscope's link table" if name
                  else "the device is not known")


def bus_factor(kind: str, n: int) -> float:
    """NCCL-tests' bus bandwidth factor of a collective (its kind: all_reduce, all_gather, ...)
    over n ranks."""
    if n < 1:
        return 1.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def _sig(x: float) -> float:
    """Four significant digits (bandwidths run from MB/s to TB/s)."""
    return float(f"{float(x):.4g}")


def _analysed(ops: pd.DataFrame, frame: pd.DataFrame, mapping=None) -> pd.DataFrame:
    """The rows of analysed steps, each with the step of `frame` it is in (with accumulation,
    a micro-step's optimizer step)."""
    ops = ops[ops["step"].to_numpy() >= 0]  # outside any analysed step (the reader's -1)
    hit, step = in_analysed(frame, mapping, ops["rank"].to_numpy(np.int64),
                            ops["step"].to_numpy(np.int64))
    return ops[hit].assign(step=step[hit])


def _device_ranks(table) -> set[int]:
    """Ranks that ran on a GPU: a trace's "cuda", a record's model device ("cuda:0")."""
    return {r for r, i in table.ranks.items()
            if str(i.knobs.get("device") or "").startswith("cuda")}


def per_step(ops: pd.DataFrame, frame: pd.DataFrame, gpu_ranks: set[int],
             mapping=None) -> pd.DataFrame:
    """Per (rank, kind, name): calls, host, device and charged ms per analysed step of the
    rank (`time_ms`: device time on a GPU rank, host time on a CPU one; kernels: device)."""
    rows = _analysed(ops, frame, mapping)
    if rows.empty:
        return pd.DataFrame(columns=["rank", "kind", "name", "calls", "host_ms", "gpu_ms",
                                     "time_ms"])
    n_steps = frame.groupby("rank")["step"].nunique()
    g = rows.groupby(["rank", "kind", "name"], observed=True)[["count", "ns", "gpu_ns"]].sum()
    g = g.reset_index()
    steps = g["rank"].map(n_steps).astype(float)
    g["calls"] = g.pop("count") / steps
    g["host_ms"] = g["ns"] / steps / MS
    g["gpu_ms"] = g["gpu_ns"] / steps / MS
    # a module's time is its forward's on the clock that measured it (record/modules.py)
    on_gpu = (g["rank"].isin(gpu_ranks) & g["kind"].isin(["op", "range"])) | \
        (g["kind"] == "kernel")
    g["time_ms"] = np.where(on_gpu, g["gpu_ms"], g["host_ms"])
    for c in ("kind", "name"):
        g[c] = g[c].astype(str)
    return g.drop(columns=["ns", "gpu_ns"])


def _row(v: tuple, kind: str, gpu: bool) -> dict:
    """One op's row of a rank's table: `v` its (name, time, calls, host time, GPU time), of
    `kind`, on a rank whose ops ran on a GPU (`gpu`)."""
    name, time_ms, calls, host_ms, gpu_ms = v
    d = {"name": name, "per_step_ms": _r(time_ms), "count_per_step": _r(calls, 2)}
    if kind == "module":  # one clock measured it: CUDA events (device time) or the host's
        d["gpu_ms" if gpu_ms > 0 else "host_ms"] = _r(time_ms)
    elif kind != "kernel":
        d["host_ms"] = _r(host_ms)
        if gpu:
            d["gpu_ms"] = _r(gpu_ms)
    return d


def _descending(values: np.ndarray) -> np.ndarray:
    """The order pandas' sort_values(ascending=False) gives `values` (its nargsort: the values
    reversed, sorted, the order reversed), ties as it leaves them."""
    n = len(values)
    return (n - 1 - np.arange(n))[values[::-1].argsort(kind="quicksort")][::-1]


def _groups_of(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rows' order by an int `key`, each group in the rows' own order; the groups' start
    positions in it, and the end)."""
    order = np.argsort(key, kind="stable")
    starts = run_starts(key[order]) if len(order) else None
    return order, np.append(starts if starts is not None else [], len(order)).astype(np.intp)


def rank_tables(per: pd.DataFrame, types: dict, gpu_ranks: set[int]) -> list[dict]:
    """Per rank: its top ops, ranges and kernels per step, and each kind's total and rest; on a
    GPU rank, the kernel time launched outside any top-level op (from a thread with no op
    open: NCCL's, a compiled graph's), so that ops and kernels add up. On arrays, a slice per
    (rank, kind): 10,000 ranks' traces took minutes as a frame per rank."""
    kind_of = {k: i for i, (k, _) in enumerate(KINDS)}
    kcode = per["kind"].map(kind_of).fillna(len(KINDS)).to_numpy(np.int64)
    rank = per["rank"].to_numpy(np.int64)
    order, bounds = _groups_of(rank * (len(KINDS) + 1) + kcode)  # by rank, then kind
    cols = {c: per[c].to_numpy()[order] for c in ("name", "time_ms", "calls", "host_ms",
                                                   "gpu_ms")}
    rank, kcode = rank[order], kcode[order]
    out: list[dict] = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        r, kc = int(rank[a]), int(kcode[a])
        if not out or out[-1]["rank"] != r:
            if out:
                _outside(out[-1], int(out[-1]["rank"]) in gpu_ranks)
            out.append({"rank": r})
        if kc >= len(KINDS):
            continue
        kind, key = KINDS[kc]
        t = cols["time_ms"][a:b]
        pick = _descending(t)
        ranked = t[pick]
        top = a + pick[:TOP]
        gpu = r in gpu_ranks
        rows = [_row(v, kind, gpu) for v in zip(cols["name"][top].tolist(),
                                                 cols["time_ms"][top].tolist(),
                                                 cols["calls"][top].tolist(),
                                                 cols["host_ms"][top].tolist(),
                                                 cols["gpu_ms"][top].tolist())]
        if kind == "kernel":
            for d in rows:
                d["type"] = types.get(d["name"], "")
        entry = out[-1]
        entry[key] = rows
        entry[f"{key}_total_ms"] = _r(ranked.sum())
        entry[f"{key}_other_ms"] = _r(ranked[TOP:].sum())
    if out:
        _outside(out[-1], int(out[-1]["rank"]) in gpu_ranks)
    return out


def _outside(entry: dict, gpu: bool) -> None:
    """A GPU rank's kernel time launched outside its top-level ops."""
    if gpu and "kernels_total_ms" in entry:
        entry["kernels_outside_ops_ms"] = _r(max(
            entry["kernels_total_ms"] - entry.get("ops_total_ms", 0.0), 0.0))


def run_table(per: pd.DataFrame, n_ranks: int) -> dict:
    """Per kind: each name's ms per step, the mean over the analysed ranks (absent = 0), and
    how many ranks ran it; the top TOP_RUN and the rest summed."""
    out = {}
    for kind, key in KINDS:
        k = per[per["kind"] == kind]
        if k.empty:
            continue
        g = k.groupby("name").agg(time_ms=("time_ms", "sum"), calls=("calls", "sum"),
                                  ranks=("rank", "nunique"))
        g["time_ms"] /= max(n_ranks, 1)
        g["calls"] /= max(n_ranks, 1)
        g = g.sort_values("time_ms", ascending=False)
        out[key] = [{"name": str(n), "per_step_ms": _r(r.time_ms),
                     "count_per_step": _r(r.calls, 2), "ranks": int(r.ranks)}
                    for n, r in g.head(TOP_RUN).iterrows()]
        out[f"{key}_total_ms"] = _r(g["time_ms"].sum())
        out[f"{key}_other_ms"] = _r(g["time_ms"].iloc[TOP_RUN:].sum())
    return out


def excess(per: pd.DataFrame, rank: int, peers: list[int], excess_ms: float | None,
           kinds=("op", "module", "kernel")) -> list[dict]:
    """The ops and kernels whose time per step on `rank` exceeds the median of `peers` (a peer
    without it counts zero), largest first; `only_here` when no peer runs it."""
    if not peers:
        return []
    floor = max(EXCESS_MIN_MS, EXCESS_SHARE * excess_ms) if excess_ms else EXCESS_MIN_MS
    out = []
    for kind in kinds:
        k = per[per["kind"] == kind]
        wide = k.pivot_table(index="name", columns="rank", values="time_ms", aggfunc="sum",
                             fill_value=0.0)
        if rank not in wide.columns:
            continue
        have = [p for p in peers if p in wide.columns]
        ref = wide[have].median(axis=1) if have else pd.Series(0.0, index=wide.index)
        ran = (wide[have] > 0).any(axis=1) if have else pd.Series(False, index=wide.index)
        diff = wide[rank] - ref.reindex(wide.index, fill_value=0.0)
        for name in diff[diff >= floor].sort_values(ascending=False).index[:5]:
            out.append({"kind": kind, "name": str(name), "excess_ms": _r(diff[name]),
                        "rank_ms": _r(wide.at[name, rank]), "peers_ms": _r(ref[name]),
                        "only_here": not bool(ran[name])})
    return out


def slow_step(ops: pd.DataFrame, frame: pd.DataFrame, gpu_ranks: set[int],
              mapping=None) -> dict:
    """The slowest analysed step, when it is SLOW_STEP times its rank's median step or more:
    the ops and kernels longer in it than in that rank's typical step."""
    if frame.empty or frame["step"].nunique() < 3:
        return {}
    i = frame["step_ns"].idxmax()
    rank, step = int(frame.at[i, "rank"]), int(frame.at[i, "step"])
    mine = frame[frame["rank"] == rank]
    med = float(mine["step_ns"].median())
    if med <= 0 or frame.at[i, "step_ns"] < SLOW_STEP * med:
        return {}
    rows = _analysed(ops[ops["rank"] == rank], mine, mapping)
    if rows.empty:
        return {}
    kind = rows["kind"].astype(str)
    t = np.where(((rank in gpu_ranks) & kind.isin(["op", "range"])) | (kind == "kernel"),
                 rows["gpu_ns"], rows["ns"])
    rows = rows.assign(t=t / MS, kind=rows["kind"].astype(str), name=rows["name"].astype(str))
    wide = rows.pivot_table(index=["kind", "name"], columns="step", values="t", aggfunc="sum",
                            fill_value=0.0)
    if step not in wide.columns:
        return {}
    diff = wide[step] - wide.drop(columns=[step]).median(axis=1)
    excess_ms = (float(frame.at[i, "step_ns"]) - med) / MS
    floor = max(EXCESS_MIN_MS, EXCESS_SHARE * excess_ms)
    named = [{"kind": k, "name": n, "excess_ms": _r(v),
              "only_here": bool((wide.loc[(k, n)].drop(step) == 0).all())}
             for (k, n), v in diff[diff >= floor].sort_values(ascending=False).head(6).items()]
    return {"rank": rank, "step": step, "step_ms": _r(frame.at[i, "step_ns"] / MS),
            "median_ms": _r(med / MS), "excess_ms": _r(excess_ms), "ops": named}


def collectives(messages: pd.DataFrame | None, frame: pd.DataFrame, device: str,
                mapping=None) -> list[dict]:
    """Per (group, collective, size): instances, time, algorithm and bus bandwidth (the module's
    docstring, 4.), with the link's peak beside it; largest total time first."""
    if messages is None or messages.empty:
        return []
    m = messages[messages["bytes"] > 0].copy()
    if m.empty:
        return []
    for c in ("group", "collective", "dtype"):
        m[c] = m[c].astype(str)
    m["kind"] = m["collective"]  # the reader's kind (all_reduce, all_gather, ...)
    keys = ["group", "kind", "bytes"]
    # one instance = the same (group, kind, size, order) on each rank: its shortest duration
    inst = m.groupby(keys + ["seq"]).agg(t=("dur_ns", "min"), ranks=("rank", "nunique"),
                                         n=("group_size", "max"), dtype=("dtype", "first"))
    inst = inst.reset_index()
    n_steps = max(frame.groupby("rank")["step"].nunique().max(), 1) if len(frame) else 1
    analysed = _analysed(m, frame, mapping) if len(frame) else m.iloc[:0]
    per_rank_ms = (analysed.groupby(keys + ["rank"])["dur_ns"].sum() / n_steps / MS) \
        .groupby(level=keys).mean() if len(analysed) else pd.Series(dtype=float)
    peak, peak_what = link_peak(device)
    out = []
    for key, g in inst.groupby(keys):
        group, kind, size = key
        n = int(g["n"].max())
        t = g["t"].to_numpy(float)
        t = t[t > 0]
        if not t.size:
            continue
        algbw = size / t  # bytes per ns = GB/s
        busbw = algbw * bus_factor(kind, n)
        ranks = int(g["ranks"].max())
        d = {"group": group, "collective": kind, "bytes": int(size), "dtype": g["dtype"].iloc[0],
             "group_size": n, "instances": int(len(g)), "ranks_seen": ranks,
             "time_us": _r(np.median(t) / 1e3, 1),
             "algbw_gbps": _sig(np.median(algbw)),
             "busbw_gbps": _sig(np.median(busbw)) if n > 1 else None,
             "per_step_ms": _r(per_rank_ms.get(key, 0.0)),
             "basis": ("the shortest of the ranks that ran each instance" if ranks > 1 else
                       "one rank's own duration, which includes waiting for its peers: "
                       "bandwidth is a lower bound")}
        if n <= 1:
            d["note"] = "a group of one rank moves nothing between ranks"
        if peak is not None and n > 1:
            d["link_peak_gbps"] = peak
            d["link"] = peak_what
            d["of_link_pct"] = _r(100 * np.median(busbw) / peak, 1)
        out.append(d)
    out.sort(key=lambda d: (-d["per_step_ms"], -d["time_us"] * d["instances"]))
    return out


#: op changes compare lists: at most this many, of at least this many ms per micro-step
CHANGES = 8
CHANGE_MIN_MS = 0.02


def op_changes(before, after, per_before: float = 1.0, per_after: float = 1.0) -> list[dict]:
    """The ops, ranges and kernels whose time per micro-step changed most between two reports'
    ops sections (sections.Ops or None; their `run` tables; ms per step divided by micro-steps
    per step), with those that appeared or vanished; largest change first."""
    out = []
    rb, ra = (before.run if before else {}), (after.run if after else {})
    for kind, key in KINDS:
        if key not in rb and key not in ra:
            continue
        b = {r["name"]: r["per_step_ms"] / per_before for r in rb.get(key, [])}
        a = {r["name"]: r["per_step_ms"] / per_after for r in ra.get(key, [])}
        if not b or not a:  # one side has no such view: nothing to diff
            continue
        for name in set(b) | set(a):
            d = a.get(name, 0.0) - b.get(name, 0.0)
            if abs(d) < CHANGE_MIN_MS:
                continue
            out.append({"kind": kind, "name": name, "before_ms": _r(b.get(name, 0.0)),
                        "after_ms": _r(a.get(name, 0.0)), "delta_ms": _r(d),
                        "change": ("appeared" if name not in b else "vanished"
                                   if name not in a else "changed")})
    out.sort(key=lambda d: -abs(d["delta_ms"]))
    return out[:CHANGES]


def _device(table) -> str:
    names = {str((i.meta.get("gpu") or {}).get("name") or "") for i in table.ranks.values()}
    names.discard("")
    return next(iter(names)) if len(names) == 1 else ""


def ops_section(table, frame: pd.DataFrame, stragglers: list, mapping=None) -> Ops | None:
    """The report's `ops` section (None without op views); each straggler's `ops` excess set.
    `mapping`: micro-step -> optimizer step, with accumulation (cycles.py)."""
    if table.ops is None or table.ops.empty:
        return None
    gpu = _device_ranks(table)
    per = per_step(table.ops, frame, gpu, mapping)
    if per.empty:
        return None
    kb = table.kernel_breakdown
    types = dict(zip(kb["name"].astype(str), kb["type"].astype(str))) if kb is not None else {}
    ranks = sorted(per["rank"].unique().tolist())
    out = {"basis": "per analysed step, mean over the rank's steps (ms); an op's or range's "
                    "time is the device time of the kernels it launched on a GPU rank, its "
                    "host time on a CPU one; a kernel's is its device time; a module's, its "
                    "forward's (recorded: CUDA events on a GPU, the host clock on a CPU)",
           "ranks": rank_tables(per, types, gpu), "run": run_table(per, len(ranks))}
    for s in stragglers:
        peers = s.peers or [r for r in ranks if r != s.rank]
        s.ops = excess(per, s.rank, [p for p in peers if p != s.rank],
                       s.excess_ns / MS if s.excess_ns > 0 else None)
    slow = slow_step(table.ops, frame, gpu, mapping)
    if slow:
        out["slow_step"] = slow
    coll = collectives(table.messages, frame, _device(table), mapping)
    if coll:
        out["collectives"] = coll
    if kb is not None and not kb.empty:
        out["kernel_breakdown"] = hta_breakdown(kb, table.kernel_types)
    return Ops(**out)


def hta_breakdown(kb: pd.DataFrame, types: dict) -> dict:
    """HTA's get_gpu_kernel_breakdown, per rank: the kernel-type time (µs, with overlaps) and
    each kernel's sum, max, min and mean (µs), the top TOP per rank by sum (on arrays, a slice
    per rank)."""
    order, bounds = _groups_of(kb["rank"].to_numpy(np.int64))
    cols = {c: kb[c].to_numpy()[order] for c in ("rank", "name", "type", "count", "sum_ns",
                                                  "max_ns", "min_ns")}
    ranks = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        rank = int(cols["rank"][a])
        top = a + _descending(cols["sum_ns"][a:b])[:TOP]
        kernels = [{"name": str(name), "type": str(kind), "count": int(n),
                    "sum_us": _r(total / 1e3, 1), "max_us": _r(hi / 1e3, 1),
                    "min_us": _r(lo / 1e3, 1), "mean_us": _r(total / n / 1e3, 1)}
                   for name, kind, n, total, hi, lo in zip(
                       *(cols[c][top].tolist() for c in ("name", "type", "count", "sum_ns",
                                                         "max_ns", "min_ns")))]
        ranks.append({"rank": rank,
                      "types_us": {k: _r(v / 1e3, 1) for k, v in
                                   (types.get(rank) or {}).items()},
                      "kernels": kernels, "kernels_total": int(b - a)})
    return {"basis": "as HTA 0.5's get_gpu_kernel_breakdown computes it: every device event "
                     "launched before the last ProfilerStep of each file (all when there is one "
                     "step), float timestamps rounded inward to whole µs",
            "ranks": ranks}
