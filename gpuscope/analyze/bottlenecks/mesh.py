"""Mesh dimensions: which dimension of a 2D / 3D layout holds the step back, and what to change
for it (analyze/comm_groups.py measures each group).

Evidence: per mesh dimension, the mean exposed communication per step over its groups (the
transfer and the waiting inside that dimension's collectives) against the typical step. The
dimension with the most is named when it holds COMM_SHARE of the step or more. Suggestions, by
dimension:

- `tp` (tensor / sequence parallel: all-reduces, all-gathers and reduce-scatters inside forward
  and backward, on the critical path): keep the TP group within one node / NVLink domain, a
  smaller TP degree (more data parallel instead), sequence parallel (its reduce-scatter /
  all-gather pair moves the same bytes as an all-reduce but keeps activations sharded), async
  TP (overlaps the collective with the matmul).
- `dp` / `fsdp` / `hsdp` (gradient sync, parameter gathers): FSDP's reshard_after_forward=False
  (saves the backward all-gathers), prefetching, or gradient accumulation; the comm module's
  suggestions estimate those.
- `ep` (expert all-to-all): balance tokens over experts (a capacity factor, an auxiliary
  balancing loss), overlap with dense compute; the busiest rank is the straggler of its group
  (analyze/routing.py counts its tokens).
- `cp` (context parallel ring): overlap of the ring's send / recv with attention, balanced
  shards, a smaller degree.

Estimate: what faster or overlapped communication can recover is the dimension's transfer, not
its waiting for the group's slowest member (that is the straggler's or jitter's): half of the
transfer as the point, all of it to none as the range; no suggestion when the transfer is under
5% of the step.
"""

from __future__ import annotations

from ...results import Suggestion
from ...vocab import COMM, MS
from ..findings import gain

COMM_SHARE = 0.15  # the comm-bound threshold's default share

TP_WORDS = ("tp", "tensor", "sp", "seq", "sequence")
DP_WORDS = ("dp", "fsdp", "hsdp", "dp_shard", "dp_replicate", "data")


def by_dimension(groups: list) -> dict[str, dict]:
    """{dimension: {exposed_ms, comm_ms, [wait_ms, transfer_ms,] kinds}}: the mean over its
    groups (each rank is in one group of each dimension); wait and transfer where every group
    of the dimension has them split."""
    fields = ("exposed_ms", "comm_ms", "wait_ms", "transfer_ms")
    out: dict[str, dict] = {}
    for g in groups:  # sections.CommGroup
        if not g.dim:
            continue
        d = out.setdefault(g.dim, {"kinds": set(), **{f: [] for f in fields}})
        for f in fields:
            if getattr(g, f) is not None:
                d[f].append(getattr(g, f))
        d["kinds"] |= set(g.kinds)
        d["n"] = d.get("n", 0) + 1
    return {k: {**{f: sum(v[f]) / len(v[f]) for f in fields if v[f] and len(v[f]) == v["n"]},
                "kinds": sorted(v["kinds"])} for k, v in out.items()}


def heaviest(groups: list, step_ms: float, share: float = COMM_SHARE):
    """(dimension, its numbers) with the most exposed communication when that is at least
    `share` of the step; None otherwise."""
    dims = by_dimension(groups)
    if not dims or step_ms <= 0:
        return None
    name, d = max(dims.items(), key=lambda kv: kv[1]["exposed_ms"])
    return (name, d) if d["exposed_ms"] >= share * step_ms else None


#: dimension name prefixes -> (knob, proposed, what to change): the data-parallel ones are the
#: comm module's (reshard_after_forward, prefetch, accumulation, batch size)
FIXES = (
    (TP_WORDS, "tensor_parallel",
     "TP within one node / NVLink domain, a smaller TP degree, sequence parallel or async TP",
     "inside forward and backward, on the critical path): keep its groups on the fastest links "
     "(one node, one NVLink domain), use a smaller TP degree with more data parallel instead, "
     "sequence parallel (keeps activations sharded, same bytes as the all-reduce), or async TP "
     "to overlap it with the matmuls"),
    (("cp", "context"), "context_parallel",
     "overlap the ring's send / recv with attention, or a smaller CP degree",
     "the ring attention's exchanges of keys and values): overlap each send / recv with the "
     "attention block it feeds, balance the sequence shards (causal masks make the late "
     "shards heavier), or use a smaller context-parallel degree for shorter sequences"),
    (("ep", "expert", "moe"), "expert_parallel",
     "balance tokens over experts, or overlap the all-to-all with dense compute",
     "the dispatch and combine all-to-alls): a capacity factor or an auxiliary balancing loss "
     "evens the tokens per expert, expert placement keeps hot experts apart, and overlapping "
     "the all-to-all with the shared expert or attention hides it"),
)


def suggest_mesh(groups: list, step_ns: float, share: float = COMM_SHARE) -> list:
    """A suggestion for the dimension that holds the step back, where it is tensor / sequence,
    context or expert parallel (the data-parallel ones are the comm module's), else []. What it
    can recover is the dimension's transfer: its waiting for the group's slowest member is not
    the links' (the straggler and jitter findings hold that)."""
    step_ms = step_ns / MS
    top = heaviest(groups, step_ms, share)
    if top is None:
        return []
    name, d = top
    fix = next((f for f in FIXES if name.lower().startswith(f[0])), None)
    if fix is None:
        return []
    _, knob, proposed, what = fix
    exposed = d["exposed_ms"]
    wait = min(d.get("wait_ms", 0.0), exposed)
    transfer = exposed - wait
    if transfer < 0.05 * step_ms:  # nearly all of it is waiting for a slow member
        return []
    point, best = step_ms - transfer / 2, step_ms - transfer
    waited = (f" ({wait:.1f} ms of it waiting for the group's slowest member, which faster "
              "links do not recover)" if wait > 0.05 * exposed else "")
    return [Suggestion(
        knob, f"mesh dimension {name!r}: {exposed:.1f} ms exposed per step", proposed, point,
        f"{exposed:.1f} ms of each {step_ms:.1f} ms step is exposed communication of the "
        f"{name!r} dimension{waited} ({', '.join(d['kinds'])} {what}; assumes: half of its "
        f"{transfer:.1f} ms of transfer recovered (range: all of it to none)",
        COMM, gain(step_ms, point), (best, step_ms))]
