"""Clock offsets between hosts, from the moments ranks leave a collective together.

Ranks on one host read one clock; ranks on different hosts read clocks that differ by whatever
NTP left (records: unix time) or by much more (torch.profiler traces on some versions count from
the host's boot). A synchronous collective releases all its ranks at the same instant (within its
last transfer), so the end of one collective instance is a sync point seen on every rank:

1. the reference is the host of the lowest rank; per instance, its end there is the median over
   that host's ranks;
2. a host's offset is minus the median, over its ranks and all instances seen on the reference
   host too, of (end on the rank - end on the reference): one offset per host, so the ranks of a
   host stay exactly as their shared clock put them;
3. ranks on the reference host, and every rank when all share one host (or none is known), get 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def host_offsets(rank, instance, end_ns, hosts: dict[int, str]) -> dict[int, int]:
    """{rank: ns to add to its times} for ranks whose host differs from the lowest rank's.

    `rank`, `instance` (any hashable id of one collective instance, equal across ranks) and
    `end_ns` are parallel sequences: one sync point each."""
    known = {r: h for r, h in hosts.items() if h}
    if len(set(known.values())) < 2 or not len(rank):
        return {}
    df = pd.DataFrame({"rank": np.asarray(rank), "inst": pd.Series(list(instance)).factorize()[0],
                       "end": np.asarray(end_ns, dtype=np.int64)})
    df["host"] = df["rank"].map(known).fillna("")
    ref_host = known.get(min(hosts), "") or known[min(known)]
    ref = df[df["host"] == ref_host].groupby("inst")["end"].median()
    out: dict[int, int] = {}
    for host, g in df[(df["host"] != ref_host) & (df["host"] != "")].groupby("host"):
        diff = (g["end"] - g["inst"].map(ref)).dropna()
        if diff.empty:
            continue  # no instance in common with the reference: left as it is
        shift = -int(round(float(diff.median())))
        for r in sorted({r for r, h in known.items() if h == host}):
            out[r] = shift
    return out
