"""Which rank a trace file belongs to: distributedInfo (parsed JSON), else its file name.

Never a text search of the JSON, never a silent rank 0: a rank read from the file name or
assigned for want of any is reported as a warning.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..validate import MAX_RANKS

# rank-3.json.gz, rank_3, rank3, _rank-12., inference_rank_1.json
_NAME_RANK = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class RankId:
    rank: int | None
    world_size: int | None
    backend: str | None
    source: str  # "distributedInfo" | "file name" | "unknown"
    groups: dict | None = None  # process group name -> global ranks (pg_config), if given
    mesh_dims: dict | None = None  # process group name -> mesh dimension (pg_desc "mesh_tp")


def _as_int(x, hi: int = MAX_RANKS) -> int | None:
    """A rank or world size as written, None when it is not one (a number past 1M ranks is
    damage, and would make every per-rank structure that big)."""
    return x if type(x) is int and 0 <= x < hi else None


def rank_from_name(path: str) -> int | None:
    m = _NAME_RANK.search(os.path.basename(path))
    return _as_int(int(m.group(1))) if m else None


def _groups(info: dict) -> dict | None:
    """distributedInfo's pg_config: the process groups this rank belongs to. Every field is
    checked: a pg_config that is not a list, an entry that is not an object, ranks that are not
    a list of ranks or a name that is not a string or a number leave that part out."""
    config = info.get("pg_config")
    if not isinstance(config, list):
        return None
    out = {}
    for pg in config:
        if not isinstance(pg, dict):
            continue
        ranks = pg.get("ranks")
        name = pg.get("pg_name", len(out))
        if type(name) not in (str, int) or isinstance(name, bool):
            continue
        if isinstance(ranks, list) and ranks and all(_as_int(r) is not None for r in ranks):
            out[str(name)] = [int(r) for r in ranks]
    return out or None


def _mesh_dims(info: dict) -> dict | None:
    """{pg_name: dimension} of pg_config's groups that a DeviceMesh made: their pg_desc is
    "mesh_<dimension name>"."""
    config = info.get("pg_config")
    if not isinstance(config, list):
        return None
    out = {}
    for pg in config:
        if isinstance(pg, dict) and type(pg.get("pg_name")) in (str, int) \
                and not isinstance(pg.get("pg_name"), bool):
            desc = pg.get("pg_desc")
            if isinstance(desc, str) and desc.startswith("mesh_") and len(desc) > 5:
                out[str(pg["pg_name"])] = desc[5:]
    return out or None


def identify(path: str, info) -> tuple[RankId, list[str]]:
    """Rank of one trace file, and warnings saying how it was (or was not) found."""
    name = os.path.basename(path)
    warnings: list[str] = []
    world = backend = None
    if isinstance(info, dict):
        world = _as_int(info.get("world_size"), MAX_RANKS + 1)
        backend = info.get("backend") if isinstance(info.get("backend"), str) else None
        rank = _as_int(info.get("rank"))
        if rank is not None:
            return (RankId(rank, world, backend, "distributedInfo", _groups(info),
                           _mesh_dims(info)), warnings)
        what = "distributedInfo has no rank"
    elif info == "invalid":
        what = "distributedInfo is not valid JSON"
    else:
        what = "no distributedInfo"
    rank = rank_from_name(path)
    if rank is not None:
        warnings.append(f"{name}: {what}; rank {rank} taken from the file name")
        return RankId(rank, world, backend, "file name"), warnings
    warnings.append(f"{name}: {what} and no rank in the file name; rank unknown")
    return RankId(None, world, backend, "unknown"), warnings
