"""A stalled run, told first: which ranks wait where, which rank never came and where it was,
since when, and whether it was late before. From the stall watcher's records (record/stall.py:
each rank's `stall`, its `stall_end` when steps resumed), the end records (a rank that raised or
was killed) and the slowness report of the steps before.

A rank's place in the collective order is how many collectives it issued on a group (torch's
sequence number, the Flight Recorder's collective_seq_id). The ranks that wait are those at the
highest number on the group the stall is on; a rank at a lower one never reached that
collective; ranks at the same number in collectives of another kind or size are mismatched.
"""

from __future__ import annotations

import os
import time

#: the states in which a rank waits on its peers (a collective, or work that waits on one)
WAITING = ("collective", "wait", "backward", "optimizer")


def clock(ns: int | None) -> str:
    return "?" if not ns else time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + " UTC"


def open_stalls(table) -> dict[int, dict]:
    """{rank: its last stall record} of the ranks whose steps had not resumed when the record
    ends (no stall_end at or after the stall's step)."""
    out = {}
    for r, info in table.ranks.items():
        stalls = info.meta.get("stalls") or []
        if not stalls:
            continue
        last = stalls[-1]
        ends = info.meta.get("stall_ends") or []
        if any(e.get("step", -1) >= last["step"] and e.get("resumed_unix_ns", 0)
               >= last.get("noticed_unix_ns", 0) for e in ends):
            continue
        out[int(r)] = last
    return out


def pauses(table) -> list[dict]:
    """Stalls the run came back from: rank, step, how long, what the rank was in."""
    out = []
    for r, info in sorted(table.ranks.items()):
        stalls = {s["step"]: s for s in info.meta.get("stalls") or []}
        for e in info.meta.get("stall_ends") or []:
            s = stalls.get(e["step"])
            if s is not None:
                out.append({"rank": int(r), "step": int(e["step"]), "lasted_s": e.get("lasted_s"),
                            "in": s.get("in"), "at": _at(s)})
    return out


def _at(stall: dict) -> str | None:
    """The innermost frame of the user's code on the rank's stack: file:line (function)."""
    if stall.get("at"):
        return stall["at"]
    for f in stall.get("stack") or ():
        if f.get("user"):
            return f"{os.path.basename(f['file'])}:{f['line']} ({f['func']})"
    return None


def _target(s: dict) -> tuple[str, int | None, str | None, object]:
    """(group, sequence number, kind, sizes) of the collective a stalled rank is in or waits on;
    (group, collectives issued, None, None) for one that is not in any."""
    if s.get("in") == "collective" and s.get("seq") is not None:
        return s.get("group") or "default", s["seq"], s.get("kind"), s.get("sizes")
    w = s.get("waits_on")
    if isinstance(w, dict) and w.get("seq") is not None:
        return w.get("group") or "default", w["seq"], w.get("kind"), w.get("sizes")
    groups = s.get("groups") or {}
    g = "default" if "default" in groups else next(iter(groups), "default")
    return g, groups.get(g), None, None


def _issued(s: dict, group: str) -> int | None:
    """How many collectives the rank issued on `group`."""
    n = (s.get("groups") or {}).get(group)
    if n is None:
        g, seq, kind, _ = _target(s)
        n = seq if g == group else None
    return n


