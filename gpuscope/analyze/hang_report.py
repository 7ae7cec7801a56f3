"""A job's Flight Recorder dumps told: the ranks that stopped the job first (which group they hold,
at which collective, since when, where they were), then who waits on them, then one line per kind
of group: as short for 1,024 ranks as for 4. The `flight_recorder` section of the JSON
(schema gpuscope.flight_recorder/2, documented in docs/hangs.md).
"""

from __future__ import annotations

import os
from collections import Counter

from ..dumps import RankDump
from ..stall_story import ranks_said, clock, rank_list
from .fr_groups import Group, Groups, build, label
from .hang import Hang, Stuck, behind_by, find_hang, reaches

SCHEMA = "gpuscope.flight_recorder/2"


def _group(g: Group) -> str:
    members = g.members
    if not members:
        return g.label()
    return f"{g.label()} ({'rank' if len(members) == 1 else 'ranks'} {rank_list(members, 8)})"


def last_of(d: RankDump | None, gs: Groups) -> dict | None:
    """A rank's last collective, as its ring or its pg_status says: {"kind", "group", "desc",
    "seq", "completed", "at", "unix_ns", "text"}."""
    if d is None:
        return None
    mine = [e for e in d.entries if not e.p2p]
    if mine:
        e = mine[-1]
        text = (f"{e.kind} #{e.seq} on {label(e.name, e.desc)}, "
                + ("completed" if e.done else "not completed")
                + (f", issued at {e.at}" if e.at else "")
                + (f" at {clock(e.created_ns)}" if e.created_ns else ""))
        return {"kind": e.kind, "group": e.name, "desc": e.desc, "seq": e.seq,
                "completed": e.done, "at": e.at, "unix_ns": e.created_ns or None, "text": text}
    done = [(g, g.places[d.rank].completed) for g in gs.of_rank(d.rank)
            if g.places[d.rank].completed >= 0]
    text = ("its ring holds no collective; its pg_status: last completed "
            + ", ".join(f"#{n} on {g.label()}" for g, n in done[:4])) if done else \
        "its dump holds no collective"
    return {"kind": None, "group": None, "desc": None, "seq": None, "completed": None,
            "at": None, "unix_ns": None, "text": text}


def _why_blocked(st: Stuck, r: int) -> str:
    if r in st.no_dump:
        return "left no dump"
    if r in st.no_place:
        return "has nothing of this group in its dump"
    if r in st.not_started:
        return "entered it but its device never started it"
    if st.p2p:
        return "is not in the matching send / recv"
    if r in st.elsewhere:
        return "entered it, but waits in an older collective"
    p = st.group.places[r]
    top = max(q.enqueued for q in st.group.places.values())
    return (f"never entered it (its last there: #{p.enqueued}"
            + (f"; its peers issued up to #{top}" if top > st.seq else "")
            + (f"; tied to the group by {p.inferred}" if p.inferred else "") + ")")


def _place_text(st: Stuck, culprits: list[int]) -> str:
    """One place the culprits hold: who waits there in what, since when, and why they hold it."""
    since = f" since {clock(st.since_ns)}" if st.since_ns else ""
    if len(st.calls) > 1:
        parties = "; ".join(f"{ranks_said(rs)} called {text}" for text, rs in st.calls.items())
        return (f"{_group(st.group)}: mismatched collectives at #{st.seq}{since}: {parties} "
                + (f"({ranks_said(st.odd)} the odd one{'s' if len(st.odd) > 1 else ''} out)"
                   if st.odd else "(which is out of order the calls do not tell)"))
    if st.unknown and not st.blockers():
        return (f"{_group(st.group)}: {ranks_said(st.waiting)} wait in {st.call()} #{st.seq}{since}; "
                f"{st.unknown} member{'s' if st.unknown > 1 else ''} of it left no dump (among "
                f"{ranks_said(st.candidates)}): the group has fewer members in the dumps than the "
                "others of its kind")
    if not st.blockers():
        return (f"{_group(st.group)}: every member entered {st.call()} #{st.seq} and none "
                f"completed it{since}: the collective itself hangs (the network, a device, "
                "the communication library)")
    told: dict[str, list[int]] = {}
    for b in culprits:
        told.setdefault(_why_blocked(st, b), []).append(b)
    what = st.call() if not st.p2p else st.call()
    return (f"{_group(st.group)}: {ranks_said(st.waiting)} wait{'s' if len(st.waiting) == 1 else ''}"
            f" in {what} #{st.seq}{since}; "
            + "; ".join(f"{ranks_said(rs)} {why}" for why, rs in told.items()))


