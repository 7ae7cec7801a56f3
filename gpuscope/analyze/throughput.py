"""How fast the run trains: steps/s, samples/s and tokens/s per rank and globally, FLOP/s and
MFU (model FLOPs utilization) against the device's peak.

Over each rank's analysed micro-steps (warm-up left out): samples are the rows' own batch sizes
(the data wrapper's first batch, and each smaller batch noted on its step); a rank's rate is its
samples over the time of those steps. Globally the ranks' rates add up, each rank training its
own samples (data parallel); in a pipeline only each pipeline's first stage counts (the others
see the same samples again). Tokens are samples x `tokens_per_sample` (the batch's first
(batch, sequence) tensor of integer ids: padding included). FLOPs are one micro-step's
(`record(flops_per_step=...)`, or counted once: `record(count_flops=True)`), scaled to each
step's batch. MFU is achieved FLOP/s over the peak of the device (PEAKS: dense, no sparsity,
for the dtype the parameters have unless a `compute_dtype` knob says otherwise; a
`peak_flops` knob overrides the table); on a device the table does not hold, MFU stays unknown.
`busy_mfu_pct` divides by the rank's own busy time (step minus waiting for other ranks): a
straggler's is lower than the others'.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: dense peak TFLOPS by device and dtype, from the vendors' datasheets (the sparse figures
#: halved where a sheet gives only those); matched on the device name, first match wins
PEAKS: tuple[tuple[str, str, dict], ...] = (
    (r"H100.*PCIe", "H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    (r"H100 NVL", "H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100|H800", "H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"H200", "H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"A100|A800", "A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"V100.*PCIE", "V100 PCIe", {"fp16": 112.0, "fp32": 14.0}),
    (r"V100", "V100 SXM2", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bL4\b", "L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", "A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"MI300X", "MI300X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    (r"MI250X", "MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
)
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
           "float": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def device_peak(name: str, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s, what it is) for a device name and a dtype; (None, why) when unknown."""
    d = _DTYPES.get(str(dtype).replace("torch.", ""), "")
    for pattern, label, peaks in PEAKS:
        if re.search(pattern, name or "", re.IGNORECASE):
            if d in peaks:
                return peaks[d] * 1e12, f"{label} dense {d} ({peaks[d]:,.0f} TFLOPS)"
            return None, f"{label}: no peak for dtype {dtype!r} in gpuscope's table"
    return None, (f"device {name!r} is not in gpuscope's peak table" if name
                  else "the device is not known (a CPU, or no GPU name recorded)")


def _peak_dtype(dtype, tf32: bool) -> str:
    """The peak table's dtype for a torch dtype name: fp32 runs as tf32 where torch allows."""
    d = _DTYPES.get(str(dtype).replace("torch.", ""), "")
    return "tf32" if d == "fp32" and tf32 else d


def math_dtypes(knobs: dict) -> tuple[dict[str, float], str]:
    """({peak dtype: share of the step's FLOPs}, how that is known): the counted step's FLOPs
    by the dtype each op ran in (record(count_flops=True)), else a dtype given as the
    `compute_dtype` knob, else autocast's dtype as the forward ran (precision.py), else the
    parameters'. fp32 is TF32 where `float32_matmul_precision` was "high" or "medium" as the
    forward ran. ({}, why) when nothing says."""
    tf32 = knobs.get("float32_matmul_precision") in ("high", "medium")
    tf32_how = " (fp32 matmuls as TF32: float32_matmul_precision "\
        f"{knobs.get('float32_matmul_precision')!r})" if tf32 else ""
    by = knobs.get("flops_by_dtype")
    if isinstance(by, dict) and by:
        total = float(sum(by.values()))
        shares: dict[str, float] = {}
        for dtype, n in by.items():
            key = _peak_dtype(dtype, tf32) or str(dtype)
            shares[key] = shares.get(key, 0.0) + n / total
        return shares, "the counted step's FLOPs by the dtype each op ran in" + tf32_how
    given = knobs.get("compute_dtype")
    if given:
        return {_peak_dtype(given, False) or str(given): 1.0}, "given (compute_dtype)"
    auto = knobs.get("autocast_dtype")
    if auto and auto != "off":
        return {_peak_dtype(auto, False) or str(auto): 1.0}, f"autocast ({auto}) as the forward ran"
    param = knobs.get("param_dtype")
    if param:
        how = "the parameters' dtype" + (", no autocast as the forward ran" if auto == "off"
                                         else " (whether autocast was on is not recorded)")
        return {_peak_dtype(param, tf32) or str(param): 1.0}, how + tf32_how
    return {}, "the dtype the maths ran in is not known"