def _ranks(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _where(s: dict, step: int) -> str:
    where = s.get("in") or "?"
    if where == "collective":
        where = f"{s.get('kind')} #{s.get('seq')} ({s.get('group')} group)"
    elif where == "between steps":
        where = f"between steps {step - 1} and {step}"
    elif where.startswith("after "):
        where = f"step {s.get('step', step)} after its {where[len('after '):]}"
    else:
        where = {"data": "a data fetch", "wait": "a wait on communication"}.get(where, where)
        where = f"{where} of step {s.get('step', step)}"
    at = _at(s)
    return f"in {where} since {clock(s.get('since_unix_ns'))}" + (f", at {at}" if at else "")


def analyse(stalls: dict[int, dict], world_size: int, others: dict[int, str] | None = None,
            parallel: str | None = None) -> dict:
    """The stall from each stalled rank's record: {"step", "group", "seq", "kind", "waiting",
    "never_reached", "mismatched", "silent", "text"}; `others`: {rank: what its end record says}
    of ranks with no open stall (raised, killed)."""
    others = dict(others or {})
    step = max(s.get("step", 0) for s in stalls.values())
    targets = {r: _target(s) for r, s in stalls.items()}
    waiting = {r: t for r, t in targets.items() if stalls[r].get("in") in WAITING
               and t[1] is not None}
    out: dict = {"step": step}
    parts = []
    if waiting:
        # the collective most ranks wait in: the highest number on its group
        group = max(waiting.values(), key=lambda t: t[1])[0]
        seq = max(t[1] for t in waiting.values() if t[0] == group)
        at = {r: t for r, t in waiting.items() if t[0] == group and t[1] == seq}
        kinds = {(t[2], str(t[3])) for t in at.values() if t[2] is not None}
        kind = next(iter(kinds))[0] if len(kinds) == 1 else None
        if len(kinds) > 1:  # the same collective number entered as different collectives
            return _mismatched(stalls, targets, at, group, seq, world_size, others, out)
        out.update(group=group, seq=seq, kind=kind, waiting=sorted(at))
        since = min((stalls[r].get("since_unix_ns") or 0) for r in at) or None
        how = {stalls[r]["in"] for r in at}
        shapes = {_shape(t[3]) for t in at.values() if t[3]}
        what = f"{kind or 'collective'} #{seq} ({group} group" + (
            f", {shapes.pop()}" if len(shapes) == 1 else "") + ")"
        inside = "" if how == {"collective"} else \
            f" (in {'/'.join(sorted(how))}{'; DDP gradient all-reduce' if parallel == 'DDP' and 'backward' in how else ''})"
        parts.append(f"{_ranks(at)} waiting in {what}{inside} since {clock(since)}")
        behind = sorted(r for r, s in stalls.items() if r not in at and (
            _issued(s, group) is None or _issued(s, group) < seq))
        out["never_reached"] = behind
        told: dict = {}  # ranks in the same place told once
        for r in behind:
            told.setdefault(_where(stalls[r], step), []).append(r)
        for text, rs in told.items():
            parts.append(f"{_ranks(rs)} never reached it: {text}")
        # the same collective number, entered as another kind or size
        odd = sorted(r for r, s in stalls.items() if r not in at and r not in behind
                     and targets[r][0] == group and targets[r][1] == seq)
        if len(kinds) > 1 or odd:
            desc = {}
            for r in sorted(set(at) | set(odd)):
                t = targets[r]
                desc.setdefault(f"{t[2] or stalls[r].get('in')} {t[3] or ''}".strip(),
                                []).append(r)
            out["mismatched"] = {k: v for k, v in desc.items()}
            parts.append(f"mismatched collectives at #{seq} on the {group} group: " + "; ".join(
                f"{_ranks(v)} in {k}" for k, v in desc.items()))
    else:
        out["never_reached"] = []
        parts.append("; ".join(f"rank {r} {_where(s, step)}" for r, s in sorted(stalls.items())))
    silent = sorted(set(range(world_size)) - set(stalls))
    out["silent"] = silent
    for r in silent:
        parts.append(f"rank {r} " + others.get(r, "left no word (no stall record: its process "
                                                "dead, frozen, or not recorded)"))
    out["text"] = f"stalled at step {step}: " + "; ".join(parts)
    return out


def _shape(sizes) -> str:
    """[[4225]] -> "[4225]"; several tensors' shapes joined."""
    if not sizes:
        return ""
    return ", ".join(str(list(x)) if isinstance(x, (list, tuple)) else str(x) for x in sizes)


def _mismatched(stalls, targets, at, group, seq, world_size, others, out) -> dict:
    """Ranks at the same collective number in different collectives (kind or sizes): the
    smaller party is the odd one out (never named where the parties are even)."""
    parties: dict = {}
    for r in sorted(at):
        t = targets[r]
        parties.setdefault((t[2], _shape(t[3])), []).append(r)
    ordered = sorted(parties.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    odd = [] if len(ordered) > 1 and len(ordered[0][1]) == len(ordered[1][1]) else \
        sorted(r for _, rs in ordered[1:] for r in rs)
    out.update(group=group, seq=seq, kind=None, waiting=sorted(at), never_reached=[],
               mismatched={f"{k} {s}".strip(): v for (k, s), v in ordered}, odd_ones=odd)
    since = min((stalls[r].get("since_unix_ns") or 0) for r in at) or None
    text = (f"mismatched collectives at #{seq} on the {group} group since {clock(since)}: "
            + "; ".join(f"{_ranks(v)} in {k}" + (f" of {s}" if s else "")
                        for (k, s), v in ordered))
    if odd:
        frames = [(f"rank {r} " if len(odd) > 1 else "") + f"at {_at(stalls[r])}" for r in odd
                  if _at(stalls[r])]
        text += f" ({_ranks(odd)} the odd one{'s' if len(odd) > 1 else ''} out" + (
            ", " + ", ".join(frames) if frames else "") + ")"
    silent = sorted(set(range(world_size)) - set(stalls))
    out["silent"] = silent
    parts = [text] + [f"rank {r} " + (others or {}).get(r, "left no word") for r in silent]
    out["text"] = f"stalled at step {max(s.get('step', 0) for s in stalls.values())}: " + \
        "; ".join(parts)
    return out


def tell(stalls: dict[int, dict], world_size: int, missing_word: bool = False,
         parallel: str | None = None) -> str:
    """One line (the live log's): who waits where and who is missing."""
    return analyse(stalls, world_size, parallel=parallel)["text"]


def culprits(found: dict) -> list[int]:
    """The ranks the stall points at: never reached the collective, or said nothing."""
    return sorted(set(found.get("never_reached") or []) | set(found.get("silent") or [])
                  | set(found.get("odd_ones") or []))


def late_before(report, rank: int, verb: str = "stalled") -> str:
    """Whether `rank` was late in the steps before, from the slowness report."""
    for s in report.stragglers:
        if s.rank == rank:
            word = "probably the straggler" if s.probable else "the straggler"
            n, of = s.last_in
            return (f"rank {rank} was already {word} before it {verb} ({s.excess_ns / 1e6:.1f} "
                    "ms a step busier than the median rank" + (f", last to arrive in {n} of "
                                                               f"{of} steps" if of else "") + ")")
    for m in report.minor_stragglers or ():
        if m.rank == rank:
            return (f"rank {rank} was already slightly late before it {verb} "
                    f"({m.late_ms:.1f} ms a step, under the imbalance threshold)")
    if not report.steps or all(r.rank != rank for r in report.ranks):
        return f"no steps of rank {rank} to tell whether it was late before it {verb}"
    return f"rank {rank} was not late before it {verb}"


def section(table, report) -> dict:
    """The report's `stall` section ({} when no rank stalled): analyse()'s fields, with whether
    each rank the stall points at was late before, and the pauses the run came back from."""
    if table.source != "record":
        return {}
    stalls = open_stalls(table)
    back = pauses(table)
    if not stalls:
        return {"pauses": back} if back else {}
    from .stopped import _why

    others = {}
    for r, info in table.ranks.items():
        if r in stalls:
            continue
        end = info.meta.get("end")
        why = _why(end)
        err = (end or {}).get("error_where") if isinstance(end, dict) else None
        at = _at(err) if isinstance(err, dict) else None
        others[int(r)] = (f"stopped: {why}" if why else "ended") + (f", at {at}" if at else "")
    for r in sorted(set(range(table.world_size)) - set(table.ranks)):
        others[r] = "has no record"
    found = analyse(stalls, table.world_size, others,
                    parallel=(report.knobs or {}).get("parallel"))
    found["late_before"] = {r: late_before(report, r) for r in culprits(found)}
    plain = [r for r, t in found["late_before"].items() if t.endswith("was not late before it "
                                                                        "stalled")]
    said = [t for r, t in found["late_before"].items() if r not in plain]
    if len(plain) > 1:
        said.append(f"{_ranks(plain)} were not late before they stalled")
    elif plain:
        said.append(found["late_before"][plain[0]])
    if said:
        found["text"] += "; " + "; ".join(said)
    found["ranks"] = {int(r): {k: v for k, v in s.items() if k != "stack"} | {"at": _at(s)}
                      for r, s in stalls.items()}
    found["stacks"] = {int(r): s.get("stack") or [] for r, s in stalls.items()}
    if back:
        found["pauses"] = back
    return found
