"""The terminal report (rich): verdict, per-rank breakdown, GPU tables, stragglers, suggestions."""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..sections import known
from ..vocab import COMPUTE_PHASES, IMBALANCED, LABEL_STYLES, MS, PART_HEADS, PARTS, rest_of_other

PHASE_HEADS = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
from . import ops_text
from ._console import text_console, text_of

if TYPE_CHECKING:
    from ..results import RankResult, ReportData
    from ..sections import ParallelLayout, Throughput

MAX_RANK_ROWS = 16


# Numbers are shown from the JSON report's precision (ms to 3 decimals, % to 3, gains to 1), so a
# report read back from JSON prints exactly like the one it was saved from.
def _ms(ns: float) -> float:
    return round(ns / MS, 3)


def _pct(share: float, digits: int = 3) -> float:
    return round(100 * share, digits)


def render(report: ReportData, *, width: int | None = None, color: bool = False) -> str:
    """The report as text, `width` columns wide (the terminal's, else 100); ANSI colours if
    `color`."""
    console, buf = text_console(width, color)
    write(report, console)
    return text_of(buf)


#: the space inside a figure ("35.9 ms", "~8.2 (6.6-15.4) ms/step", "+412% throughput"): a
#: line is never broken there
_FIGURE_SPACE = re.compile(r"(?<=[\d%)])[ ](?=(?:ms|us|s|B|KiB|MiB|GiB|TiB|kB|MB|GB|%|x|ms/step|"
                           r"throughput|worker|workers|steps|core|cores)\b|\()")
_NBSP = "\u00a0"
#: a product or a sum of figures: "2 x 30 x 2 = 120"
_PRODUCT = re.compile(r"(?<=\d)[ \u00a0]([x=+-])[ ](?=[\d~])")


def say(console: Console, text: str, style: str | None = None, indent: int = 0) -> None:
    """A paragraph, wrapped at the console's width between words, never inside a figure."""
    glued = _PRODUCT.sub(_NBSP + r"\1" + _NBSP, _FIGURE_SPACE.sub(_NBSP, text))
    for line in textwrap.wrap(glued, width=max(console.width - indent, 20),
                              break_long_words=False, break_on_hyphens=False) or [""]:
        console.print(Text(" " * indent + line.replace(_NBSP, " "), style=style or ""),
                      soft_wrap=True)


def write(report: ReportData, console: Console) -> None:
    """Print the report on a rich Console."""
    _header(report, console)
    _rank_table(report, console)
    _comm_and_other(report, console)
    _comm_groups(report, console)
    _routing(report, console)
    _layout(report, console)
    _pipeline(report, console)
    _dataparallel(report, console)
    _gpu_tables(report, console)
    _ops(report, console)
    _stragglers(report, console)
    _memory(report, console)
    _suggestions(report, console)
    th = report.thresholds
    console.print(f"\n[dim]thresholds: data >= {th.data_high:.0%} (moderate {th.data_moderate:.0%}), "
                  f"exposed comm >= {th.comm:.0%}, wait >= {th.wait:.0%}, straggler in >= "
                  f"{th.straggler_steps:.0%} of steps"
                  + (f", bubble >= {th.bubble:.0%}" if report.pipeline is not None else "")
                  + "[/dim]")
    for w in report.warnings:  # names from runs are text, never markup
        console.print(Text.assemble(("warning:", "yellow"), f" {w}"))


