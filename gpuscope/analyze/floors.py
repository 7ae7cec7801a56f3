"""Estimates bounded by everything the report knows: a suggestion's estimate is never below what
another finding of the same report holds the step at, unless its change moves that finding too.

- A straggler: until it is fixed, every synchronous step waits for its own work. A change that
  does not fix it can remove from that rank only what it removes from every rank (syncing less:
  the exposed communication that synchronized gradients, not the loop's own collectives, which
  stay in every micro-step (a loop's all_reduce of its loss: the floor took it off too and held
  an estimate at 129.3 ms that re-ran at 157-162), the optimizer steps skipped, the untimed work between optimizer
  steps (logging: once per cycle), and what the communication hidden
  behind its backward cost it, as the estimate models it (whatif.hidden_comm: on a CPU the
  cores gloo's thread takes; a rank that computes longer only because of that is no floor to
  syncing less, as a re-run showed: a rank 3.9 ms busier in backward held the comm demo's
  estimate at 17.2 ms and the re-run took 12.7; nanoGPT's rank 0, 18 ms busier in a backward
  17 ms of communication ran behind, held it at 50.2 ms and the re-run took 31.5: the floor's
  range reaches down to the most that communication may cost, and the backward a rank computes
  beyond what its forward predicts comes off it up to that most, `sync_surplus`); a data change:
  the data wait; a communication change: the exposed communication), so the step keeps at least
  the straggler's busy time (step less its own waiting) less those parts. A larger batch moves
  the floor with the rest of the step (its estimate scales the work with the batch), said so.
  A probable straggler (late in most steps, too few of them to confirm it) leaves the point to
  the model (its lateness may be chance; holding the point to it flipped the estimate by 65%
  between the record and the traces of one run, one calling a rank probable, the other naming
  none) and makes the range reach its floor: "up to X ms if rank R ... is one".
- Loading that workers deliver too slowly (data-bound with num_workers > 0): the step is as long
  as the workers take for a batch, whatever else gets faster; a change elsewhere gains nothing
  until loading is fixed.

The verdict's fix comes first; each other suggestion is estimated with that constraint in place
(stacked), and a held estimate says which finding holds it and at what.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..vocab import COMM, DATA, IMBALANCED, JITTER_BOUND, MS
from .findings import TypicalStep
from .rowgroups import Groups

#: what a suggestion's change takes off a rank's step, by its knob or the label it addresses
REMOVES = {"sync_frequency": ("comm_exposed_ns", "optimizer_ns", "other_ns"), DATA: ("data_ns",),
           COMM: ("comm_exposed_ns",)}
#: changes that move a straggler's floor themselves: said, not held
MOVES_FLOOR = {"batch_size": "a larger batch spreads the straggler's per-step work over more "
                             "samples only as far as that work grows with the batch like the "
                             "rest (assumed)"}


def rank_means(frame: pd.DataFrame, rank: int) -> dict[str, float]:
    """A rank's mean parts (ns) over `frame`, and its backward beyond what its forward predicts
    (sync_surplus_ns); {} without rows."""
    rows = frame[frame["rank"].to_numpy() == rank]
    cols = ("step_ns", "wait_ns", "bubble_ns", "data_ns", "comm_exposed_ns", "optimizer_ns",
            "comm_ns", "backward_ns", "other_ns", "forward_ns")
    out = {c: float(rows[c].mean()) for c in cols if c in rows and len(rows)}
    if out:
        out["sync_surplus_ns"] = sync_surplus(frame, rank, out)
    return out


def hidden_cost(parts: dict, knobs: dict, most: bool = False) -> float:
    """ns the communication hidden behind a rank's backward costs it, as the sync estimate
    models it (whatif.hidden_comm's point at HIDDEN_COST's; `most`: its most, at the top of
    both ranges)."""
    from types import SimpleNamespace

    from .whatif import HIDDEN_COST, device_kind, hidden_comm

    rank = SimpleNamespace(hidden=max(parts.get("comm_ns", 0.0) - parts.get("comm_exposed_ns",
                                                                            0.0), 0.0),
                           backward=parts.get("backward_ns", 0.0))
    point, _, hi = HIDDEN_COST[device_kind(knobs)]
    h = hidden_comm(rank, knobs)
    return hi * h[2] if most else point * h[0]


def floor_ms(parts: dict, sug, knobs: dict | None = None, most: bool = False) -> float:
    """The step (ms) a finding's `parts` hold suggestion `sug` at: that rank's busy time (step
    less its waiting) less what the suggestion's change takes off it (REMOVES; syncing less,
    also what its hidden communication cost it; `most`: the most the estimate's range lets it
    cost, the floor's own low end)."""
    removes = REMOVES.get(sug.knob) or REMOVES.get(sug.addresses) or ()
    # syncing less takes off the gradients' synchronization, not the loop's own collectives
    share = parts.get("grad_share") if sug.knob == "sync_frequency" else None
    floor = parts.get("step_ns", 0.0) - parts.get("wait_ns", 0.0) - \
        parts.get("bubble_ns", 0.0) - sum(
            parts.get(c, 0.0) * (share if c == "comm_exposed_ns" and share is not None else 1.0)
            for c in removes)
    if sug.knob == "sync_frequency":
        k = knobs or {}
        most_cost = hidden_cost(parts, k, True)
        floor -= most_cost if most else min(hidden_cost(parts, k)
                                            + parts.get("sync_surplus_ns", 0.0), most_cost)
    return max(floor, 0.0) / MS


