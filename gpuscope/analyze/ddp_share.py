"""What DDP's own logging says backward hid: the part of backward during which its gradient
communication was in flight, from the iterations DDP sampled (its end record's `ddp_logging`),
for a run whose DDP was timed by its backward's tail (record/ddp_timing.py). The reader keeps
the logging as recorded; the analysis turns it into the knobs the estimates read."""

from __future__ import annotations

def ddp_sampled(iteration: int) -> int:
    """How many iterations DDP's logging has sampled up to `iteration`: 1-10, then every 100th
    (its default rate)."""
    return min(iteration, 10) + (iteration // 100 if iteration >= 100 else 0)


def hidden_share(logging: dict) -> float | None:
    """The part of backward during which DDP's gradient communication was in flight, from DDP's
    own sampled iterations: from the first bucket's launch to the end of backward compute, over
    backward compute. A ratio of two times of the same iterations, so the slow first iterations
    a short run's averages lean on weigh on both alike. The iterations sampled before DDP knew
    the order gradients come in ("first_sample": its first one, whose buckets launch only at
    the end: 0.09 ms of overlap in a 15.7 ms backward, then 9-14 ms in 11-19 ms) are set apart
    where later ones were sampled. None where either is missing."""
    keys = ("avg_backward_compute_comm_overlap_time", "avg_backward_compute_time")
    overlap, compute = (logging.get(k) for k in keys)
    first, last = logging.get("first_sample"), logging.get("iteration")
    if isinstance(first, dict) and all(isinstance(first.get(k), int) for k in keys) and \
            isinstance(first.get("iteration"), int) and isinstance(last, int) and \
            isinstance(overlap, int) and isinstance(compute, int):
        n, k = ddp_sampled(last), ddp_sampled(first["iteration"])
        if n > k > 0:  # the mean of the later samples alone
            overlap = (n * overlap - k * first[keys[0]]) // (n - k)
            compute = (n * compute - k * first[keys[1]]) // (n - k)
    if not (isinstance(overlap, int) and isinstance(compute, int) and 0 < overlap
            and 0 < compute < 1 << 50):
        return None
    return round(min(overlap / compute, 1.0), 4)



def ddp_knobs(ranks: dict) -> dict:
    """The knobs DDP's logging gives a run timed by backward's tail (RankInfo by rank):
    "hidden_comm_ns", the lowest rank's mean overlap (ns), and "hidden_comm_share", the ranks'
    mean of hidden_share where every rank has one, else the lowest rank's; {} where none says."""
    def said(info) -> tuple[int | None, float | None]:
        end = info.meta.get("end")
        if "ddp_tail" not in str(info.meta.get("comm_timing") or "").split("+") or \
                not isinstance(end, dict) or not isinstance(end.get("ddp_logging"), dict):
            return None, None
        overlap = end["ddp_logging"].get("avg_backward_compute_comm_overlap_time")
        if not (isinstance(overlap, int) and 0 < overlap < 1 << 50):
            return None, None
        return overlap, hidden_share(end["ddp_logging"])

    if not ranks:
        return {}
    each = {r: said(info) for r, info in ranks.items()}
    overlap, share = each[min(ranks)]
    out: dict = {}
    if overlap is not None:
        out["hidden_comm_ns"] = overlap
    shares = [s for _, s in each.values()]
    if all(isinstance(s, float) for s in shares):
        out["hidden_comm_share"] = sum(shares) / len(shares)
    elif share is not None:
        out["hidden_comm_share"] = share
    return out
