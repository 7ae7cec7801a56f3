"""The one resolver of process groups: the name a collective's key carries, whichever way the
collective named its group (torch.distributed's ProcessGroup objects, the functional
collectives' group arguments, symmetric memory's group names), and the global ranks of each
group other than the world's, noted as they are first seen (the layout of a hybrid run).

"default" is the world's group however it is named. Names are cached: objects by identity,
functional-collective arguments by value (rank lists) or identity (a DeviceMesh), registered
names by value; each cache is bounded."""

from __future__ import annotations

#: group name -> its global ranks (groups other than the world's)
_members: dict = {}
_by_object: dict = {}   # id(ProcessGroup) -> name
_by_arg: dict = {}      # (a functional collective's group argument, tag) -> name
_by_name: dict = {}     # a registered name -> "default" or itself
_LIMIT = 4096           # entries a cache holds before it starts again
_MEMBERS = 1024         # groups whose ranks are noted


def members() -> dict:
    """{group name: global ranks} of the non-default process groups seen so far."""
    return dict(_members)


def forget() -> None:
    """A recording ended: a later one may see other groups behind the same objects."""
    _by_arg.clear()


def _ranks_of(group) -> list | None:
    try:
        import torch.distributed as dist

        return [int(r) for r in dist.get_process_group_ranks(group)]
    except Exception:
        return None


def _note(name: str, group) -> None:
    if name not in _members and len(_members) < _MEMBERS:
        ranks = _ranks_of(group)
        if ranks is not None:
            _members[name] = ranks


def _cache(cache: dict, key, name: str) -> str:
    if len(cache) > _LIMIT:
        cache.clear()
    cache[key] = name
    return name


def group_name(group) -> str:
    """The name of a ProcessGroup object (None: the default group)."""
    if group is None:
        return "default"
    name = _by_object.get(id(group))
    if name is not None:
        return name
    try:
        from torch.distributed import distributed_c10d as c10d

        default = c10d._get_default_group() if c10d.is_initialized() else None
    except Exception:
        default = None
    try:  # the world's group passed as an object is the default one all the same
        name = "default" if group is default else str(group.group_name)
    except Exception:
        name = f"pg{len(_by_object)}"
    if name != "default":
        _note(name, group)
    return _cache(_by_object, id(group), name)


def registered_name(name) -> str:
    """The name of a group known by its registered name (symmetric memory's group_name, what a
    functional collective's argument resolves to): "default" for the world's."""
    if not isinstance(name, str):
        return "?"
    got = _by_name.get(name)
    if got is not None:
        return got
    try:
        from torch.distributed import distributed_c10d as c10d

        pg = c10d._resolve_process_group(name)
        if pg is c10d.GroupMember.WORLD or pg is c10d._get_default_group():
            return _cache(_by_name, name, "default")
        _note(name, pg)
    except Exception:
        return name  # not resolvable now: not cached, tried again next time
    return _cache(_by_name, name, name)


def funcol_group_name(funcol, group, tag) -> str:
    """The name of a functional collective's group argument (a ProcessGroup, a (DeviceMesh,
    dim), ranks, a name), as funcol itself resolves it."""
    try:
        key = (tuple(g if isinstance(g, (int, str)) else id(g) for g in group)
               if isinstance(group, (list, tuple)) else
               group if isinstance(group, str) else id(group), tag)
        cached = _by_arg.get(key)
    except TypeError:  # an argument of a shape not foreseen: resolved every time
        key = cached = None
    if cached is not None:
        return cached
    try:
        name = registered_name(str(funcol._resolve_group_name(group, tag or "")))
    except Exception:
        return "?"
    return name if key is None else _cache(_by_arg, key, name)