def _header(report: ReportData, console: Console) -> None:
    v = report.verdict
    head = Text()
    head.append("gpuscope ", style="bold")
    head.append(f"{report.source} ", style="dim")
    head.append(f"{report.path}\n", style="dim")
    stall = report.stall
    stalled = stall is not None and stall.stalled
    if stalled:  # a run that hung says so first: who waits, who never came
        head.append("THE RUN STALLED: ", style="bold red")
        head.append(stall.story + "\n", style="red")
        if stall.flight_recorder_text:
            head.append(stall.flight_recorder_text + "\n")
    for p in ((stall.pauses if stall is not None else None) or [])[:3]:
        head.append("Paused: ", style="bold")
        head.append(f"rank {p.rank} made no step for {p.lasted_s:.0f} s at step "
                    f"{p.step}" + (" until the recording closed" if p.until_end else "")
                    + f" (in {p.in_}" + (f", at {p.at}" if p.at else "") + ")\n")
    for i, d in enumerate(report.died[:4]):  # a run that died says so first
        head.append("THE RUN DIED: " if i == 0 else "also died: ", style="bold red")
        head.append(d.text + "\n", style="red" if i == 0 else "")
    hosts = {r.host for r in report.ranks if r.host}
    skip = report.thresholds.warmup_steps or 0
    micro = report.knobs.get("sync_interval") or 1
    steps = (f"{len(report.steps)} optimizer steps of {micro} micro-steps" if micro > 1
             else f"{len(report.steps)} steps")
    head.append(f"{len(report.ranks)} of {report.world_size} ranks"
                f"{' on ' + hosts.pop() if len(hosts) == 1 else ''}, {steps}"
                + (f" (first {skip} left out as warm-up)" if skip else
                   " (profiled steps)" if report.source == "kineto" else "") + "\n")
    head.append("Verdict" + (" of the steps before it died" if report.died else
                             " of the steps before it stalled" if stalled else "")
                + ": ",
                style="bold")
    head.append(v.label.upper(), style=f"bold {LABEL_STYLES.get(v.label, 'white')}")
    head.append(f"  {_pct(v.share, 2):.0f}% of step time, confidence {v.confidence}")
    also = also_words(v)
    if also:
        head.append(f"  ({also})", style="dim")
    if v.evidence:
        head.append(f"\nconfidence {v.confidence}: " + "; ".join(v.evidence), style="dim")
    line = throughput_line(report.throughput)
    if line:
        head.append("\nThroughput: ", style="bold")
        head.append(line)
    line = energy_line(report.energy)
    if line:
        head.append("\nEnergy: ", style="bold")
        head.append(line)
    console.print(head)


def also_words(v) -> str:
    """The labels beside the verdict, in its order: "also: jitter-bound 22%" ("" for none);
    every front end shows these words."""
    others = [f"{k} {s:.0%}" for k, s in v.others()]
    return f"also: {', '.join(others)}" if others else ""


def energy_line(e) -> str:
    """The energy section's line (sections.Energy.line; "" without one)."""
    return e.line() if e else ""


def _si(x: float) -> str:
    """A unit's SI prefix, written to the unit ("12.3 TFLOP/s")."""
    for div, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.3g} "


def _count(x: float) -> str:
    """A count with its multiplier on the number ("67.6k samples/s", "3.1M tokens/s")."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def throughput_line(t: Throughput | None) -> str:
    """The run's rates in one line ("" without a throughput section)."""
    if t is None:
        return ""
    n = len(t.per_rank)
    parts = [f"{t.steps_per_s:.2f} steps/s"]
    if t.samples_per_s is not None:
        parts.append(f"{_count(t.samples_per_s)} samples/s"
                     + (f" ({_count(t.samples_per_s / n)} per rank)" if n > 1 else ""))
    if known(t.tokens_per_s):
        parts.append(f"{_count(t.tokens_per_s)} tokens/s")
    if known(t.flop_per_s):
        parts.append(f"{_si(t.flop_per_s)}FLOP/s per rank")
        parts.append(f"MFU {t.mfu_pct:.1f}% of {t.peak_source}" if known(t.mfu_pct)
                     else "MFU unknown (above 100% of the peak: an input is wrong, "
                     "see the warning)" if known(t.mfu_impossible) else "MFU unknown")
    return ", ".join(parts)


def _cell(r: RankResult, part: str, wide: bool) -> str:
    """One statistic per cell: the part's share of the rank's step time, and (wide) the mean
    ms per step it amounts to."""
    pct = round(r.part_pct(part), 3)
    return f"{_share_ms(r, pct):.1f} {pct:.0f}%" if wide else f"{pct:.0f}%"


def _parts(ranks: list[RankResult]) -> list[str]:
    """The table's parts: PARTS, with the pipeline bubble after wait where there is one."""
    if not any(r.bubble_pct for r in ranks):
        return list(PARTS)
    i = PARTS.index("wait") + 1
    return list(PARTS[:i]) + ["bubble"] + list(PARTS[i:])


