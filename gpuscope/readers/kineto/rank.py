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


#: process groups' rank lists seen by this process, each kept once ({tuple: the list}): every
#: rank of a job lists its groups, the default one with every rank in it, so 10,000 ranks'
#: traces held 10,000 copies of a 10,000-rank list each (3.6 GB in the reader, and as much in
#: the processes that parse); equal lists are now one object (pickle sends it once)
_POOL: dict[tuple, list] = {}
#: id of each list in the pool -> whether it is a list of ranks (None: not checked yet); the
#: pool keeps its lists alive, so an id here is that list's
_IDS: dict[int, bool | None] = {}
POOL_MAX_VALUES = 50_000_000  # ranks held by the pool at most (about 800 MB): emptied past it
_pooled = [0]


def shared_ranks(ranks: list) -> list:
    """The pool's list equal to `ranks` (added when new). The list is shared: never changed."""
    if id(ranks) in _IDS:
        return ranks
    key = tuple(ranks)
    got = _POOL.get(key)
    if got is None:
        if _pooled[0] + len(key) > POOL_MAX_VALUES:
            _POOL.clear()
            _IDS.clear()
            _pooled[0] = 0
        got = _POOL[key] = ranks
        _IDS[id(ranks)] = None
        _pooled[0] += len(key)
    return got


def _all_ranks(ranks: list) -> bool:
    """Every value a rank (checked once per pooled list)."""
    known = _IDS.get(id(ranks))
    if known is not None:
        return known
    ok = all(_as_int(r) is not None for r in ranks)
    if id(ranks) in _IDS:
        _IDS[id(ranks)] = ok
    return ok


def shared_info(info):
    """distributedInfo with each pg_config group's "ranks" list taken from the pool (in place;
    anything else as it is)."""
    config = info.get("pg_config") if isinstance(info, dict) else None
    for pg in config if isinstance(config, list) else ():
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            pg["ranks"] = shared_ranks(pg["ranks"])
    return info


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
        if isinstance(ranks, list) and ranks:
            ranks = shared_ranks(ranks)
            if _all_ranks(ranks):  # ints already (_as_int)
                out[str(name)] = ranks
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
