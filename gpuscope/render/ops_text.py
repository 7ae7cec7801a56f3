"""The ops section (analyze/ops.py) in words: the lines the terminal prints and the HTML and
TensorBoard views title their tables with. One wording for every renderer."""

from __future__ import annotations

from ..op_names import excess_words, short

#: names shown per line
SHOWN = 4


def size(n: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n:.0f} B"


def _top(rows: list, n_ranks: int) -> str:
    return ", ".join(
        f"{short(r['name'])} {r['per_step_ms']:,.2f}"
        + (f" ({r['ranks']} of {n_ranks} ranks)" if r.get("ranks", n_ranks) < n_ranks else "")
        for r in rows[:SHOWN])


def excess_line(ops: list) -> str:
    return excess_words(ops)


def collective_line(c: dict) -> str:
    bw = (f", bus {c['busbw_gbps']:,.1f} GB/s" if c.get("busbw_gbps") is not None
          else f" ({c['note']})" if c.get("note") else "")
    link = (f" ({c['of_link_pct']:.1f}% of {c['link']}, {c['link_peak_gbps']:.0f} GB/s)"
            if c.get("link_peak_gbps") else "")
    lower = "; a lower bound: one rank's trace" if c.get("ranks_seen", 2) < 2 and bw else ""
    return (f"{c['collective']} {size(c['bytes'])} {c['dtype']} over {c['group_size']} ranks "
            f"(group {c['group']}), {c['instances']} calls: {c['time_us']:,.0f} us each{bw}"
            f"{link}{lower}")


def lines(ops) -> list[str]:
    """What the terminal says of the ops section (sections.Ops, or None): top ops and kernels
    per step across ranks, the slowest step's ops, the collectives with their size and
    bandwidth."""
    if ops is None:
        return []
    run, out = ops.run, []
    n = len(ops.ranks) or 1
    if run.get("ops"):
        out.append(f"Top ops, ms per step (mean over {n} rank{'s' if n > 1 else ''}; an op's "
                   "kernels on a GPU): " + _top(run["ops"], n))
    if run.get("kernels"):
        out.append("Top kernels, ms per step: " + _top(run["kernels"], n))
    if run.get("modules"):
        out.append(f"Modules, forward ms per step (mean over {n} rank{'s' if n > 1 else ''}): "
                   + _top(run["modules"], n))
    slow = ops.slow_step
    if slow and slow.get("ops"):
        out.append(f"Slowest step: {slow['step']} on rank {slow['rank']}, {slow['step_ms']:,.1f} "
                   f"ms against its median {slow['median_ms']:,.1f} ms: " + ", ".join(
                       f"{short(o['name'])} +{o['excess_ms']:,.1f} ms"
                       + (" (only in this step)" if o.get("only_here") else "")
                       for o in slow["ops"][:3]))
    coll = ops.collectives or []
    if coll:
        out.append("Collectives by message: " + "; ".join(collective_line(c) for c in coll[:3]))
    return out