def sync_surplus(frame: pd.DataFrame, rank: int, parts: dict) -> float:
    """ns of a rank's backward beyond what its forward predicts (its peers' median backward
    scaled by its forward over theirs): a slower device or a heavier input lengthens both alike;
    what is left sits where DDP's synchronization runs (its bucket copies, gloo's thread on the
    cores), and syncing less may take it away, up to what its hidden communication may cost
    (floor_ms). nanoGPT's rank 0 computed 18% longer in forward and 86% in backward, behind 17 ms
    of communication; the re-run synchronizing every 32 micro-steps had no straggler. 0 where
    forward or backward is not measured."""
    if "forward_ns" not in frame or "backward_ns" not in frame:
        return 0.0
    groups = Groups(frame["rank"].to_numpy())  # each rank's means, no copy of the peers' rows
    peers = groups.keys != rank
    if not peers.any():
        return 0.0
    fwd, bwd = (_median_of_means(groups, frame[c].to_numpy(), peers)
                for c in ("forward_ns", "backward_ns"))
    mine_f, mine_b = parts.get("forward_ns", 0.0), parts.get("backward_ns", 0.0)
    if fwd <= 0 or bwd <= 0 or mine_f <= 0:
        return 0.0
    return max(mine_b - bwd * mine_f / fwd, 0.0)


def _median_of_means(groups: Groups, values: np.ndarray, keep: np.ndarray) -> float:
    """The median over the kept groups of their means, NaN values left out (as pandas' mean and
    median do); NaN where none is left."""
    if values.dtype.kind == "f":
        ok = ~np.isnan(values)
        if not ok.all():
            n = groups.sum(ok.astype(np.int64))
            with np.errstate(invalid="ignore", divide="ignore"):
                means = groups.sum(np.where(ok, values, 0.0)) / n
            means = means[keep]
            means = means[~np.isnan(means)]
            return float(np.median(means)) if means.size else float("nan")
    return float(np.median(groups.mean(values)[keep]))


def floors(frame: pd.DataFrame, stragglers: list, typical: TypicalStep, knobs: dict,
           labels: set, grad_shares: dict | None = None
           ) -> list[tuple[str, str, dict, bool, int | None]]:
    """(what, the label whose fix removes it, the parts it holds the step at, whether it is only
    probable, the straggler's rank or None) per finding. `grad_shares`: {rank: the share of its
    exposed communication that synchronized gradients} (rank_summary.grad_sync_share)."""
    out = []
    for s in stragglers:
        m = rank_means(frame, s.rank)
        share = (grad_shares or {}).get(s.rank)
        if m and share is not None:
            m["grad_share"] = share
        if m:
            out.append((f"rank {s.rank}, probably a straggler" if s.probable else
                        f"rank {s.rank}, the straggler", IMBALANCED, m, bool(s.probable),
                        s.rank))
    workers = knobs.get("num_workers")
    if DATA in labels and isinstance(workers, int) and workers > 0 and typical.data > 0:
        out.append((f"loading ({workers} workers deliver a batch every ~{typical.step / MS:.1f} "
                    "ms)", DATA, {"step_ns": typical.step}, False, None))
    return out


def fixes(sug, fixed_by: str, rank: int | None) -> bool:
    """Whether the suggestion's change removes this finding: its label's fix does, except that
    fixing one straggler leaves another (a rank that computes longer every step, another that
    waits for its data every other step: each keeps the step at its own pace until fixed)."""
    if fixed_by == IMBALANCED and rank is not None and sug.rank is not None:
        return sug.rank == rank
    return sug.addresses == fixed_by or (fixed_by == IMBALANCED and sug.addresses == JITTER_BOUND)


def hold_to_findings(suggestions: list, frame: pd.DataFrame, stragglers: list,
                     typical: TypicalStep, knobs: dict, labels: set,
                     grad_shares: dict | None = None) -> tuple[list, list[str], set[str]]:
    """The suggestions, each estimate held at the floors of the findings it does not fix; the
    notes of those held (said on each suggestion too); the knobs of those held."""
    found = floors(frame, stragglers, typical, knobs, labels, grad_shares)
    if not found:
        return suggestions, [], set()
    out, notes, held = [], [], set()
    for sug in suggestions:
        for what, fixed_by, parts, probable, rank in found:
            if fixes(sug, fixed_by, rank):
                continue
            if sug.knob in MOVES_FLOOR and fixed_by == IMBALANCED:
                sug = replace(sug, why=f"{sug.why}; with {what} still late: "
                                       f"{MOVES_FLOOR[sug.knob]}")
                continue
            floor = floor_ms(parts, sug, knobs)
            if sug.estimated_step_ms >= floor:
                continue
            rng = sug.estimated_step_ms_range
            if probable:  # it may be chance: the point stays, the range reaches its floor
                lo, hi = rng if rng is not None else (sug.estimated_step_ms,) * 2
                note = (f"up to {floor:.1f} ms if {what.replace(', probably a straggler', '')}, "
                        "probably a straggler, is one: it keeps the step there until it is fixed")
                notes.append(f"suggestion {sug.knob}: {note}")
                sug = replace(sug, estimated_step_ms_range=(lo, max(hi, floor)),
                              why=f"{sug.why}; {note}")
                continue
            if rng is not None:
                rng = (max(rng[0], floor_ms(parts, sug, knobs, most=True)), max(rng[1], floor))
            gain = (typical.step / MS / max(floor, 1e-9) - 1) * 100
            note = (f"held at {floor:.1f} ms (the model gave {sug.estimated_step_ms:.1f}): "
                    f"{what} keeps the step there until it is fixed (estimated with it in place: "
                    "fix it first)")
            notes.append(f"suggestion {sug.knob}: {note}")
            held.add(sug.knob)
            sug = replace(sug, estimated_step_ms=floor, estimated_step_ms_range=rng,
                          gain_pct=min(sug.gain_pct, gain), why=f"{sug.why}; {note}")
        out.append(sug)
    return out, notes, held
