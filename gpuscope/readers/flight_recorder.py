"""torch's Flight Recorder dumps, recognised by what they hold, whatever their file name: torch's
own (`TORCH_FR_DUMP_TEMP_FILE` + rank, `nccl_trace_rank_N` by default; a pickle, or JSON from
`_dump_fr_trace_json`) and the stall watcher's (`rank-N.gpuscope.fr.json`, record/stall.py).

What a dump holds (format "2.x", torch/csrc/distributed/c10d/FlightRecorderDetail.hpp):
- `pg_config`: {group name: {"name", "desc", "ranks": "[0, 1]"}}, the groups this process is a
  member of (NCCL; gloo writes one unnamed record, `""`, whose ranks are those of the last group
  it built);
- `pg_status`: {pg_id: last enqueued / started / completed collective sequence number}: `pg_id`
  is the process's own count of its groups, not the name; it outlives a ring that wrapped or was
  dumped with only the active entries;
- `entries` (absent from a JSON dump with none): the ring of the last collectives, each with its
  group (`process_group`: name, description; `pg_id`), `collective_seq_id` (`p2p_seq_id` for
  send / recv), kind, sizes, state, `retired`, the Python frames that issued it.

The rank a dump belongs to comes from the dump: the one rank every group of its `pg_config`
holds (or the stall watcher's `gpuscope.rank`); where the groups leave more than one (a job with
one group), from the number its file name ends with, as torch names them.

Pickles are read with an unpickler that builds plain containers only (dict, list, str,
numbers): a dump is data, never code.
"""

from __future__ import annotations

import ast
import gc
import io
import json
import os
import pickle
import re
from functools import lru_cache

from ..dumps import Entry, RankDump
from ..run_format import FR_SUFFIX

#: the most recent collectives (and sends / recvs) of each group kept of a rank's ring: enough
#: for where it waits and what the group does each step
KEEP = 16
#: the largest dump read (a ring of 20,000 entries with stacks is some tens of MB)
MAX_BYTES = 1 << 30
#: files beside dumps that are something else gpuscope reads, never reported as not dumps
_OTHERS = re.compile(r"\.(?:jsonl|cols|parquet|csv|txt|log|md|html|png|pt\.trace\.json(?:\.gz)?)$"
                     r"|\.gpuscope\.|^events\.out\.tfevents")
#: the stall watcher's dumps (record/stall.py)
_OURS = re.compile(r"^rank-(\d+)(?:-\d+)?\.gpuscope\.fr\.json$")
#: a file name's last number, torch's `prefix + rank` (an extension after it allowed)
_TRAILING = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|bin|dump))?$")
#: frames of library code (torch, Python, installed packages), by path on the job's machine
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python\d|/torch/(?:distributed|nn|"
                      r"autograd|utils|_)|^<|/gpuscope/(?:record|readers)/")


_P2P = re.compile(r"^(send|recv)\s+\d+\s*(?:->|<-)\s*(\d+)$")


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds {module}.{name}: not data")


def _decode(blob: bytes):
    head = blob[:1]
    if head == b"\x80":  # buffered: the C unpickler peeks instead of calling read() each time
        return _DataOnly(io.BufferedReader(io.BytesIO(blob))).load()
    if blob.lstrip()[:1] == b"{":
        try:
            import orjson

            return orjson.loads(blob)
        except ImportError:
            return json.loads(blob)
    raise ValueError("neither a pickle nor JSON")


@lru_cache(maxsize=4096)
def _parse_ranks(text: str) -> tuple[int, ...] | None:
    try:
        v = json.loads(text)
    except ValueError:
        try:
            v = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
        return tuple(v)
    return None


def _ranks(v) -> tuple[int, ...] | None:
    """pg_config's "[0, 1, 2]" (a list in some dumps) as a tuple of ints."""
    if isinstance(v, str):
        return _parse_ranks(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
        return tuple(v)
    return None


def _int(v, default: int = -1) -> int:
    """pg_status's numbers: ints in a pickle, strings in JSON."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def is_library(path: str) -> bool:
    """A frame's file is library code (torch, Python, an installed package, gpuscope's own), by
    its path on the job's machine."""
    return not path or bool(_LIBRARY.search(path))


