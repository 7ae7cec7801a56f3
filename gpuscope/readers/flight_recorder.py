"""torch's Flight Recorder dumps, read beside a run dir: the stall watcher's
(`rank-N.gpuscope.fr.json`, record/stall.py) and torch's own (`TORCH_FR_DUMP_TEMP_FILE` + rank,
`nccl_trace_rank_N` by default: a pickle, or JSON). For each rank and group, the last collective
it entered and the last it completed, by sequence number; the ranks whose dump is missing.

Pickles are read with an unpickler that builds plain containers only (dict, list, str, numbers):
a dump is data, never code.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re

from ..stall_story import fr_group, fr_kind

#: torch's dump files: a prefix, then the rank (nccl_trace_rank_3, fr_trace_rank_3, ...)
_TORCH_NAME = re.compile(r"(?:^|_)rank_?(\d+)$")
_OURS = re.compile(r"^rank-(\d+)(?:-\d+)?\.gpuscope\.fr\.json$")
MAX_BYTES = 256 << 20


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds {module}.{name}: not data")


def load(path: str) -> dict | None:
    """One dump as a dict with its `entries`; None for a file that is not one."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            blob = fh.read()
    except OSError:
        return None
    for decode in (json.loads, lambda b: _DataOnly(io.BytesIO(b)).load()):
        try:
            d = decode(blob)
        except Exception:
            continue
        if isinstance(d, dict) and isinstance(d.get("entries"), list):
            return d
    return None


def find(folder: str) -> dict[int, str]:
    """{rank: dump path} of the dumps in `folder` (ours first where both are there)."""
    out: dict[int, str] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    for name in names:
        m = _OURS.match(name)
        if m:
            out.setdefault(int(m.group(1)), os.path.join(folder, name))
    for name in names:
        m = _TORCH_NAME.search(name)
        if m and not name.endswith((".jsonl", ".cols")):
            out.setdefault(int(m.group(1)), os.path.join(folder, name))
    return out


def summary(folder: str, world_size: int) -> dict:
    """{"ranks": {rank: {group: {"entered", "completed", "pending": [kind #seq]}}}, "missing":
    ranks with no dump (of world_size)}; {} where the folder holds none."""
    paths = find(folder)
    ranks: dict = {}
    for rank, path in paths.items():
        d = load(path)
        if d is None:
            continue
        groups: dict = {}
        for e in d["entries"]:
            if not isinstance(e, dict) or e.get("is_p2p"):
                continue
            seq = e.get("collective_seq_id")
            if not isinstance(seq, int):
                continue
            g = groups.setdefault(fr_group(e), {"entered": 0, "completed": 0, "pending": []})
            g["entered"] = max(g["entered"], seq)
            if e.get("retired") or e.get("state") == "completed":
                g["completed"] = max(g["completed"], seq)
            else:
                g["pending"].append(f"{fr_kind(e)} #{seq}")
        ranks[rank] = groups
    if not ranks:
        return {}
    return {"ranks": ranks, "missing": sorted(set(range(world_size)) - set(ranks))}


def world_size(folder: str) -> int | None:
    """The default group's size, as a dump's pg_config says it ({"ranks": "[0, 1, 2, 3]"})."""
    for path in find(folder).values():
        d = load(path)
        for g in ((d or {}).get("pg_config") or {}).values():
            ranks = g.get("ranks") if isinstance(g, dict) else None
            try:
                ranks = json.loads(ranks) if isinstance(ranks, str) else ranks
            except ValueError:
                continue
            if isinstance(ranks, list) and ranks and (g.get("name") in ("", "0", "default_pg")
                                                       or g.get("desc") in ("", "default_pg")):
                return len(ranks)
    return None