def _culprit_text(r: int, h: Hang, dumps, gs: Groups, places: list[Stuck]) -> str:
    """What a rank that stopped the job was doing: no dump, an odd call, or nothing."""
    d = dumps.get(r)
    if d is None:
        return "left no dump (its process dead, or it never wrote one)"
    if any(r in st.odd for st in places):
        return "called a collective its peers did not"
    waits = "waits in no collective" if r not in h.waits else "waits elsewhere"
    return f"{waits} (its last: {last_of(d, gs)['text']})"


def _culprit_lines(h: Hang, dumps, gs: Groups) -> list[str]:
    """The ranks that stopped the job, each set with the places they hold (the earliest first);
    the first line is the headline."""
    sets: dict[tuple, list[Stuck]] = {}
    for st in h.roots:
        key = tuple(b for b in st.blockers() if b in h.blamed)
        sets.setdefault(key, []).append(st)
    lines = []
    if len(sets) > 1 and h.blamed:
        lines.append(f"{ranks_said(h.blamed)} stopped it, each holding groups of its own:")
    for i, (culprits, places) in enumerate(sets.items()):
        places.sort(key=lambda s: (s.since_ns or 0, s.seq))
        n = f"{len(places)} place{'s' if len(places) > 1 else ''}"
        if not culprits:
            head = f"no rank stopped it; every member waits in the collective, in {n}:"
        elif len(culprits) == 1 and len(sets) == 1:
            head = (f"rank {culprits[0]} stopped it; it "
                    f"{_culprit_text(culprits[0], h, dumps, gs, places)}. Its peers wait for it "
                    f"in {n}:")
        else:
            head = "; ".join(f"rank {r} {_culprit_text(r, h, dumps, gs, places)}"
                             for r in culprits[:3]) + \
                (f" (and {len(culprits) - 3} more)" if len(culprits) > 3 else "") + \
                f". Their peers wait for {'them' if len(culprits) > 1 else 'it'} in {n}:"
        lines.append(head if len(sets) == 1 else f"- {head}")
        lines += [f"  {_place_text(st, list(culprits))}" for st in places[:4]]
        if len(places) > 4:
            lines.append(f"  and {len(places) - 4} more")
        if i == 2 and len(sets) > 3:
            lines.append(f"and {len(sets) - 3} more sets of ranks that stopped the job")
            break
    return lines


def _kinds(gs: Groups, h: Hang) -> dict[str, dict]:
    """{description: {"groups", "stuck", "waiting_on_it", "complete"}}."""
    roots = {id(s.group) for s in h.roots}
    stuck = {id(s.group) for s in h.stuck}
    out: dict[str, Counter] = {}
    for g in gs.groups.values():
        c = out.setdefault(g.desc or "(no description)", Counter())
        c["groups"] += 1
        c["stuck" if id(g) in roots else "waiting_on_it" if id(g) in stuck else "complete"] += 1
    return {k: {n: c[n] for n in ("groups", "stuck", "waiting_on_it", "complete")}
            for k, c in out.items()}


def _kinds_line(kinds: dict[str, dict]) -> str:
    parts = []
    for desc, c in sorted(kinds.items(), key=lambda kv: (-kv[1]["stuck"], kv[0])):
        bits = [f"{c[k]} {w}" for k, w in (("stuck", "stuck"), ("waiting_on_it", "waiting on it"),
                                           ("complete", "complete")) if c[k]]
        parts.append(f"{desc} {c['groups']} group{'s' if c['groups'] > 1 else ''}"
                     + (f" ({', '.join(bits)})" if bits else ""))
    return "By kind of group: " + "; ".join(parts)


def _stuck_json(h: Hang, st: Stuck) -> dict:
    root = reaches(h, st)
    return {"group": st.group.name, "desc": st.group.desc, "ranks": st.group.members,
            "seq": st.seq, "call": st.call(), "waiting": st.waiting, "never_entered": st.never,
            "no_dump": st.no_dump, "no_place": st.no_place, "odd_ones": st.odd,
            "not_started": st.not_started, "calls": st.calls, "since_unix_ns": st.since_ns,
            "root": st in h.roots, "waits_on": None if root is None or root is st else
            root.group.name}


def _stopped_by(h: Hang, dumps, gs) -> list[dict]:
    """Each blamed rank: why, the places it holds, its last collective."""
    out = []
    for r in h.blamed:
        holds = [st for st in h.roots if r in st.blockers()]
        holds.sort(key=lambda s: (s.since_ns or 0, s.seq))
        first = holds[0] if holds else None
        reason = None if first is None else (
            "no_dump" if r in first.no_dump else "no_place" if r in first.no_place else
            "mismatch" if r in first.odd else "not_started" if r in first.not_started else
            "never_entered")
        d = dumps.get(r)
        out.append({"rank": r, "reason": reason, "waits_in_collective": r in h.waits,
                    "holds": [{"group": st.group.name, "desc": st.group.desc,
                               "group_ranks": st.group.members, "seq": st.seq,
                               "call": st.call(), "p2p": st.p2p, "waiting": st.waiting,
                               "behind": behind_by(st, r), "since_unix_ns": st.since_ns}
                              for st in holds],
                    "last": last_of(d, gs), "rank_from": d.rank_from if d else None})
    return out