def _peak(table, knobs: dict) -> tuple[float | None, str]:
    """(the device's peak FLOP/s for the dtypes the maths ran in, what it is): with several
    dtypes, the peak at which their FLOPs would take the time they take at their own peaks
    (FLOPs over the sum of each dtype's FLOPs over its peak)."""
    if isinstance(knobs.get("peak_flops"), (int, float)) and knobs["peak_flops"] > 0:
        return float(knobs["peak_flops"]), "given (peak_flops)"
    names = {str((info.meta.get("gpu") or {}).get("name") or "") for info in table.ranks.values()}
    names.discard("")
    if len(names) > 1:
        return None, f"ranks on different devices ({', '.join(sorted(names))})"
    shares, how = math_dtypes(knobs)
    name = next(iter(names), "")
    if not shares:  # the device's own reason where it is unknown, else the dtype's
        known = any(re.search(p, name or "", re.IGNORECASE) for p, _, _ in PEAKS)
        return None, how if known else device_peak(name, "")[1]
    if len(shares) == 1:
        peak, what = device_peak(name, next(iter(shares)))
        return peak, (f"{what}; dtype: {how}" if peak else what)
    seconds, parts = 0.0, []
    for dtype, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        peak, what = device_peak(name, dtype)
        if peak is None:
            return None, what
        seconds += share / peak
        parts.append(f"{share:.0%} {dtype}")
    label = what.split(" dense ")[0]
    eff = 1.0 / seconds
    return eff, (f"{label} dense, {' + '.join(parts)} of the FLOPs ({eff / 1e12:,.0f} TFLOPS "
                 f"effective); dtype: {how}")


def _data_ranks(layout, ranks: list[int]) -> tuple[list[int], str]:
    pipes = getattr(layout, "pipelines", None) or []
    if pipes:
        first = [p[0] for p in pipes if p]
        return first, "each pipeline's first stage counts its samples once"
    return ranks, "each rank trains its own samples (data parallel)"


def _add_mfu(out: dict, rows: list, assumes: list, knobs: dict, fps, peak_of: tuple) -> None:
    """FLOP/s and MFU in the section and its rows, where the FLOPs of a step (`fps`) are known;
    `peak_of`: the device's peak FLOP/s and where it comes from (_peak); an MFU over 100% (an
    input is wrong) is said, not given."""
    peak, peak_what = peak_of
    if fps:
        out.update(flops_per_step=fps, flops_source=knobs.get("flops_source", "given"),
                   flop_per_s=round(float(np.mean([r["flop_per_s"] for r in rows])), 1))
        out["peak_flops"] = peak
        out["peak_source"] = peak_what
        if peak:
            mfus = [r["mfu_pct"] for r in rows]
            out["mfu_pct"] = round(float(np.mean(mfus)), 2)
            if max(mfus) > 100:  # impossible: an input is wrong, and MFU is not given
                out["mfu_pct"] = None
                for r in rows:
                    r.pop("mfu_pct", None)
                    r.pop("busy_mfu_pct", None)
                out["mfu_impossible"] = impossible_mfu(max(mfus), peak_what, knobs)
                assumes.append(out["mfu_impossible"])
        else:
            out["mfu_pct"] = None
            assumes.append(f"MFU unknown: {peak_what}")
        for r in rows:
            r["flop_per_s"] = round(r["flop_per_s"], 1)
    else:
        assumes.append("FLOPs not known: record(flops_per_step=...) or count_flops=True")


def _per_rank(micro: pd.DataFrame, rank: np.ndarray, keep, batch: int | None) -> tuple:
    """Per rank of the kept rows: seconds, busy seconds (each step less its waiting, at least
    0), steps and samples (a row without its count, -1, counts the batch size)."""
    size = int(rank.max()) + 1 if len(rank) else 0
    ns = micro["step_ns"].to_numpy(np.float64)[keep]
    t_all = np.bincount(rank, ns, size) / 1e9
    busy = micro["wait_ns"].to_numpy(np.float64)[keep] if "wait_ns" in micro \
        else np.zeros_like(ns)
    np.subtract(ns, busy, out=busy)  # in one array
    del ns
    busy_all = np.bincount(rank, np.maximum(busy, 0, out=busy), size) / 1e9
    del busy
    count = np.bincount(rank, minlength=size)
    if "samples" not in micro:
        return t_all, busy_all, count, count * float(batch or 0)
    n = micro["samples"].to_numpy(np.int64)[keep]
    return t_all, busy_all, count, np.bincount(
        rank, np.where(n >= 0, n, batch or 0).astype(np.float64), size)