def _share_ms(r: RankResult, pct: float) -> float:
    """Mean ms per step of a share, from the JSON report's precision of both."""
    return _ms(r.step_ns) * round(pct, 3) / 100


def _phase_cell(r: RankResult, phase: str) -> str:
    if phase not in r.phases_pct:
        return "-"
    return f"{_share_ms(r, r.phases_pct[phase]):.1f}"


def _rank_table(report: ReportData, console: Console) -> None:
    ranks = report.ranks
    step_w = max([4] + [len(f"{_ms(r.step_ns):.1f}") for r in ranks])
    cols = _parts(ranks)
    widths = [max([len(PART_HEADS.get(p, p))] + [len(_cell(r, p, True)) for r in ranks])
              for p in cols]
    wide = 4 + step_w + sum(widths) + 3 * (len(cols) + 2) + 1 <= console.width  # ms and % fit
    phases = [p for p in COMPUTE_PHASES if any(p in r.phases_pct for r in ranks)]
    phase_w = sum(max(len(PHASE_HEADS[p]), 5) + 3 for p in phases)
    with_phases = wide and 4 + step_w + sum(widths) + 3 * (len(cols) + 2) + 1 + phase_w \
        <= console.width
    t = Table(title="Per rank: " + ("mean ms per step and share of step time" if wide else
                                    "share of step time per part; step: mean ms"),
              title_justify="left")
    several_hosts = len({r.host for r in ranks}) > 1
    heads = ("rank",) + (("host",) if several_hosts else ()) + ("step",) + \
        tuple(PART_HEADS.get(p, p) for p in cols) + \
        (tuple(PHASE_HEADS[p] for p in phases) if with_phases else ())
    for col in heads:
        t.add_column(col, justify="left" if col == "host" else "right", no_wrap=True)
    stragglers = set(report.straggler_ranks)
    shown = ranks if len(ranks) <= MAX_RANK_ROWS else _interesting(ranks, stragglers)
    for r in shown:
        t.add_row(str(r.rank), *([Text(r.host)] if several_hosts else []),
                  f"{_ms(r.step_ns):.1f}", *(_cell(r, p, wide) for p in cols),
                  *((_phase_cell(r, p) for p in phases) if with_phases else ()),
                  style="bold red" if r.rank in stragglers else None)
    console.print(t)
    if len(shown) < len(ranks):
        console.print(f"[dim]{len(ranks) - len(shown)} more ranks in the JSON report[/dim]")
    left = ([] if wide else ["the parts' ms"]) + ([] if with_phases or not phases
                                                  else ["fwd / bwd / opt"])
    if left:
        say(console, f"{' and '.join(left)} left out: {console.width} columns are too narrow "
                     "(a wider terminal, or --json, has them)", "dim")


def _comm_and_other(report: ReportData, console: Console) -> None:
    """Collectives by kind, and what "other" holds where gpuscope can tell."""
    ranks = report.ranks
    kinds = sorted({k for r in ranks for k in r.comm_by_kind})
    if kinds:
        mean = {k: sum(r.comm_by_kind.get(k, 0.0) for r in ranks) / len(ranks) for k in kinds}
        console.print(Text("Collectives, mean ms per step over ranks: " + ", ".join(
            f"{k} {_ms(v):.1f}" for k, v in sorted(mean.items(), key=lambda kv: -kv[1]))
            + comm_rest(sum(r.comm_ns for r in ranks) / len(ranks), sum(mean.values()))))
    other = sum(r.other_pct for r in ranks) / len(ranks)
    if other < 5:
        return
    between = [r.between_pct for r in ranks if r.between_pct is not None]
    host = [r.host_pct for r in ranks if r.host_pct is not None]
    if between:
        b = sum(between) / len(between)
        timed = any(r.phases_ns.get("forward") for r in ranks)
        console.print(Text(f"Other, {other:.0f}% of step time: {b:.0f}% is the loop's own work "
                           "between rec.step() and the next step (logging, checkpoints, a "
                           f"profiler, evaluation); {rest_of_other(timed)}"))
    elif host:
        h = sum(host) / len(host)
        if h >= 99 and all(r.compute_ns <= 0 and r.comm_ns <= 0 for r in ranks):  # none launched
            console.print(Text(f"Other, {other:.0f}% of step time: the GPU had no kernel to run "
                               f"in {h:.0f}%: the step's work ran on the host"))
        else:
            causes = host_causes(ranks)
            console.print(Text(f"Other, {other:.0f}% of step time: in {h:.0f}% the GPU sat idle "
                               "waiting for the host to launch work"
                               + (f" ({causes})" if causes else "")))