def user_frame(frames) -> str | None:
    """The innermost frame of the user's code (not torch, Python or an installed package), as
    file:line (function); frames come innermost first."""
    for f in frames or ():
        if not isinstance(f, dict):
            continue
        path = str(f.get("filename") or "")
        if not is_library(path):
            return f"{os.path.basename(path)}:{f.get('line')} ({f.get('name')})"
    return None


def _entry(e: dict) -> Entry | None:
    pg = e.get("process_group")
    if not isinstance(pg, (list, tuple)) or len(pg) < 2:
        return None
    p2p = bool(e.get("is_p2p"))
    seq = e.get("p2p_seq_id" if p2p else "collective_seq_id")
    if not isinstance(seq, int):
        return None
    state = e.get("state")
    kind = str(e.get("profiling_name") or "?").split(":")[-1].strip()
    peer = None
    m = _P2P.match(kind)
    if m:  # NCCL's "send 0->1", "recv 1<-0": ranks in the group
        kind, peer = m.group(1), int(m.group(2))
    return Entry(uid=_int(e.get("pg_id")), name=str(pg[0]), desc=str(pg[1]), seq=seq, p2p=p2p,
                 kind=kind, peer=peer,
                 sizes=str(e.get("input_sizes") or []),
                 done=bool(e.get("retired")) or state == "completed",
                 started=state in ("started", "completed"),
                 created_ns=_int(e.get("time_created_ns"), 0), at=user_frame(e.get("frames")))


def _recent(raw) -> list[Entry]:
    """The last KEEP entries of each group (collectives and sends / recvs apart), in ring order:
    a ring of 20,000 entries costs a look at each, and the reading of a few hundred."""
    kept, counts = [], {}
    for e in reversed(raw):
        pg = e.get("process_group") if isinstance(e, dict) else None
        if not isinstance(pg, (list, tuple)) or len(pg) < 2:
            continue
        key = (pg[0], e.get("is_p2p"))
        n = counts.get(key, 0)
        if n >= KEEP and (e.get("retired") or e.get("state") == "completed"):
            continue  # those not completed are all kept: where the rank waits is among them
        counts[key] = n + 1
        x = _entry(e)
        if x is not None:
            kept.append(x)
    kept.reverse()
    return kept


def is_dump(d) -> bool:
    """A Flight Recorder dump's top level: its format version with its group records, or a ring of
    entries."""
    return isinstance(d, dict) and (
        ("version" in d and ("pg_config" in d or "pg_status" in d))
        or isinstance(d.get("entries"), list))


def _rank_of(d: dict, path: str, config) -> tuple[int | None, str, list[str]]:
    ours = d.get("gpuscope")
    if isinstance(ours, dict) and isinstance(ours.get("rank"), int):
        return ours["rank"], "gpuscope", []
    base = os.path.basename(path)
    named = _OURS.match(base) or _TRAILING.search(base)
    named = int(named.group(1)) if named else None
    sets = [set(ranks) for _, ranks in config.values() if ranks]
    common = set.intersection(*sets) if sets else set()
    if len(common) == 1:
        rank = common.pop()
        notes = [] if named in (None, rank) else [
            f"its file name ends in {named}, but its groups' members say rank {rank}"]
        return rank, "the dump", notes
    if named is not None and (not common or named in common):
        return named, "its file name", []
    return None, "", []


