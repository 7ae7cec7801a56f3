"""The process groups of a job's Flight Recorder dumps, and each member's place on each: keyed by
the group (its name with its members, as pg_config gives them), never by its description, which
every group of one kind shares (every tensor-parallel group is TENSOR_MODEL_PARALLEL_GROUP).

A rank's place on a group is how far it got in the group's collective order: the last collective
it enqueued, started and completed (pg_status, or its ring's entries where they say more). A
dump's pg_status is keyed by the process's own id of the group (pg_id), which only its entries
tie to a name; a rank whose ring is empty or wrapped is tied through its peers: the id they give
the group its pg_config names (SPMD programs build their groups in one order), or, where no
member list is dumped (gloo), the one group of that description still short of a member.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dumps import Entry, RankDump


@dataclass
class Place:
    """A rank's place on one group."""

    enqueued: int = -1
    started: int = -1
    completed: int = -1
    #: its collectives on the group in its ring, by sequence number
    by_seq: dict[int, Entry] = field(default_factory=dict)
    #: how the rank was tied to the group where its entries do not name it ("" where they do)
    inferred: str = ""

    def waiting(self) -> bool:
        return self.enqueued > self.completed


@dataclass
class Group:
    """One process group: its name, description and members, and each dumped member's place."""

    name: str
    desc: str
    #: the members pg_config lists (None where no dump lists them: gloo)
    declared: tuple[int, ...] | None = None
    #: the ranks seen in it (their entries or pg_status name it)
    seen: set[int] = field(default_factory=set)
    places: dict[int, Place] = field(default_factory=dict)
    #: {rank: pg_id} of the members whose entries tie an id to this group
    uids: dict[int, int] = field(default_factory=dict)
    #: members inferred where no dump lists them (gloo): ranks with no dump that the group is
    #: short of, measured by the other groups of its description
    absent: list[int] = field(default_factory=list)
    #: members still unknown (short, and more ranks without a dump than one group can take),
    #: with the ranks they are among
    unknown: int = 0
    candidates: list[int] = field(default_factory=list)

    @property
    def members(self) -> list[int]:
        return sorted(set(self.declared or ()) | self.seen | set(self.absent))

    def label(self) -> str:
        return label(self.name, self.desc)


def label(name: str, desc: str) -> str:
    """"TENSOR_MODEL_PARALLEL_GROUP 3", "default group": a group by its description and name."""
    if desc == "default_pg" or (not desc and name in ("0", "")):
        return "default group"
    return f"{desc or 'group'} {name}"


@dataclass
class Groups:
    """Every group of the job, with what could not be tied to one."""

    groups: dict[str, Group]
    #: [(rank, pg_id, (enqueued, started, completed), description or "")]: a rank's pg_status
    #: for a group that neither its entries nor its peers name
    unplaced: list[tuple[int, int, tuple[int, int, int], str]]
    world_size: int

    def of_rank(self, rank: int) -> list[Group]:
        return [g for g in self.groups.values() if rank in g.places]


def _key(name: str, ranks) -> str:
    return name if ranks is None else f"{name}@{','.join(map(str, ranks))}"


