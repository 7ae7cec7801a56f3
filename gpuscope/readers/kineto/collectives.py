"""Matches the same collective across ranks to split its time into waiting and transfer.

1. Instances are keyed by (step, process group, collective, n-th occurrence in the step); the
   traces carry no sequence numbers, so matching is by name and order per group, per step.
2. For an instance seen on every rank that has the step, transfer = the shortest duration
   (the rank that arrived last waits least); each rank's excess is waiting.
3. A rank's wait in a step is the sum over its instances, capped by its exposed communication
   (waiting hidden behind compute costs nothing).
Instances missing on some ranks are left unmatched and counted in a warning, never fatal.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def match_collectives(colls: dict[int, list], frame: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Return `frame` with wait_ns filled from matched collectives."""
    frame = frame.copy()
    frame["wait_ns"] = 0
    if sum(1 for items in colls.values() if items) < 2:
        return frame
    keys: dict = {}
    rank_l, step_l, key_l, n_l, dur_l = [], [], [], [], []
    for rank, items in colls.items():
        seen: dict = {}
        for step, key, dur, *_ in items:
            k = (step, key)
            n = seen[k] = seen.get(k, -1) + 1
            rank_l.append(rank)
            step_l.append(step)
            key_l.append(keys.setdefault(key, len(keys)))
            n_l.append(n)
            dur_l.append(dur)
    step_a = np.array(step_l)
    dur = np.array(dur_l, dtype=np.int64)
    # one id per instance (step, group/collective, occurrence)
    inst = np.unique(np.column_stack([step_a, key_l, n_l]), axis=0, return_inverse=True)[1]
    inst = inst.reshape(-1)
    n_inst = int(inst.max()) + 1
    seen_on = np.bincount(inst, minlength=n_inst)
    transfer = np.full(n_inst, np.iinfo(np.int64).max)
    np.minimum.at(transfer, inst, dur)
    fr_rank = frame["rank"].to_numpy()
    fr_step = frame["step"].to_numpy()
    steps_u, ranks_per_step = np.unique(fr_step, return_counts=True)
    with_step = ranks_per_step[np.clip(np.searchsorted(steps_u, step_a), 0, steps_u.size - 1)]
    full = seen_on[inst] == with_step
    unmatched = int((~full).sum())
    if unmatched:
        warnings.append(f"{unmatched} collective instance(s) are not present on every rank "
                        "(matched by name and order per step); their waiting is not estimated")
    wait = np.where(full, dur - transfer[inst], 0)
    row_of = {(r, s): i for i, (r, s) in enumerate(zip(fr_rank.tolist(), fr_step.tolist()))}
    total = np.zeros(len(frame), dtype=np.int64)
    rows = np.array([row_of.get(k, -1) for k in zip(rank_l, step_l)])
    ok = rows >= 0
    np.add.at(total, rows[ok], wait[ok])
    frame["wait_ns"] = np.minimum(total, frame["comm_exposed_ns"].to_numpy())
    return frame


def sync_points(colls: dict[int, list]) -> tuple[list, list, list]:
    """(rank, instance, end_ns) of every collective instance: the n-th of its name and group in
    the step, as matched above; its end is the moment all its ranks were released."""
    rank_l, inst_l, end_l = [], [], []
    for rank, items in colls.items():
        seen: dict = {}
        for step, key, _dur, end in items:
            k = (step, key)
            n = seen[k] = seen.get(k, -1) + 1
            rank_l.append(rank)
            inst_l.append((step, str(key), n))
            end_l.append(end)
    return rank_l, inst_l, end_l