def host_causes(ranks: list[RankResult]) -> str:
    """The GPU's wait on the host by cause, where traces tell one (each a share of step time,
    the mean over ranks, 1% or more): "in 81%, after the host's syncs returned; in 12%, while
    it computed on CPU tensors"."""
    out = []
    for field, words in (("sync_idle_pct", "after the host's syncs returned"),
                         ("cpu_math_pct", "while it computed on CPU tensors"),
                         ("python_pct",
                          "while it ran no torch op (its Python, or work not in the trace)")):
        pct = sum(getattr(r, field) or 0.0 for r in ranks) / len(ranks)
        if pct >= 1:
            out.append(f"in {pct:.0f}%, {words}")
    return "; ".join(out)


def comm_rest(column_ns: float, kinds_ns: float) -> str:
    """How the collectives' own times meet the table's comm column (the union of the step's
    communication): the rest named where it is a tenth of a ms or more (issue 71, 7.)."""
    rest = column_ns - kinds_ns
    if abs(rest) < 0.05 * MS:
        return ""
    if rest > 0:
        return (f"; the comm column's other {_ms(rest):.1f} ms is time the step waited on "
                "collectives outside their own ranges, or DDP's gradient sync in flight from "
                "its first bucket's launch")
    return (f"; together {_ms(-rest):.1f} ms more than the comm column: collectives that "
            "overlap one another count once there")


def _interesting(ranks: list[RankResult], stragglers: set) -> list[RankResult]:
    """For big worlds: stragglers, then the slowest and fastest few ranks."""
    by_step = sorted(ranks, key=lambda r: r.step_ns)
    keep = {r.rank for r in by_step[:4] + by_step[-8:]} | stragglers
    return [r for r in ranks if r.rank in keep]


def _gpu_tables(report: ReportData, console: Console) -> None:
    with_gb = [r for r in report.ranks if r.gpu_breakdown is not None][:MAX_RANK_ROWS]
    if with_gb:
        gt = Table(title="GPU time (HTA-compatible, % of kernel time)", title_justify="left")
        for col in ("rank", "idle", "compute", "non-compute", "comm overlap", "kernel time ms"):
            gt.add_column(col, justify="right")
        for r in with_gb:
            g = r.gpu_breakdown
            ov = g.comm_overlap_pct
            gt.add_row(str(r.rank), f"{g.idle_pct:.2f}", f"{g.compute_pct:.2f}",
                       f"{g.non_compute_pct:.2f}", "-" if ov is None else f"{ov:.2f}",
                       f"{g.kernel_time_us / 1e3:,.1f}")
        console.print(gt)
    with_tel = [r for r in report.ranks if r.telemetry is not None][:MAX_RANK_ROWS]
    if with_tel:
        tt = Table(title="GPU telemetry (NVML)", title_justify="left")
        for col in ("rank", "util %", "mem peak %", "power W", "SM MHz", "temp max °C", "throttle"):
            tt.add_column(col, justify="right")
        for r in with_tel:
            g = r.telemetry
            tt.add_row(str(r.rank), f"{g.util_pct:.0f}", f"{g.mem_used_max_pct:.0f}",
                       f"{g.power_w:.0f}", f"{g.sm_clock_mhz:.0f}", str(g.temp_max_c),
                       ", ".join(g.throttle) or "-")
        console.print(tt)


def _comm_groups(report: ReportData, console: Console) -> None:
    """Communication per process group, named by its mesh dimension where known."""
    groups = report.comm_by_group
    if not groups or (len(groups) == 1 and not groups[0].dim):
        return
    cells = [f"{g.dim or g.group} (ranks {','.join(map(str, g.ranks[:8]))}"
             + ("..." if len(g.ranks) > 8 else "") + f"; {', '.join(g.kinds)}): comm "
             f"{g.comm_ms:.1f}, exposed {g.exposed_ms:.1f}"
             + (f" (wait {g.wait_ms:.1f}, transfer {g.transfer_ms:.1f})"
                if g.wait_ms is not None else "") for g in groups[:8]]
    console.print(Text("Communication by mesh dimension / group, mean ms per step: "
                       + "; ".join(cells)))
    held = holds_back_words(report.layout)
    if held:
        console.print(Text(held, style="bold"))


