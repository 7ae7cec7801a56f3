"""The recorder's per-module forward times (record(modules=...), record/modules.py) read into
rows of RunTable.ops (kind "module"), checked on the way: a record whose lists do not match is
left out."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .validate import MAX_STEP, is_int

MAX_NS = 1 << 60


def modules_ok(m) -> bool:
    """A modules side record: {"clock": "host" | "cuda", "names": [...], "steps": [...],
    "ns": [[per name]...], "calls": [[per name]...]}."""
    if not isinstance(m, dict) or m.get("clock") not in ("host", "cuda"):
        return False
    names, steps, ns, calls = (m.get(k) for k in ("names", "steps", "ns", "calls"))
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
            and isinstance(steps, list) and isinstance(ns, list) and isinstance(calls, list)
            and len(steps) == len(ns) == len(calls)):
        return False
    return (all(is_int(s, 0, MAX_STEP) for s in steps)
            and all(isinstance(v, list) and len(v) == len(names)
                    and all(is_int(x, 0, MAX_NS) for x in v) for v in ns + calls))


def modules_frame(parts: list[tuple[int, list[dict]]]) -> pd.DataFrame | None:
    """RunTable.ops rows (rank, step, kind, name, count, ns, gpu_ns) of each rank's module
    records (checked by modules_ok): `ns` is the forward's time on the clock that measured it
    (the host's, or the device's where CUDA events did), `gpu_ns` that time again for the
    device's, else 0; a module not called in a step has no row."""
    cols: dict = {k: [] for k in ("rank", "step", "name", "count", "ns", "gpu_ns")}
    for rank, records in parts:
        for m in records:
            cuda = m["clock"] == "cuda"
            for step, ns, calls in zip(m["steps"], m["ns"], m["calls"]):
                for name, t, c in zip(m["names"], ns, calls):
                    if c > 0:
                        for k, v in (("rank", rank), ("step", step), ("name", name),
                                     ("count", c), ("ns", t), ("gpu_ns", t if cuda else 0)):
                            cols[k].append(v)
    if not cols["rank"]:
        return None
    out = pd.DataFrame({k: np.array(v, dtype=object if k == "name" else np.int64)
                        for k, v in cols.items()})
    out.insert(2, "kind", "module")
    for c in ("kind", "name"):
        out[c] = out[c].astype("category")
    return out