def tell(dumps: dict[int, RankDump], bad: list[tuple[str, str]] | None = None,
         world_size: int | None = None) -> dict:
    """The dumps' section: who stopped the job, where the others wait, by kind of group."""
    gs = build(dumps, world_size)
    world = gs.world_size
    missing = sorted(set(range(world)) - set(dumps))
    h = find_hang(gs, dumps)
    lines = []
    if h.circle:
        lines.append("in a circle: " + "; ".join(
            f"{ranks_said(s.waiting)} wait in {s.call()} #{s.seq} of {_group(s.group)} for "
            f"{ranks_said(s.blockers())}" for s in h.circle[:4])
            + " (the ranks call collectives of these groups in another order)")
    elif h.roots:
        lines += _culprit_lines(h, dumps, gs)
    else:
        lines.append("No rank waits in a collective in these dumps: every collective they "
                     "entered completed (taken before a hang, or the job stopped outside "
                     "collectives)")
    if h.unread:
        ranks = sorted({b for st in h.unread for b in st.blockers() if b not in dumps})
        lines.append(f"{ranks_said(ranks)} left no readable dump; "
                     f"{ranks_said(sorted({r for st in h.unread for r in st.waiting}))} wait on "
                     f"{'it' if len(ranks) == 1 else 'them'} in {len(h.unread)} group"
                     f"{'s' if len(h.unread) > 1 else ''} (through "
                     f"{'it' if len(ranks) == 1 else 'them'}, on the ranks above, most likely)")
    victims = sorted(r for r, s in h.waits.items() if s not in h.roots)
    if victims:
        groups = {id(h.waits[r].group): h.waits[r].group for r in victims}
        kinds = Counter((g.desc or "group") + (" send / recv" if h.waits[r].p2p else "")
                        for r in victims for g in [h.waits[r].group])
        lines.append(f"Waiting on it: {ranks_said(victims)}, in {len(groups)} other group"
                     f"{'s' if len(groups) > 1 else ''} ("
                     + ", ".join(f"{n} in {k}" for k, n in kinds.most_common()) + ")")
    idle = sorted(set(dumps) - set(h.waits) - set(h.blamed))
    if idle and (h.roots or h.circle):
        lines.append(f"{ranks_said(idle)}: every collective in their dumps completed (they wait "
                     "outside them: a send / recv gloo does not record, a host sync, their next "
                     "step)")
    kinds = _kinds(gs, h)
    if len(gs.groups) > 1:
        lines.append(_kinds_line(kinds))
    notes = _notes(dumps, gs, missing, bad)
    return {"schema": SCHEMA, "world_size": world, "dumps": len(dumps), "missing": missing,
            "hung": bool(h.stuck), "blamed": h.blamed,
            "dumped_at_exit": sorted(r for r, d in dumps.items()
                                     if d.taken in ("sigterm", "error")), "stopped_by": _stopped_by(h, dumps, gs),
            "stuck_groups": [_stuck_json(h, s) for s in h.stuck], "by_kind": kinds,
            "circle": bool(h.circle),
            "unplaced": [{"rank": r, "pg_id": u, "enqueued": s[0], "completed": s[2],
                          "desc": desc} for r, u, s, desc in gs.unplaced],
            "not_dumps": [{"file": f, "why": w} for f, w in bad or ()], "notes": notes,
            "text": "\n".join(lines)}


def _notes(dumps, gs: Groups, missing, bad) -> list[str]:
    notes = []
    if missing:
        notes.append(f"no dump from {ranks_said(missing)} of {gs.world_size} (their processes dead, "
                     "or their dumps not written or elsewhere)")
    by_name = [r for r, d in dumps.items() if d.rank_from == "its file name"]
    if by_name:
        notes.append(f"the rank of {len(by_name)} dump{'s' if len(by_name) > 1 else ''} is "
                     "taken from its file name (their groups do not single one rank out)")
    for d in dumps.values():
        notes.extend(f"{os.path.basename(d.path)}: {n}" for n in d.notes)
    for r, uid, s, desc in gs.unplaced[:8]:
        notes.append(f"rank {r}: pg_status of its group {uid} ({desc or 'no description'}, last "
                     f"completed #{s[2]}) names no group its peers' dumps tie to that id")
    if len(gs.unplaced) > 8:
        notes.append(f"and {len(gs.unplaced) - 8} more group records not tied to a group")
    for f, why in (bad or [])[:8]:
        notes.append(f"{f}: {why}")
    if bad and len(bad) > 8:
        notes.append(f"and {len(bad) - 8} more files that are not dumps")
    return notes