def holds_back_words(layout: ParallelLayout | None) -> str:
    """The mesh dimension that holds the step back, in words every front end shows ("" where
    none does)."""
    return layout.mesh.holds_back_words() if layout is not None and layout.mesh else ""


def _routing(report: ReportData, console: Console) -> None:
    """All-to-all rows by rank (analyze/routing.py): an expert layer's tokens."""
    r = report.routing
    if r is None:
        return
    rows = ", ".join(f"rank {k}: {v:,.0f}" for k, v in list(r.rows_by_rank.items())[:16])
    console.print(Text(f"All-to-all rows per step (call {r.instance + 1} of {r.instances}, "
                       f"the most uneven): {rows}"
                       + (f"; rank {r.busiest_rank} gets {r.busiest_share:.0%}, "
                          f"{r.max_over_mean:.1f}x the mean" if r.uneven else "; even"),
                       style="bold" if r.uneven else ""))


def _layout(report: ReportData, console: Console) -> None:
    lay = report.layout
    groups = (lay.groups if lay is not None else None) or []
    chains = (lay.pipelines if lay is not None else None) or []
    if not groups and not chains:
        return
    parts = []
    if groups:
        parts.append("process groups " + "; ".join(
            f"{g.name} = ranks {', '.join(map(str, g.ranks))}" for g in groups))
    if chains:
        parts.append("pipelines " + "; ".join(" -> ".join(map(str, c)) for c in chains))
    console.print(Text("Layout: " + "; ".join(parts)))


def _dataparallel(report: ReportData, console: Console) -> None:
    dp = report.dataparallel
    if dp is None or not dp.forward_ms:
        return
    fwd = ", ".join(f"{d}: {v:.1f}" for d, v in dp.forward_ms.items())
    mem = dp.peak_memory_gb
    console.print(Text(
        f"DataParallel over {len(dp.devices)} GPUs: forward ms per step by device {fwd}; "
        f"scatter {dp.scatter_ms:.1f}, replicate {dp.replicate_ms:.1f}, gather "
        f"{dp.gather_ms:.1f} ms per step"
        + (f"; peak GB by device {', '.join(f'{d}: {v:.2f}' for d, v in mem.items())}"
           if mem else "")))


def _pipeline(report: ReportData, console: Console) -> None:
    p = report.pipeline
    if p is None:
        return
    micro = f" x {p.microbatches} micro-batches" if p.microbatches else ""
    ideal = (f" (GPipe/1F1B with balanced stages: {_pct(p.ideal_bubble_share, 2):.0f}%)"
             if p.ideal_bubble_share is not None else "")
    slow = p.slowest()
    where = f"stage {slow.stage} (rank {slow.rank})" if slow.stage is not None else f"rank {slow.rank}"
    console.print(Text(f"Pipeline: {p.n_stages} stages{micro}; bubble {_pct(p.bubble_share, 2):.0f}% "
                       f"of step time{ideal}; slowest {where}, busiest stage "
                       f"{p.imbalance:.2f}x the mean"))
    t = Table(title="Pipeline stages: mean ms per step", title_justify="left")
    for col in ("pipeline", "stage", "rank", "step", "busy", "waits prev", "waits next",
                "bubble"):
        t.add_column(col, justify="right", no_wrap=True)
    dash = lambda v: "-" if v is None else str(v)  # noqa: E731
    for st in p.stages:
        known = st.stage is not None  # traces name no peers: prev / next unknown
        t.add_row(dash(st.pipeline), dash(st.stage), str(st.rank), f"{_ms(st.step_ns):.1f}",
                  f"{_ms(st.busy_ns):.1f}", f"{_ms(st.wait_prev_ns):.1f}" if known else "-",
                  f"{_ms(st.wait_next_ns):.1f}" if known else "-", f"{_ms(st.bubble_ns):.1f}",
                  style="bold" if st.rank == p.slowest_rank else None)
    console.print(t)


