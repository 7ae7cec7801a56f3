"""Communication by process group, each named by its mesh dimension where a DeviceMesh names it
(`dp`, `tp`, `pp`, `cp`, `ep`, ...): what every dimension of a 2D / 3D layout costs per step.

Groups come from the collectives table (kind:group keys); their ranks from the layout (knob
`process_groups`), their dimension from knob `mesh_dims` ({group name: dimension}): recorded
runs read it from the model's DTensor parameters (their DeviceMesh), traces from
distributedInfo's pg_config (`pg_desc` "mesh_<dim>", as DeviceMesh names its groups). Per group,
the mean over its ranks of comm and exposed ms per analysed step, and the kinds seen.
"""

from __future__ import annotations

import numpy as np

from ..vocab import MS


def mesh_dims(table) -> dict[str, str]:
    out: dict[str, str] = {}
    for info in table.ranks.values():
        dims = info.knobs.get("mesh_dims")
        if isinstance(dims, dict):
            out.update({str(k): str(v) for k, v in dims.items() if isinstance(v, str)})
    return out


def groups_section(table, comm: dict, exposed: dict, kinds: dict, layout) -> list[dict]:
    """[{group, dim, ranks, comm_ms, exposed_ms, kinds}] by exposed time, largest first; [] when
    no collective names a group. `comm` / `exposed`: per rank {group: mean ns per step};
    `kinds`: {group: set of kinds}."""
    dims = mesh_dims(table)
    members = dict(layout.groups) if layout is not None else {}
    names = sorted({g for per in comm.values() for g in per})
    if not names or names == [""]:
        return []
    out = []
    for g in names:
        ranks = [r for r in comm if g in comm[r]]
        c = float(np.mean([comm[r][g] for r in ranks])) / MS
        e = float(np.mean([exposed.get(r, {}).get(g, 0.0) for r in ranks])) / MS
        out.append({"group": g or "?", "dim": dims.get(g), "ranks": members.get(g, ranks),
                    "comm_ms": round(c, 3), "exposed_ms": round(e, 3),
                    "kinds": sorted(kinds.get(g, ()))})
    return sorted(out, key=lambda d: -d["exposed_ms"])


def kinds_by_group(table) -> dict[str, set]:
    comm = table.comm
    if comm is None or comm.empty:
        return {}
    out: dict[str, set] = {}
    for key in comm["key"].astype(str).unique().tolist():
        kind, _, group = key.partition(":")
        out.setdefault(group, set()).add(kind)
    return out
