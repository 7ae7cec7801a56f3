"""The ops section (analyze/ops.py) on the HTML dashboard: the ops, ranges and kernels that hold
the most time per step across ranks, each rank's own in a fold, the slowest step's ops, and the
collectives with their message size and bandwidth. Same words as the terminal (ops_text.py)."""

from __future__ import annotations

import html

from ..op_names import short
from .ops_text import size

#: rows per table
ROWS = 10


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _name(n: str) -> str:
    """The short name shown, the whole one on hover."""
    return f'<span title="{_esc(n)}">{_esc(short(n))}</span>'


def _table(tid: str, rows: list, n_ranks: int | None) -> str:
    head = ("<tr><th>name</th><th>ms / step</th><th>calls / step</th>"
            + ("<th>ranks</th>" if n_ranks else "") + "</tr>")
    body = "".join(
        f"<tr><td>{_name(r['name'])}</td><td>{r['per_step_ms']:,.3f}</td>"
        f"<td>{r['count_per_step']:,.2f}</td>"
        + (f"<td>{r['ranks']} of {n_ranks}</td>" if n_ranks else "") + "</tr>"
        for r in rows[:ROWS])
    return f'<table id="{tid}">{head}{body}</table>'


def _collectives(coll: list) -> str:
    head = ("<tr><th>collective</th><th>group</th><th>size</th><th>dtype</th><th>ranks in "
            "group</th><th>calls</th><th>us each</th><th>algbw GB/s</th><th>busbw GB/s</th>"
            "<th>of link</th></tr>")
    body = "".join(
        f"<tr><td>{_esc(c['collective'])}</td><td>{_esc(c['group'])}</td>"
        f"<td>{size(c['bytes'])}</td><td>{_esc(c['dtype'])}</td><td>{c['group_size']}</td>"
        f"<td>{c['instances']}</td><td>{c['time_us']:,.1f}</td><td>{c['algbw_gbps']:,.3g}</td>"
        f"<td>{'-' if c.get('busbw_gbps') is None else format(c['busbw_gbps'], ',.3g')}</td>"
        f"<td>{_esc(format(c['of_link_pct'], '.1f') + '% of ' + c['link']) if c.get('link') else '-'}"
        "</td></tr>" for c in coll[:ROWS])
    lower = any(c.get("ranks_seen", 2) < 2 for c in coll[:ROWS])
    note = ('<p class="dim">one rank\'s trace: each time includes its wait for the others, so '
            "bandwidths are lower bounds</p>" if lower else
            '<p class="dim">each call\'s time is the shortest of the ranks that ran it (the '
            "others waited for the last to arrive)</p>")
    return f'<h3>Collectives by message</h3><table id="ops-collectives">{head}{body}</table>{note}'


def section(ops) -> str:
    """The dashboard's "Ops and kernels" section (sections.Ops; "" without op views)."""
    if ops is None or not ops.ranks:
        return ""
    run, n = ops.run, len(ops.ranks)
    out = ["<h2>Ops and kernels</h2>",
           f'<p class="dim">{_esc(ops.basis)}; mean over {n} rank(s), a rank without '
           "an op counting zero</p>"]
    for key, title in (("ops", "Top-level ops"), ("ranges", "record_function ranges"),
                       ("modules", "Modules (forward)"), ("kernels", "Kernels")):
        if run.get(key):
            out.append(f"<h3>{title}</h3>" + _table(f"ops-run-{key}", run[key], n))
    slow = ops.slow_step
    if slow and slow.get("ops"):
        out.append(f'<p id="ops-slow-step">Slowest step: {slow["step"]} on rank {slow["rank"]}, '
                   f'{slow["step_ms"]:,.1f} ms against its median {slow["median_ms"]:,.1f} ms: '
                   + ", ".join(f"{_name(o['name'])} +{o['excess_ms']:,.1f} ms" for o in
                               slow["ops"][:4]) + "</p>")
    if ops.collectives:
        out.append(_collectives(ops.collectives))
    for r in ops.ranks[:64]:
        tables = "".join(f"<h4>{title}</h4>" + _table(f"ops-rank{r['rank']}-{key}", r[key], None)
                         for key, title in (("ops", "ops"), ("ranges", "ranges"),
                                            ("modules", "modules"), ("kernels", "kernels"))
                         if r.get(key))
        out.append(f'<details class="ops-rank"><summary>rank {r["rank"]}</summary>{tables}'
                   "</details>")
    return "\n".join(out)