def load(path: str) -> RankDump | str:
    """One dump, read; or why the file is not one (a sentence)."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return f"larger than {MAX_BYTES >> 20} MB"
        with open(path, "rb") as fh:
            blob = fh.read()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not blob:
        return "empty"
    try:
        d = _decode(blob)
    except Exception as e:
        why = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
        if "not data" in why:
            return f"a pickle that is not plain data ({why})"
        if blob[:1] == b"\x80":
            return f"a truncated or corrupt pickle ({why})"
        if blob.lstrip()[:1] == b"{":
            return f"truncated or corrupt JSON ({why})"
        return f"not a Flight Recorder dump ({why})"
    if not is_dump(d):
        keys = ", ".join(sorted(map(str, d))[:6]) if isinstance(d, dict) else type(d).__name__
        return f"not a Flight Recorder dump (it holds {keys}; a dump holds version, pg_config, " \
               "pg_status and entries)"
    return _read(d, path)


def _read(d: dict, path: str) -> RankDump | str:
    config, unnamed = {}, None
    for name, g in (d.get("pg_config") or {}).items():
        if not isinstance(g, dict):
            continue
        ranks = _ranks(g.get("ranks"))
        if str(name) == "":
            unnamed = ranks or None
        elif ranks:
            config[str(name)] = (str(g.get("desc") or ""), ranks)
    status = {}
    for uid, s in (d.get("pg_status") or {}).items():
        if isinstance(s, dict):
            status[_int(uid)] = (_int(s.get("last_enqueued_collective")),
                                 _int(s.get("last_started_collective")),
                                 _int(s.get("last_completed_collective")))
    ours = d.get("gpuscope")
    if isinstance(ours, dict) and isinstance(ours.get("groups"), dict):
        for name, g in ours["groups"].items():  # the stall watcher's: every group with members
            ranks = _ranks(g.get("ranks")) if isinstance(g, dict) else None
            if ranks:
                config.setdefault(str(name), (str(g.get("desc") or ""), ranks))
    entries = _recent(d.get("entries") or ())
    rank, how, notes = _rank_of(d, path, config)
    if rank is None:
        return ("a dump whose rank cannot be told: its groups do not single one out and its file "
                "name ends in no number (torch names them prefix + rank)")
    return RankDump(rank=rank, path=path, version=str(d.get("version") or "?"), config=config,
                    status=status, entries=entries, rank_from=how, unnamed=unnamed, notes=notes,
                    taken=ours.get("when") if isinstance(ours, dict) else None)


def _skip(name: str) -> bool:
    return name.startswith(".") or bool(_OTHERS.search(name))


def _candidates(folder: str, quiet: bool) -> list[str]:
    """The files of `folder` that may be dumps; `quiet` (beside a run dir): only those named as
    dumps are (the stall watcher's, or a name ending in a number, as torch names them)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [n for n in names if n.endswith(FR_SUFFIX) or (
        not _skip(n) and (not quiet or _TRAILING.search(n))
        and os.path.isfile(os.path.join(folder, n)))]


def _load_all(folder: str, names: list[str]) -> list:
    """load() of each file; half of them in a forked process where there are many (a job's
    dumps are one file a rank: unpickling them is most of the time)."""
    paths = [os.path.join(folder, n) for n in names]
    if len(paths) < 64:
        return [load(p) for p in paths]
    from .fork import can_fork, in_child

    if not can_fork():
        return [load(p) for p in paths]
    cut = len(paths) // 2
    with in_child(lambda: [load(p) for p in paths[:cut]]) as collect:
        mine = [load(p) for p in paths[cut:]]
        status, theirs = collect()
    if status != "ok":
        theirs = [load(p) for p in paths[:cut]]
    return theirs + mine


def find(folder: str, quiet: bool = False) -> tuple[dict[int, RankDump], list[tuple[str, str]]]:
    """The dumps in `folder` ({rank: dump}) and the files that are not ([(file, why)]); files of
    other kinds gpuscope reads (records, traces) are left out of both, and with `quiet` (a run
    dir's folder) the files not named as dumps. Two dumps of one rank: the stall watcher's is
    kept (it names its groups' members), else the later file."""
    dumps: dict[int, RankDump] = {}
    bad: list[tuple[str, str]] = []
    names = _candidates(folder, quiet)
    was = gc.isenabled()
    gc.disable()  # a dump is hundreds of thousands of small containers, none cyclic
    try:
        loaded = _load_all(folder, names)
    finally:
        if was:
            gc.enable()
    for name, got in zip(names, loaded):
        if isinstance(got, str):
            bad.append((name, got))
            continue
        old = dumps.get(got.rank)
        if old is None or got.rank_from == "gpuscope" or old.rank_from != "gpuscope":
            if old is not None:
                got.notes.append(f"two dumps of rank {got.rank}: {os.path.basename(old.path)} "
                                 f"and {name}; {name} is read")
            dumps[got.rank] = got
    return dumps, bad