def throughput_section(micro: pd.DataFrame, firsts: dict, knobs: dict, table,
                       layout=None, optimizer_steps: np.ndarray | None = None,
                       lasts: dict | None = None) -> dict:
    """The report's `throughput` section from the micro-step table (each rank's rows from its
    first analysed step on, to its last where `lasts` says); {} without steps.
    `optimizer_steps`: with accumulation, each rank's analysed optimizer steps (by rank):
    steps/s counts those, the report's step, not micro-steps (19.59 steps/s beside a step of
    1,222.8 ms), over their own time: `lasts` (each rank's last micro-step of an analysed
    optimizer step) leaves out the micro-steps of an optimizer step the run did not finish."""
    if micro is None or micro.empty:
        return {}
    batch = knobs.get("batch_size") if isinstance(knobs.get("batch_size"), int) else None
    tokens = knobs.get("tokens_per_sample") if isinstance(knobs.get("tokens_per_sample"),
                                                          int) else None
    fps = knobs.get("flops_per_step")
    fps = float(fps) if isinstance(fps, (int, float)) and fps > 0 else None
    peak, peak_what = _peak(table, knobs)
    rank = micro["rank"].to_numpy(np.int64)
    step = micro["step"].to_numpy(np.int64)
    first = np.array([firsts.get(int(r), 0) for r in range(int(rank.max()) + 1)], np.int64) \
        if len(rank) else np.zeros(0, np.int64)
    keep = step >= first[rank]
    if lasts:
        last = np.full(len(first), np.iinfo(np.int64).max, np.int64)
        last[list(lasts)] = list(lasts.values())
        keep &= step <= last[rank]
    if keep.all():  # the analysed frame itself (no accumulation): every row, no copies
        keep = slice(None)
    t_all, busy_all, count, samples_all = _per_rank(micro, rank[keep], keep, batch)
    rows = []
    for r in np.flatnonzero(count).tolist():
        t, busy = float(t_all[r]), float(busy_all[r])
        if t <= 0:
            continue
        samples = float(samples_all[r]) if batch else None
        n = int(count[r]) if optimizer_steps is None or r >= len(optimizer_steps) \
            else int(optimizer_steps[r])
        row = {"rank": int(r), "steps_per_s": round(n / t, 3),
               "samples_per_s": round(samples / t, 2) if samples is not None else None}
        if tokens and samples is not None:
            row["tokens_per_s"] = round(samples * tokens / t, 1)
        if fps:
            flops = fps * (samples / batch if samples is not None and batch else int(count[r]))
            row["flop_per_s"] = flops / t
            if peak:
                row["mfu_pct"] = round(100 * flops / t / peak, 2)
                row["busy_mfu_pct"] = round(100 * flops / max(busy, 1e-9) / peak, 2)
        rows.append(row)
    if not rows:
        return {}
    counted, how = _data_ranks(layout, [r["rank"] for r in rows])
    counted = set(counted)  # 10,000 ranks: a membership test each
    known = [r for r in rows if r["rank"] in counted and r["samples_per_s"] is not None]
    out: dict = {"per_rank": rows, "steps_per_s": round(float(np.median(
        [r["steps_per_s"] for r in rows])), 3)}
    out["samples_per_s"] = round(sum(r["samples_per_s"] for r in known), 2) if known else None
    if tokens and known:
        out["tokens_per_s"] = round(sum(r.get("tokens_per_s", 0.0) for r in known), 1)
    assumes = [how] if known else ["the batch size is not known: samples/s unknown"]
    silent = int(table.world_size) - len(rows)
    if known and silent > 0 and not getattr(layout, "pipelines", None):
        # a rank with no steps (killed before its first rows were written) trained the same
        # steps: the global rate counts it at the others' median, and says so
        med = float(np.median([r["samples_per_s"] for r in known]))
        out["samples_per_s"] = round(out["samples_per_s"] + med * silent, 2)
        if "tokens_per_s" in out:
            out["tokens_per_s"] = round(out["tokens_per_s"] + med * silent * tokens, 1)
        assumes.append(f"{silent} of {int(table.world_size)} ranks have no steps: counted at the "
                       "others' median rate (a synchronous job's ranks train the same steps)")
    if tokens:
        assumes.append(f"{tokens} tokens per sample (the batch's integer id tensor, padding "
                       "included)")
    _add_mfu(out, rows, assumes, knobs, fps, (peak, peak_what))
    out["assumes"] = assumes
    return out


def impossible_mfu(mfu: float, peak_what: str, knobs: dict) -> str:
    """Why an MFU above 100% cannot be, and which input must be wrong."""
    shares, how = math_dtypes(knobs)
    told = "given" if knobs.get("flops_source", "given") == "given" else "counted"
    return (f"MFU unknown: the FLOPs per step ({told}) over the step time would be {mfu:.0f}% of "
            f"the peak ({peak_what}), and no device runs above its peak: either the maths ran "
            "in a lower precision than that peak's (" + (
                "autocast or TF32, which this record does not say: a gpuscope older than the "
                "precision probe wrote it; record again, or set compute_dtype"
                if "not recorded" in how or not knobs.get("float32_matmul_precision")
                else "set compute_dtype to the dtype it ran in") +
            f"), or the FLOPs per step are too many ({told}: "
            + ("count them with count_flops=True" if told == "given" else
               "the counted micro-step was not a typical one") + ")")


def straggler_mfu_gap(section: dict, stragglers: list[int]) -> dict[int, float]:
    """Per straggler: the median rank's busy MFU minus its own (points of MFU)."""
    rows = {r["rank"]: r for r in section.get("per_rank", []) if "busy_mfu_pct" in r}
    if not rows or not stragglers:
        return {}
    med = float(np.median([r["busy_mfu_pct"] for r in rows.values()]))
    return {s: round(med - rows[s]["busy_mfu_pct"], 2) for s in stragglers if s in rows}
