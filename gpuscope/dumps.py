"""What a Flight Recorder dump holds, read: one rank's groups, their status and the recent
collectives of its ring. readers/flight_recorder.py makes them; analyze/fr_groups.py and
analyze/hang.py read them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Entry:
    """One collective (or send / recv) in a rank's ring."""

    uid: int            # the dumping process's id of the group (pg_id)
    name: str           # the group's name (pg_config's key), the same on every member
    desc: str           # the group's description ("TENSOR_MODEL_PARALLEL_GROUP", "default_pg")
    seq: int            # collective_seq_id; p2p_seq_id for send / recv
    p2p: bool
    kind: str           # all_reduce, _allgather_base, send, ...
    peer: int | None    # a send's or recv's partner, its rank in the group (NCCL names it)
    sizes: str          # the input shapes, as text ("[[4096, 1024]]")
    done: bool          # completed (state) or retired
    started: bool
    created_ns: int
    at: str | None      # the innermost frame of the user's code: file:line (function)


@dataclass
class RankDump:
    """One rank's dump, read."""

    rank: int
    path: str
    version: str
    #: {group name: (description, member ranks)} from pg_config (gloo's unnamed record left out)
    config: dict[str, tuple[str, tuple[int, ...]]]
    #: {pg_id: (last enqueued, last started, last completed)} from pg_status; -1 for none
    status: dict[int, tuple[int, int, int]]
    entries: list[Entry]
    #: where the rank came from: "the dump" (its groups' members), "its file name", "gpuscope"
    rank_from: str
    #: gloo's unnamed pg_config record's ranks (its only group's where it has one)
    unnamed: tuple[int, ...] | None = None
    #: when the recorder took it: "stall", or "sigterm" / "error" (as the job ended: a peer that
    #: exited first may have failed collectives that then read as completed); None for torch's
    taken: str | None = None
    notes: list[str] = field(default_factory=list)
