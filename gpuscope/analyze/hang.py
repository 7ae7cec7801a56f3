"""Who stopped the job, from its Flight Recorder dumps (fr_groups.py): where each rank waits, per
process group the collective its members wait in and the members that hold it, then, following
each holder to where it waits itself, the ranks at the end of the chain.

1. Where a rank waits: the oldest collective (or send / recv) in its ring it has not completed.
   Those it issued after it (NCCL issues without waiting) are queued behind it, not waited in.
   A rank whose ring holds none waits in nothing (its program stopped issuing collectives:
   stuck in Python, in data loading, dead); one whose ring is empty waits where its pg_status
   shows a collective enqueued and not completed, where that is one group.
2. A group is stuck at collective #s: the lowest its members wait in. Its holders: the members
   below #s (never entered it), those that entered it but wait in something older, members with
   no dump or no place on the group; where every member waits in it, the ranks whose call
   differs (kind or sizes: a mismatch, the smaller party the odd one out, else the call the
   group never made before), or that did not start it on the device while others did.
3. A send / recv waits on its partner, unless the partner waits in the matching op.
4. A holder that waits elsewhere is a victim: where it waits is followed. Holders that wait in
   nothing, or left no dump, stopped the job. Where every member waits in one collective and none
   completed it, the collective itself hangs (the network, the communication library).

Sequence numbers are compared only within one group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dumps import Entry, RankDump
from .fr_groups import Group, Groups


@dataclass
class Stuck:
    """Where some ranks wait: a group's collective #seq, or one rank's send / recv."""

    group: Group
    seq: int
    waiting: list[int]
    never: list[int] = field(default_factory=list)       # below #seq: never entered it
    elsewhere: list[int] = field(default_factory=list)   # entered it, wait in something older
    no_dump: list[int] = field(default_factory=list)
    no_place: list[int] = field(default_factory=list)    # a dump with no place on the group
    calls: dict[str, list[int]] = field(default_factory=dict)  # "kind of sizes": ranks at #seq
    odd: list[int] = field(default_factory=list)
    not_started: list[int] = field(default_factory=list)
    since_ns: int | None = None
    #: a send / recv: its partner (global rank; None where the dump does not say)
    peer: int | None = None
    p2p: bool = False
    #: members with no dump that no dump names (gloo), and the ranks they are among
    unknown: int = 0
    candidates: list[int] = field(default_factory=list)

    def blockers(self) -> list[int]:
        return sorted(set(self.never) | set(self.elsewhere) | set(self.no_dump)
                      | set(self.no_place) | set(self.odd) | set(self.not_started))

    def call(self) -> str:
        """The collective the waiting ranks are in ("all_to_all of [[16]]")."""
        waiting = set(self.waiting) - set(self.odd)
        for text, ranks in self.calls.items():
            if waiting & set(ranks):
                return text
        return "collective"


def call_text(e: Entry) -> str:
    return f"{e.kind} of {e.sizes}" if e.sizes not in ("[]", "") else e.kind


def front(d: RankDump, gs: Groups) -> Entry | tuple[Group, int] | None:
    """Where rank `d` waits: its oldest entry not completed; for an empty ring, the one group its
    pg_status shows behind (group, the collective's number); None: it waits in nothing."""
    for e in d.entries:
        if not e.done:
            return e
    if d.entries:
        return None
    open_ = [(g, p.completed + 1) for g in gs.of_rank(d.rank)
             for p in [g.places[d.rank]] if p.waiting()]
    return open_[0] if len(open_) == 1 else None


def _history(g: Group, before: int) -> set[str]:
    """The calls the group's members made before #before (what the group does each step)."""
    return {call_text(e) for p in g.places.values() for s, e in p.by_seq.items() if s < before}


def expected_call(g: Group, seq: int) -> str | None:
    """The call the group's own rhythm puts at #seq: its members' calls before it, in order,
    repeat with a period P (a step's collectives); the call P before. None where the ring does
    not hold two periods, or the calls do not repeat."""
    hist: dict[int, str] = {}
    for p in g.places.values():
        for s, e in p.by_seq.items():
            if s < seq:
                hist.setdefault(s, call_text(e))
    calls, s = [], seq - 1
    while s in hist:
        calls.append(hist[s])
        s -= 1
    calls.reverse()  # the contiguous calls up to #seq - 1
    for period in range(1, len(calls) // 2 + 1):
        if all(calls[i] == calls[i - period] for i in range(period, len(calls))):
            return calls[len(calls) - period]
    return None


def _mismatch(st: Stuck) -> None:
    """The odd ones out of calls that differ at one number: the smaller party; between even
    parties, the one whose call is not the one the group's rhythm puts there, else the call the
    group never made before."""
    if len(st.calls) < 2:
        return
    parties = sorted(st.calls.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    if len(parties[0][1]) > len(parties[1][1]):
        st.odd = sorted(r for _, rs in parties[1:] for r in rs)
        return
    want = expected_call(st.group, st.seq)
    if want in st.calls:
        st.odd = sorted(r for text, rs in parties if text != want for r in rs)
        return
    seen = _history(st.group, st.seq)
    new = [rs for text, rs in parties if text not in seen]
    if new and len(new) < len(parties):
        st.odd = sorted(r for rs in new for r in rs)


def _at(fronts: dict, r: int, g: Group) -> int | None:
    f = fronts.get(r)
    if isinstance(f, Entry):
        return f.seq if (not f.p2p and f.name == g.name and r in g.places) else None
    if isinstance(f, tuple):
        return f[1] if f[0] is g else None
    return None


def stuck_at(g: Group, fronts: dict, dumped: set[int]) -> Stuck | None:
    """Where group `g` is stuck, or None where no member waits in it."""
    at = {r: s for r in g.places if (s := _at(fronts, r, g)) is not None}
    if not at:
        return None
    seq = min(at.values())
    places = g.places
    st = Stuck(group=g, seq=seq, waiting=sorted(r for r, s in at.items() if s == seq),
               never=sorted(r for r, p in places.items() if p.enqueued < seq),
               no_dump=[r for r in g.members if r not in dumped],
               no_place=[r for r in g.members if r in dumped and r not in places])
    st.elsewhere = sorted(r for r, p in places.items() if p.enqueued >= seq and r not in at
                          and p.completed < seq and fronts.get(r) is not None)
    st.unknown, st.candidates = g.unknown, g.candidates
    for r in st.waiting:
        e = places[r].by_seq.get(seq)
        if e is not None:
            st.calls.setdefault(call_text(e), []).append(r)
            if e.created_ns and (st.since_ns is None or e.created_ns < st.since_ns):
                st.since_ns = e.created_ns
    if not st.blockers() and not st.unknown:
        _mismatch(st)
        started = {r for r in st.waiting if places[r].started >= seq}
        if started and not st.odd:  # the device's view, where the dump has it (NCCL timing)
            st.not_started = sorted(set(st.waiting) - started)
    return st


def _p2p_stuck(r: int, e: Entry, gs: Groups, fronts: dict, dumped: set[int]) -> Stuck:
    g = next((g for g in gs.groups.values() if g.name == e.name and r in g.members), None)
    g = g or Group(name=e.name, desc=e.desc)
    members = list(g.declared or ())
    peer = members[e.peer] if e.peer is not None and e.peer < len(members) else None
    if peer is None and len(g.members) == 2:
        peer = next(m for m in g.members if m != r)
    st = Stuck(group=g, seq=e.seq, waiting=[r], p2p=True, peer=peer,
               calls={f"{e.kind} {'to' if e.kind == 'send' else 'from'} rank "
                      f"{peer if peer is not None else '?'}": [r]},
               since_ns=e.created_ns or None)
    if peer is None:
        return st
    if peer not in dumped:
        st.no_dump = [peer]
        return st
    f = fronts.get(peer)
    match = "recv" if e.kind == "send" else "send"
    if not (isinstance(f, Entry) and f.p2p and f.name == e.name and f.kind == match):
        st.elsewhere = [peer] if f is not None else []
        st.never = [peer] if f is None else []
    return st


@dataclass
class Hang:
    """The hang the dumps tell: where everyone waits, the ranks that stopped the job."""

    stuck: list[Stuck]
    #: the places whose holders wait in nothing (or that hang themselves): where the job stopped
    roots: list[Stuck]
    #: the ranks that stopped the job: the roots' holders that wait in nothing or left no dump
    blamed: list[int]
    #: {rank: where it waits}
    waits: dict[int, Stuck]
    #: places that wait on each other in a circle (collectives called in another order)
    circle: list[Stuck]
    #: places held only by ranks with no (readable) dump while ranks with one stopped the job:
    #: those ranks may well wait on the blamed ones; they are not blamed
    unread: list[Stuck] = field(default_factory=list)


def find_hang(gs: Groups, dumps: dict[int, RankDump]) -> Hang:
    dumped = set(dumps)
    fronts = {r: front(d, gs) for r, d in dumps.items()}
    stuck = [s for s in (stuck_at(g, fronts, dumped) for g in gs.groups.values()) if s]
    stuck += [_p2p_stuck(r, f, gs, fronts, dumped) for r, f in sorted(fronts.items())
              if isinstance(f, Entry) and f.p2p]
    waits: dict[int, Stuck] = {}
    for s in stuck:
        for r in s.waiting:
            if r not in s.odd:
                waits.setdefault(r, s)
    blamed: set[int] = set()
    roots: list[Stuck] = []
    free = {id(s): [b for b in s.blockers() if b not in waits or waits[b] is s] for s in stuck}
    # a rank with no dump is blamed only where no rank with one explains the hang
    seen = any(b in dumped for s in stuck for b in free[id(s)])
    unread = []
    for s in stuck:
        mine = [b for b in free[id(s)] if b in dumped or not seen]
        if mine or not s.blockers():
            roots.append(s)
            blamed |= set(mine)
        elif free[id(s)]:
            unread.append(s)
    circle = []
    if not roots and stuck:  # every holder waits elsewhere: a circle
        circle = _circle(stuck, waits)
        blamed = {b for s in circle for b in s.blockers()}
    roots.sort(key=lambda s: (s.p2p, not s.blockers(), -len(s.waiting), s.seq))
    return Hang(stuck=stuck, roots=roots, blamed=sorted(blamed), waits=waits, circle=circle,
                unread=unread)


def _circle(stuck: list[Stuck], waits: dict[int, Stuck]) -> list[Stuck]:
    """The places on a cycle of waits (each waits on a holder that waits in the next)."""
    s = stuck[0]
    path: list[Stuck] = []
    while s not in path:
        path.append(s)
        nxt = [waits[b] for b in s.blockers() if b in waits]
        if not nxt:
            return path
        s = nxt[0]
    return path[path.index(s):]


def behind_by(s: Stuck, rank: int) -> int | None:
    """How many collectives of the group `rank` is behind the furthest member."""
    p = s.group.places.get(rank)
    if p is None or s.p2p:
        return None
    top = max(q.enqueued for q in s.group.places.values())
    return top - p.enqueued


def reaches(h: Hang, s: Stuck) -> Stuck | None:
    """The root a place waits on, through its holders' own waits."""
    seen = set()
    while s is not None and id(s) not in seen:
        if s in h.roots:
            return s
        seen.add(id(s))
        nxt = [h.waits[b] for b in s.blockers() if b in h.waits and h.waits[b] is not s]
        s = nxt[0] if nxt else None
    return None
