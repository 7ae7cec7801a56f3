"""The run's parallel layout: its process groups and pipeline chains, and the split of a stage's
waiting into pipeline bubble and imbalance.

- Process groups: those the recorder saw collectives go through (knob `process_groups`, with
  their global ranks), or for profiler traces those in each rank's distributedInfo (pg_config).
  The group of all ranks says nothing about the layout and is left out.
- Pipeline chains: ranks that send to and receive from each other point to point. The recorder
  names each point-to-point call's peer ("send_next:3"), which links and orders the stages;
  traces carry no peers, so there the ranks with point-to-point communication are stages in no
  known order.

Ranks wait for each other only inside a group: a data-parallel group's ranks in its
collectives, a pipeline's neighbours in send/recv. A stage that waits on its neighbour longer
than the same stage of the other replicas (its data-parallel peers) waits on a slow rank in its
own pipeline, not on the schedule: that excess is imbalance (`split_bubble`), and only what all
replicas share is the pipeline's bubble.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..run_format import comm_kind, is_p2p
from ..runtable import RunTable, key_parts, mask_of


@dataclass
class Layout:
    ranks: list[int]
    groups: dict[str, list[int]] = field(default_factory=dict)  # name -> global ranks
    chains: list[list[int]] = field(default_factory=list)       # stage ranks, stage order
    stage_ranks: list[int] = field(default_factory=list)        # ranks with point-to-point

    @property
    def pipelined(self) -> bool:
        return bool(self.stage_ranks)

    def stage_of(self, rank: int) -> tuple[int, int] | None:
        """(pipeline index, stage index) of a rank in a known chain."""
        for c, chain in enumerate(self.chains):
            if rank in chain:
                return c, chain.index(rank)
        return None

    def peer_group(self, rank: int) -> tuple[str, list[int]] | None:
        """The group whose other ranks do the same work as `rank` (its data-parallel group):
        the smallest group holding it and others that is not one of the pipeline chains; None
        when there is none, or two candidates of that size."""
        chains = {tuple(sorted(c)) for c in self.chains}
        cands = [(name, ranks) for name, ranks in self.groups.items()
                 if rank in ranks and len(ranks) > 1 and tuple(sorted(ranks)) not in chains]
        if not cands:
            return None
        size = min(len(r) for _, r in cands)
        best = [c for c in cands if len(c[1]) == size]
        return best[0] if len(best) == 1 else None

    def to_dict(self) -> dict:
        d: dict = {"groups": [{"name": n, "ranks": list(r)} for n, r in self.groups.items()]}
        if self.chains:
            d["pipelines"] = [list(c) for c in self.chains]
        if self.stage_ranks:
            d["stage_ranks"] = list(self.stage_ranks)
        return d

    @classmethod
    def from_dict(cls, d: dict, ranks: list[int]) -> "Layout":
        return cls(list(ranks), {g["name"]: list(g["ranks"]) for g in d.get("groups", [])},
                   [list(c) for c in d.get("pipelines", [])], list(d.get("stage_ranks", [])))


def _groups(table: RunTable) -> dict[str, list[int]]:
    everyone = set(range(table.world_size)) | set(table.ranks)
    out: dict[str, list[int]] = {}
    seen: set[tuple] = set()  # (name, the list): every rank lists the same groups, one object
    for info in table.ranks.values():  # each (readers/kineto/rank.py shared_ranks)
        groups = info.knobs.get("process_groups")
        if not isinstance(groups, dict):
            continue
        for name, ranks in groups.items():
            if (name, id(ranks)) in seen:  # the same list under the same name: the same answer
                continue
            seen.add((name, id(ranks)))
            try:
                ranks = sorted({int(r) for r in ranks})
            except (TypeError, ValueError):
                continue
            if ranks and set(ranks) != everyone:
                out.setdefault(str(name), ranks)
    return dict(sorted(out.items(), key=lambda kv: (kv[1], kv[0])))


def _chains(comm: pd.DataFrame | None) -> tuple[list[list[int]], list[int]]:
    if comm is None or comm.empty:
        return [], []
    nxt: dict[int, int] = {}
    stages: set[int] = set()
    p2p = mask_of(key_parts(comm)[0], is_p2p)  # per category: the rows of millions tested once
    if not p2p.any():
        return [], []
    for rank, key in comm.loc[p2p, ["rank", "key"]].drop_duplicates().itertuples(index=False):
        kind = comm_kind(key)
        stages.add(int(rank))
        try:
            peer = int(key.split(":", 1)[1])
        except (IndexError, ValueError):
            continue
        stages.add(peer)
        if kind.endswith("_next"):
            nxt.setdefault(int(rank), peer)
        elif kind.endswith("_prev"):
            nxt.setdefault(peer, int(rank))
    has_prev = set(nxt.values())
    chains, seen = [], set()
    for start in sorted(r for r in nxt if r not in has_prev):
        chain, r = [], start
        while r is not None and r not in seen:
            chain.append(r)
            seen.add(r)
            r = nxt.get(r)
        chains.append(chain)
    return chains, sorted(stages)


def find_layout(table: RunTable) -> Layout:
    chains, stages = _chains(table.comm)
    if not stages:  # traces: the ranks that had point-to-point communication
        stages = sorted(r for r, info in table.ranks.items() if info.knobs.get("p2p"))
    return Layout(sorted(table.ranks), _groups(table), chains, stages)


def split_bubble(frame: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """Per step, a stage's bubble beyond the least among its data-parallel peers (the same
    stage of the other replicas) moves to wait_ns: a slow rank in its own pipeline made it wait."""
    if not layout.pipelined or "bubble_ns" not in frame or not layout.groups:
        return frame
    peers = {r: g[1] for r in layout.stage_ranks if (g := layout.peer_group(r)) is not None}
    if not peers:
        return frame
    frame = frame.copy()
    gid = {g: i for i, g in enumerate(sorted({tuple(g) for g in peers.values()}))}
    rank_gid = {r: gid[tuple(g)] for r, g in peers.items()}
    ids = frame["rank"].map(rank_gid).fillna(-1).astype(np.int64)
    key = [frame["step"], ids]
    base = frame.groupby(key)["bubble_ns"].transform("min").to_numpy(np.int64)
    size = frame.groupby(key)["rank"].transform("size").to_numpy()
    want = ids.map({i: len(g) for g, i in gid.items()}).fillna(0).to_numpy()
    ok = (ids.to_numpy() >= 0) & (size == want)
    bubble = frame["bubble_ns"].to_numpy(np.int64)
    excess = np.where(ok, bubble - base, 0)
    frame["bubble_ns"] = bubble - excess
    frame["wait_ns"] = frame["wait_ns"].to_numpy(np.int64) + excess
    return frame
