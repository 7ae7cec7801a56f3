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

import pandas as pd


def match_collectives(colls: dict[int, list], frame: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Return `frame` with wait_ns filled from matched collectives."""
    frame = frame.copy()
    frame["wait_ns"] = 0
    rows = []
    for rank, items in colls.items():
        seen: dict = {}
        for step, key, dur in items:
            k = (step, key)
            n = seen[k] = seen.get(k, -1) + 1
            rows.append((rank, step, f"{key[0]}/{key[1]}", n, dur))
    if len({r[0] for r in rows}) < 2:
        return frame
    inst = pd.DataFrame(rows, columns=["rank", "step", "key", "n", "dur"])
    ranks_per_step = frame.groupby("step")["rank"].nunique().rename("ranks_with_step")
    g = inst.groupby(["step", "key", "n"])
    inst["seen_on"] = g["rank"].transform("nunique")
    inst["transfer"] = g["dur"].transform("min")
    inst = inst.join(ranks_per_step, on="step")
    full = inst["seen_on"] == inst["ranks_with_step"]
    unmatched = int((~full).sum())
    if unmatched:
        warnings.append(f"{unmatched} collective instance(s) are not present on every rank "
                        "(matched by name and order per step); their waiting is not estimated")
    inst = inst[full]
    inst["wait"] = inst["dur"] - inst["transfer"]
    wait = inst.groupby(["rank", "step"])["wait"].sum()
    idx = pd.MultiIndex.from_frame(frame[["rank", "step"]])
    frame["wait_ns"] = (wait.reindex(idx).fillna(0).to_numpy().astype("int64")
                        .clip(0, frame["comm_exposed_ns"].to_numpy()))
    return frame
