"""Renders a Report for the terminal with rich: verdict, per-rank breakdown, stragglers, fixes."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .report import Report, jitter_note

MS = 1e6
_COLOR = {"data-bound": "yellow", "comm-bound": "magenta", "imbalanced": "red",
          "compute-bound": "green"}


def _ms(ns: float) -> str:
    return f"{ns / MS:,.1f}"


def render(report: Report, console: Console) -> None:
    d = report.to_dict()
    v = report.verdict
    color = _COLOR.get(v.label, "white")
    head = Text()
    head.append("gpuscope ", style="bold")
    head.append(f"{d['source']} ", style="dim")
    head.append(f"{d['path']}\n", style="dim")
    one_host = {r["host"] for r in d["ranks"] if r["host"]}
    head.append(f"{d['ranks_analysed']} of {d['world_size']} ranks"
                f"{' on ' + one_host.pop() if len(one_host) == 1 else ''}, {d['steps_analysed']} steps"
                + (f" (first {report.thresholds.warmup_steps} left out as warm-up)"
                   if d["source"] == "record" else " (profiled steps)") + "\n")
    head.append("Verdict: ", style="bold")
    head.append(v.label.upper(), style=f"bold {color}")
    head.append(f"  {v.share:.0%} of step time, confidence {v.confidence}")
    others = [f"{k} {s:.0%}" for k, s in sorted(v.time_by_label.items(), key=lambda kv: -kv[1])
              if k != v.label and s > 0]
    if others:
        head.append(f"  (also: {', '.join(others)})", style="dim")
    console.print(head)

    parts = ("data", "compute", "comm", "comm_exposed", "wait", "other")
    heads = ("data", "compute", "comm", "exposed", "wait", "other")
    widths = [max([len(h)] + [len(f"{r[p + '_ms']:.1f} {r[p + '_pct']:.0f}%") for r in d["ranks"]])
              for h, p in zip(heads, parts)]
    step_w = max([4] + [len(f"{r['step_ms']:.1f}") for r in d["ranks"]])
    wide = 4 + step_w + sum(widths) + 3 * 8 + 1 <= console.width  # ms and % fit side by side
    t = Table(title="Per rank: " + ("median ms per step, share of step time" if wide else
                                    "median step ms, share of step time per part"),
              title_justify="left")
    hosts = {r["host"] for r in d["ranks"]}
    cols = ("rank",) + (("host",) if len(hosts) > 1 else ()) + (
        "step", "data", "compute", "comm", "exposed", "wait", "other")
    for col in cols:
        t.add_column(col, justify="left" if col == "host" else "right", no_wrap=True)
    straggler_ranks = set(d["stragglers"])
    shown = d["ranks"] if len(d["ranks"]) <= 16 else _interesting(d["ranks"], straggler_ranks)
    for r in shown:
        style = "bold red" if r["rank"] in straggler_ranks else None
        t.add_row(str(r["rank"]), *([r["host"]] if len(hosts) > 1 else []), f"{r['step_ms']:.1f}",
                  *((f"{r[p + '_ms']:.1f} {r[p + '_pct']:.0f}%" if wide else
                     f"{r[p + '_pct']:.0f}%") for p in
                    parts), style=style)
    console.print(t)
    if len(shown) < len(d["ranks"]):
        console.print(f"[dim]{len(d['ranks']) - len(shown)} more ranks in the JSON report[/dim]")

    gb = report.table.extras.get("gpu_breakdown")
    if gb:
        gt = Table(title="GPU time (HTA-compatible, % of kernel time)", title_justify="left")
        for col in ("rank", "idle", "compute", "non-compute", "comm overlap", "kernel time ms"):
            gt.add_column(col, justify="right")
        for rank in sorted(gb)[:16]:
            g = gb[rank]
            ov = g.get("comm_overlap_pct")
            gt.add_row(str(rank), f"{g['idle_pct']:.2f}", f"{g['compute_pct']:.2f}",
                       f"{g['non_compute_pct']:.2f}", "-" if ov is None else f"{ov:.2f}",
                       f"{g['kernel_time_us'] / 1e3:,.1f}")
        console.print(gt)
    tel = report.table.extras.get("telemetry_summary")
    if tel:
        tt = Table(title="GPU telemetry (NVML)", title_justify="left")
        for col in ("rank", "util %", "mem peak %", "power W", "SM MHz", "temp max °C", "throttle"):
            tt.add_column(col, justify="right")
        for rank in sorted(tel)[:16]:
            g = tel[rank]
            tt.add_row(str(rank), f"{g['util_pct']:.0f}", f"{g['mem_used_max_pct']:.0f}",
                       f"{g['power_w']:.0f}", f"{g['sm_clock_mhz']:.0f}", str(g["temp_max_c"]),
                       ", ".join(g["throttle"]) or "-")
        console.print(tt)
    if report.stragglers:
        for s in report.stragglers:
            part = f"{s.cause} ({s.cause_detail})" if s.cause_detail else s.cause
            where = f" on {s.host}" if s.host else ""
            console.print(f"[bold red]Straggler:[/bold red] rank {s.rank}{where}: slow in "
                          f"{s.slow_steps_share:.0%} of steps, {_ms(s.excess_ns)} ms busier per step "
                          f"than the median rank, mostly in {part}")
    elif report.consistent_early:
        console.print(f"Stragglers: none named: rank(s) {', '.join(map(str, report.consistent_early))} "
                      "wait for all the others every step")
    elif "imbalanced" in v.time_by_label:
        console.print("Stragglers: none named (too few steps to tell a straggler from jitter)")
    else:
        console.print("Stragglers: none")
    note = jitter_note(d["jitter"])
    if note:
        console.print(f"[yellow]{note}[/yellow]")

    if d["suggestions"]:
        console.print(Text("\nSuggestions (best estimated gain first)", style="bold"))
        for i, s in enumerate(d["suggestions"], 1):
            console.print(f" {i}. [bold]{s['knob']}[/bold]: {s['current']} -> {s['proposed']}  "
                          f"[green]~{s['estimated_step_ms']:.1f} ms/step, {s['gain_pct']:+.0f}% "
                          f"throughput[/green]")
            console.print(f"    [dim]{s['why']}[/dim]", highlight=False)
    th = report.thresholds
    console.print(f"\n[dim]thresholds: data >= {th.data_high:.0%} (moderate {th.data_moderate:.0%}), "
                  f"exposed comm >= {th.comm:.0%}, wait >= {th.wait:.0%}, straggler in >= "
                  f"{th.straggler_steps:.0%} of steps[/dim]")
    for w in d["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


def _interesting(ranks: list[dict], stragglers: set) -> list[dict]:
    """For big worlds: stragglers, then the slowest and fastest few ranks."""
    by_step = sorted(ranks, key=lambda r: r["step_ms"])
    keep = {r["rank"] for r in by_step[:4] + by_step[-8:]} | stragglers
    return [r for r in ranks if r["rank"] in keep]


def render_text(report: Report, width: int = 100) -> str:
    """The terminal report as plain text at a fixed width (for tests and logs)."""
    buf = io.StringIO()
    render(report, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()