def _stragglers(report: ReportData, console: Console) -> None:
    if report.stragglers:
        for s in report.stragglers:
            where = f" on {s.host}" if s.host else ""
            console.print(Text.assemble(
                ("Straggler (probable):" if s.probable else "Straggler:", "bold red"),
                f" rank {s.rank}{where}: " + (f"{s.probable}; " if s.probable else
                                              f"{s.lateness}, ")
                + f"{_ms(s.excess_ns):,.1f} ms busier per step than the median rank, mostly in "
                f"{s.part}"
                + (f"; it holds back its group (ranks {', '.join(map(str, s.group))})"
                   if s.group else "")
                + (f"; {ops_text.excess_line(s.ops)}" if s.ops else "")))
    elif report.early_ranks:
        console.print(f"Stragglers: none named: rank(s) {', '.join(map(str, report.early_ranks))} "
                      "wait for all the others every step")
    elif IMBALANCED in report.verdict.time_by_label:
        console.print("Stragglers: none named (too few steps to tell a straggler from jitter)")
    else:
        console.print("Stragglers: none" + (f" ({report.straggler_floor_line})"
                                            if report.straggler_floor else ""))
    for m in report.minor_stragglers:
        console.print(Text.assemble(("Minor straggler:", "yellow"),
                                    " " + m.line(report.thresholds.wait)))
    if report.not_ruled_out:
        console.print(Text(report.not_ruled_out_line[0].upper() + report.not_ruled_out_line[1:],
                           style="yellow"))
    note = report.jitter.note(report.late_ranks)
    if note:
        console.print(Text(note, style="yellow"))


def _ops(report: ReportData, console: Console) -> None:
    """The few ops, kernels and collectives that hold the most time per step (profiler traces)."""
    for line in ops_text.lines(report.ops):
        say(console, line)


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def _memory(report: ReportData, console: Console) -> None:
    """One line per kind of memory measured (first -> last, rate), then each finding."""
    mem = report.memory
    if mem is None:
        return
    for kind, what in (("host", "resident"), ("device", "device, peak allocated"),
                       ("host_alloc", "CPU allocator")):
        ss = [s for s in mem.series if s.memory == kind]
        if not ss:
            continue
        cells = "; ".join(f"rank {s.rank} {_mib(s.first_bytes)} -> {_mib(s.last_bytes)}"
                          + (f" ({s.rate_bytes_per_step / 2**20:+.1f} MiB/step)"
                             if s.growing else f" (growth unknown: {s.points} sample(s))"
                             if s.growing is None else "") for s in ss[:8])
        more = f"; {len(ss) - 8} more rank(s)" if len(ss) > 8 else ""
        console.print(Text(f"\nMemory ({what}, analysed steps): {cells}{more}"))
    for f in mem.findings:
        style = "red" if f["kind"] in ("out_of_memory", "near_capacity", "growth") else "yellow"
        console.print(Text.assemble(("memory:", style), f" {f['text']}"))


def _suggestions(report: ReportData, console: Console) -> None:
    if not report.suggestions:
        return
    console.print(Text("\nSuggestions (what fixes the verdict, or a label near it, first; then by "
                       "estimated gain; each estimate is the mean time per step of today's global "
                       "batch)",
                       style="bold"))
    for i, s in enumerate(report.suggestions, 1):
        rng = s.estimated_step_ms_range
        span = f" ({rng[0]:.1f}-{rng[1]:.1f})" if rng else ""
        what = f" {i}. {s.knob}: {s.current} -> {s.proposed}  "
        figure = (f"~{round(s.estimated_step_ms, 3):.1f}{span} ms/step, "
                  f"{round(s.gain_pct, 1):+.0f}% throughput")
        if len(what) + len(figure) <= console.width:
            console.print(Text.assemble(f" {i}. ", (s.knob, "bold"),
                                        f": {s.current} -> {s.proposed}  ", (figure, "green")),
                          soft_wrap=True)
        else:  # the figure on a line of its own, whole
            say(console, what.rstrip(), "bold")
            console.print(Text("    " + figure, style="green"), soft_wrap=True)
        say(console, s.why, "dim", 4)
