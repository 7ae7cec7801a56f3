"""Communication by process group, each named by its mesh dimension where a DeviceMesh names it
(`dp`, `tp`, `pp`, `cp`, `ep`, ...): what every dimension of a 2D / 3D layout costs per step.

Groups come from the collectives table (kind:group keys); their ranks from the layout (knob
`process_groups`), their dimension from knob `mesh_dims` ({group name: dimension}): recorded
runs read it from the model's DTensor parameters (their DeviceMesh), traces from
distributedInfo's pg_config (`pg_desc` "mesh_<dim>", as DeviceMesh names its groups). Per group,
the mean over its ranks of comm, exposed, wait and transfer ms per analysed step, and the kinds
seen. Wait is analyze/wait.py's split taken group by group (`key_waits`): the waiting for the
slowest member inside that group's collectives; transfer is the rest of its exposed time.
Per rank and step, `dim_steps` gives the same by mesh dimension (Parquet columns, Perfetto).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..runtable import key_parts, present_keys
from ..sections import CommGroup
from ..vocab import MS
from .rowgroups import in_analysed


def groups_section(table, comm: dict, exposed: dict, kinds: dict, layout,
                   wait: dict | None = None) -> list[CommGroup]:
    """[CommGroup (sections.py)] by exposed time, largest first; [] when no collective names a
    group. `comm` / `exposed` / `wait`: per rank
    {group: mean ns per step} (wait None: not split, wait_ms and transfer_ms left out);
    `kinds`: {group: set of kinds}."""
    dims = table.mesh_dims()
    members = dict(layout.groups) if layout is not None else {}
    names = sorted({g for per in comm.values() for g in per})
    if not names or names == [""]:
        return []
    out = []
    for g in names:
        ranks = [r for r in comm if g in comm[r]]
        c = float(np.mean([comm[r][g] for r in ranks])) / MS
        e = float(np.mean([exposed.get(r, {}).get(g, 0.0) for r in ranks])) / MS
        row = {"group": g or "?", "dim": dims.get(g), "ranks": members.get(g, ranks),
               "comm_ms": round(c, 3), "exposed_ms": round(e, 3)}
        if wait is not None:
            w = min(float(np.mean([wait.get(r, {}).get(g, 0.0) for r in ranks])) / MS, e)
            row["wait_ms"], row["transfer_ms"] = round(w, 3), round(e - w, 3)
        row["kinds"] = sorted(kinds.get(g, ()))
        out.append(row)
    return [CommGroup(**d) for d in sorted(out, key=lambda d: -d["exposed_ms"])]


def kinds_by_group(table) -> dict[str, set]:
    comm = table.comm
    if comm is None or comm.empty:
        return {}
    out: dict[str, set] = {}
    for key in present_keys(comm):
        kind, _, group = key.partition(":")
        out.setdefault(group, set()).add(kind)
    return out


def dim_steps(table, frame, mapping, waits) -> pd.DataFrame | None:
    """rank, step, dim, comm_ns, exposed_ns, wait_ns: per analysed rank and step (a micro-step's
    collectives counted in its optimizer step, where `mapping` has one), the collectives of each
    mesh dimension summed; None when no group is named by a dimension. `waits`: key_waits'
    table (None: wait_ns left out)."""
    comm, dims = table.comm, table.mesh_dims()
    if comm is None or comm.empty or not dims:
        return None
    parts = []
    for src, cols in ((comm, ("comm_ns", "exposed_ns")), (waits, ("wait_ns",))):
        if src is None or src.empty:
            continue
        group = key_parts(src)[1]  # a dimension per group name, then per row by its code
        dim = np.array([dims.get(str(g)) for g in group.categories] + [None],
                       dtype=object)[group.codes]
        hit, s = in_analysed(frame, mapping, src["rank"].to_numpy(np.int64),
                             src["step"].to_numpy(np.int64))
        sel = hit & pd.notna(dim)
        r = src["rank"].to_numpy(np.int64)
        part = pd.DataFrame({"rank": r[sel], "step": s[sel], "dim": dim[sel]})
        for c in cols:
            part[c] = src[c].to_numpy(np.int64)[sel]
        parts.append(part)
    if not parts or parts[0].empty:
        return None
    out = pd.concat(parts, ignore_index=True).fillna(0)
    out = out.groupby(["rank", "step", "dim"], sort=True, as_index=False).sum()
    for c in ("comm_ns", "exposed_ns", "wait_ns"):
        if c in out:
            out[c] = out[c].astype(np.int64)
    return out
