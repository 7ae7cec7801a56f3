"""nn.DataParallel: why it is the slow choice, what device 0 does besides the others, and the
estimate for DistributedDataParallel.

From the recorder's DataParallel totals (record/dataparallel.py): per device the mean forward
per step (CUDA events on each replica's thread), DataParallel's scatter / replicate / gather per
step (host), and the allocator's peak per device. DDP runs one process per GPU: no scatter,
replicate or gather, no GIL shared by the devices' threads, and each device does the same work,
so the estimate removes the measured scatter / replicate / gather and device 0's forward excess
over the median device (backward taken as twice the forward); the gradient all-reduce DDP adds
overlaps backward in buckets and is not counted.
"""

from __future__ import annotations

import numpy as np

from ...results import Suggestion
from ...runtable import RunTable
from ...sections import DataParallel
from ...vocab import MS

WHY_SLOW = ("nn.DataParallel drives every GPU from one process: each step it scatters the batch "
            "from device 0, copies the model onto every GPU and gathers the outputs back on "
            "device 0, which also holds the master weights, computes the loss and sums the "
            "gradients; its per-device threads share one GIL. DistributedDataParallel (one "
            "process per GPU, torchrun) does none of that and is what PyTorch recommends even on "
            "one machine")


def _meta(table: RunTable) -> dict:
    for info in table.ranks.values():
        dp = info.meta.get("dataparallel")
        if isinstance(dp, dict):
            return dp
    return {}


def dataparallel(table: RunTable, typical_step_ns, label: str
                 ) -> tuple[DataParallel | None, list[Suggestion], list[str]]:
    """(report section, suggestions, warnings) for a DataParallel model; None, [], []
    otherwise.
    `typical_step_ns()`: the typical step, worked out only for such a model."""
    knobs = table.knobs()
    if knobs.get("parallel") != "DataParallel":
        return None, [], []
    meta = _meta(table)
    devices = [str(d) for d in meta.get("devices", [])]
    steps = int(meta.get("steps") or 0)
    fwd_n = meta.get("forward_n") or {}
    if len(devices) < 2 or steps < 1 or not all(fwd_n.get(d) for d in devices):
        where = ("on CPU" if str(knobs.get("device", "cpu")).startswith("cpu")
                 else f"over {len(devices) or 1} device")
        return (DataParallel(devices=devices), [],
                [f"the model is nn.DataParallel ({where} it only runs the module): {WHY_SLOW}"])
    step_ns = typical_step_ns()
    fwd = {d: meta["forward_ns"].get(d, 0) / steps for d in devices}  # per step
    host = {k: v / steps for k, v in (meta.get("host_ns") or {}).items()}
    peaks = {d: meta.get("peak_bytes", {}).get(d) for d in devices}
    d0, rest = devices[0], devices[1:]
    med_fwd = float(np.median([fwd[d] for d in rest]))
    excess = max(fwd[d0] - med_fwd, 0.0)
    overhead = sum(host.values())
    section = {"devices": devices,
               "forward_ms": {d: round(fwd[d] / MS, 3) for d in devices},
               "scatter_ms": round(host.get("scatter", 0) / MS, 3),
               "replicate_ms": round(host.get("replicate", 0) / MS, 3),
               "gather_ms": round(host.get("gather", 0) / MS, 3),
               "device0_forward_excess_pct": round(100 * excess / max(med_fwd, 1.0), 1)}
    mem_note = ""
    if all(isinstance(peaks[d], int) for d in devices):
        section["peak_memory_gb"] = {d: round(peaks[d] / 2**30, 3) for d in devices}
        med_mem = float(np.median([peaks[d] for d in rest])) or 1.0
        section["device0_memory_excess_pct"] = round(100 * (peaks[d0] / med_mem - 1), 1)
        mem_note = (f"; device {d0} peaks at {peaks[d0] / 2**30:.2f} GB against "
                    f"{med_mem / 2**30:.2f} GB on the others")
    est = max(step_ns - overhead - 3 * excess, 0.3 * step_ns)
    why = (f"per step DataParallel spends {overhead / MS:.1f} ms scattering, replicating and "
           f"gathering (host), and device {d0}'s forward takes {fwd[d0] / MS:.1f} ms against "
           f"{med_fwd / MS:.1f} ms on the median other device{mem_note}. {WHY_SLOW}; the "
           "estimate removes the scatter, replicate and gather and device 0's excess (backward "
           "taken as 2x forward), and does not count the GIL contention DDP also removes")
    return DataParallel(**section), [Suggestion("parallel", f"nn.DataParallel over {len(devices)} GPUs",
                                "DistributedDataParallel, one process per GPU (torchrun)",
                                est / MS, why, label, (step_ns / max(est, 1.0) - 1) * 100,
                                (est / MS, min(step_ns, est * 1.3) / MS))], []