class _Builder:
    def __init__(self, dumps: dict[int, RankDump]):
        self.dumps = dumps
        self.groups: dict[str, Group] = {}
        self.by_name: dict[str, list[Group]] = {}

    def group(self, name: str, desc: str, rank: int, ranks=None) -> Group:
        """The group `name` that holds `rank` (split groups share a name across rank sets)."""
        found = self.by_name.setdefault(name, [])
        for g in found:
            if ranks is not None and g.declared == ranks:
                return g
            if ranks is None and (g.declared is None or rank in g.declared):
                return g
        g = Group(name=name, desc=desc, declared=ranks)
        found.append(g)
        self.groups[_key(name, ranks)] = g
        return g

    def declare(self) -> None:
        for d in self.dumps.values():
            for name, (desc, ranks) in d.config.items():
                self.group(name, desc, d.rank, ranks)

    def enter(self) -> dict[int, dict[int, Group]]:
        """Every rank's entries into their groups; {rank: {pg_id: group}} as the entries tie
        them."""
        tied: dict[int, dict[int, Group]] = {}
        for d in self.dumps.values():
            mine = tied.setdefault(d.rank, {})
            for e in d.entries:
                if e.p2p:
                    continue
                g = mine.get(e.uid) if e.uid >= 0 else None
                if g is None or g.name != e.name:
                    g = self.group(e.name, e.desc, d.rank)
                    if e.uid >= 0:
                        mine[e.uid] = g
                        g.uids[d.rank] = e.uid
                g.seen.add(d.rank)
                p = g.places.setdefault(d.rank, Place())
                p.by_seq[e.seq] = e
        return tied

    def tie_by_peers(self, rank: int, uid: int, tied) -> tuple[Group | None, str]:
        """The group a rank's pg_status id stands for, from its peers: the group of its pg_config
        that its members know by that id; else (no member lists) the one group of the id's
        description among peers that is still short of a member."""
        d = self.dumps[rank]
        named = [g for g in self.groups.values() if rank in (g.declared or ()) and
                 g.uids and set(g.uids.values()) == {uid}]
        if len(named) == 1:
            return named[0], f"its peers' id {uid} for it"
        if d.config:
            return None, ""
        # gloo: no member lists; the groups whose known members all use this id
        same = [g for g in self.groups.values() if g.uids and set(g.uids.values()) == {uid}
                and rank not in g.seen]
        descs = {g.desc for g in same}
        if len(descs) != 1:
            return None, ""
        size = max(len(g.members) for g in self.groups.values() if g.desc in descs)
        short = [g for g in same if len(g.members) < size]
        if len(short) == 1:
            return short[0], (f"the one {short[0].desc or 'group'} short of a member among "
                              f"those its peers call {uid}")
        return None, ""

    def place(self, tied) -> list:
        unplaced = []
        for d in self.dumps.values():
            mine = tied.get(d.rank, {})
            if d.unnamed and len(d.status) == 1 and len(mine) == 1:  # gloo, one group
                g = next(iter(mine.values()))
                if g.declared is None:
                    g.declared = d.unnamed
            for uid, (enq, started, done) in sorted(d.status.items()):
                g, how = mine.get(uid), ""
                if g is None:
                    g, how = self.tie_by_peers(d.rank, uid, tied)
                if g is None:
                    descs = {g2.desc for g2 in self.groups.values() if g2.uids and
                             set(g2.uids.values()) == {uid}}
                    unplaced.append((d.rank, uid, (enq, started, done),
                                     descs.pop() if len(descs) == 1 else ""))
                    continue
                g.seen.add(d.rank)
                p = g.places.setdefault(d.rank, Place(inferred=how))
                p.enqueued, p.started, p.completed = max(p.enqueued, enq), started, \
                    max(p.completed, done)
        for g in self.groups.values():  # where pg_status said nothing: the entries
            for p in g.places.values():
                if p.by_seq:
                    p.enqueued = max(p.enqueued, max(p.by_seq))
                    done = [s for s, e in p.by_seq.items() if e.done]
                    if done:
                        p.completed = max(p.completed, max(done))
        return unplaced


def _short_of(groups: dict[str, Group], missing: set[int]) -> None:
    """Where no dump lists a group's members (gloo): the groups of a description with fewer
    members than the others of it hold ranks whose dump is missing; where one group is short,
    they are those ranks, else they are among them."""
    if not missing:
        return
    by_desc: dict[str, list[Group]] = {}
    for g in groups.values():
        if g.declared is None and g.desc not in ("default_pg", ""):
            by_desc.setdefault(g.desc, []).append(g)
    for gl in by_desc.values():
        size = max(len(g.members) for g in gl)
        short = [g for g in gl if len(g.members) < size]
        if len(short) == 1 and size - len(short[0].members) == len(missing):
            short[0].absent = sorted(missing)
            continue
        for g in short:
            g.unknown, g.candidates = size - len(g.members), sorted(missing)


def build(dumps: dict[int, RankDump], world_size: int | None = None) -> Groups:
    """The groups of the job and each dumped member's place on them."""
    b = _Builder(dumps)
    b.declare()
    tied = b.enter()
    unplaced = b.place(tied)
    world = world_size or 0
    for g in b.groups.values():
        if g.members:
            world = max(world, max(g.members) + 1)
    world = max([world] + [r + 1 for r in dumps])
    _short_of(b.groups, set(range(world)) - set(dumps))
    return Groups(groups=b.groups, unplaced=unplaced, world_size=world)
