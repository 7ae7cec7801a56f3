"""Renders a Report as one self-contained interactive plotly HTML dashboard.

Panels: verdict and suggestions in words; per-step stacked bars (slowest rank, median rank, or one
of a few named ranks) with the step labels as a colour strip; a rank x step heatmap (step time
or wait), binned so 1,000 x 1,000 stays light; per-rank breakdown; GPU telemetry and memory
over steps when recorded; the HTA-compatible GPU breakdown for Kineto input.

Every name that comes from a run or a trace is data, not markup: it is HTML-escaped in the page
and in every string handed to plotly (which would otherwise render tags in labels and hovers).

A Report read back from JSON has no rank x step table: its page shows the per-step bars from the
steps' shares and leaves out the panels that need every rank's steps (heatmap, telemetry,
memory).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..op_names import excess_words
from ..runtable import shares
from ..vocab import LABEL_COLORS, MS, STACK_COLORS
from . import ops_html

if TYPE_CHECKING:
    from ..results import ReportData
    from ..sections import Stall

MAX_HEAT_RANKS = 256
MAX_HEAT_STEPS = 400
MAX_NAMED_RANKS = 8


def esc(value) -> str:
    """Text safe both in HTML and inside plotly labels (plotly renders a subset of tags)."""
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------------------ figures
def _parts_ms(frame: pd.DataFrame) -> pd.DataFrame:
    sh = shares(frame)
    step_ms = frame["step_ns"].to_numpy() / MS
    out = pd.DataFrame({"step": frame["step"].to_numpy(), "rank": frame["rank"].to_numpy()})
    for part in STACK_COLORS:
        out[part] = sh[part] * step_ms
    out["step_ms"] = step_ms
    return out


def _stack(report: ReportData) -> dict[str, str]:
    """The stacked parts drawn, with their colours (the bubble only for pipeline runs)."""
    bubble = any(r.bubble_ns or r.bubble_pct for r in report.ranks)
    return {p: c for p, c in STACK_COLORS.items() if p != "bubble" or bubble}


def _step_views(report: ReportData) -> dict[str, pd.DataFrame]:
    """Per-step parts (ms) for the dropdown: slowest rank, median, stragglers and slow ranks."""
    if report.table is None:  # read back from JSON: the steps' own shares
        st = report.steps
        step_ms = np.array([s.step_ns for s in st], dtype=np.float64) / MS
        v = pd.DataFrame({"data": [s.data_share for s in st],
                          "compute": [s.compute_share for s in st],
                          "transfer": [s.comm_share for s in st],
                          "wait": [s.wait_share for s in st],
                          "bubble": [s.bubble_share for s in st]},
                         index=pd.Index([s.step for s in st], name="step")).mul(step_ms, axis=0)
        v["other"] = np.maximum(step_ms - v.sum(axis=1).to_numpy(), 0)
        return {"per step (saved report: mean shares)": v}
    parts = _parts_ms(report.table.frame)
    views: dict[str, pd.DataFrame] = {}
    slowest = parts.loc[parts.groupby("step")["step_ms"].idxmax()].set_index("step")
    views["slowest rank per step"] = slowest
    views["median over ranks"] = parts.groupby("step")[list(STACK_COLORS) + ["step_ms"]].median()
    named = report.straggler_ranks
    by_time = [r.rank for r in sorted(report.ranks, key=lambda r: -r.step_ns)]
    for r in named + [r for r in by_time if r not in named]:
        if len(views) >= 2 + MAX_NAMED_RANKS:
            break
        tag = " (straggler)" if r in named else ""
        views[f"rank {r}{tag}"] = parts[parts["rank"] == r].set_index("step")
    return views


def step_bars(report: ReportData):
    """Stacked per-step bars for a few views, one dropdown; label strip underneath."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    views = _step_views(report)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.9, 0.1],
                        vertical_spacing=0.03)
    stack = _stack(report)
    n_parts = len(stack)
    for i, (name, v) in enumerate(views.items()):
        for part, color in stack.items():
            fig.add_trace(go.Bar(x=v.index.to_numpy(np.int32), y=v[part].to_numpy(np.float32),
                                 name=part, marker_color=color,
                                 visible=i == 0, legendgroup=part, showlegend=True,
                                 hovertemplate=f"step %{{x}}<br>{part}: %{{y:.2f}} ms"
                                               "<extra></extra>"), row=1, col=1)
    steps = report.steps
    fig.add_trace(go.Bar(x=[s.step for s in steps], y=[1] * len(steps),
                         marker_color=[LABEL_COLORS.get(s.label, "#777") for s in steps],
                         customdata=[esc(s.label) for s in steps], name="label", showlegend=False,
                         hovertemplate="step %{x}: %{customdata}<extra></extra>"), row=2, col=1)
    labels = [lb for lb in LABEL_COLORS if any(s.label == lb for s in steps)]
    for lb in labels:  # the strip's legend: one entry per label present
        fig.add_trace(go.Bar(x=[None], y=[None], marker_color=LABEL_COLORS[lb],
                             name=f"step: {lb}", legendgroup="labels", showlegend=True,
                             hoverinfo="skip"), row=2, col=1)
    buttons = []
    for i, name in enumerate(views):
        vis = [False] * (n_parts * len(views)) + [True] * (1 + len(labels))
        vis[i * n_parts:(i + 1) * n_parts] = [True] * n_parts
        buttons.append({"label": esc(name), "method": "update", "args": [{"visible": vis}]})
    fig.update_layout(barmode="stack", height=480, margin=dict(l=60, r=20, t=50, b=40),
                      title="Step time breakdown (ms); strip underneath: each step's label",
                      updatemenus=[{"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.18}],
                      legend=dict(orientation="h", y=-0.12))
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(visible=False, row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig


def _binned(frame: pd.DataFrame, column: str,
            how: str = "mean") -> tuple[np.ndarray, list, list]:
    """rank x step matrix of `column` in ms in at most MAX_HEAT_* bins, each bin the mean, max or
    min of its cells: with "max" one outlier rank among the binned ones still shows. Steps are
    binned by their numbers, as the step bars lay them out: a step the analysis left out (warm-up,
    a profiler's trace export, a gap in the record) is an empty cell, never a neighbour's
    widened. Returns the matrix, the rank labels and each step bin's first step."""
    ranks = np.sort(frame["rank"].unique())
    first, last = int(frame["step"].min()), int(frame["step"].max())
    rbin = max(1, int(np.ceil(len(ranks) / MAX_HEAT_RANKS)))
    sbin = max(1, int(np.ceil((last - first + 1) / MAX_HEAT_STEPS)))
    r_idx = np.searchsorted(ranks, frame["rank"].to_numpy()) // rbin
    s_idx = (frame["step"].to_numpy(np.int64) - first) // sbin
    shape = (r_idx.max() + 1, (last - first) // sbin + 1)
    values = frame[column].to_numpy(np.float64) / MS
    count = np.zeros(shape)
    np.add.at(count, (r_idx, s_idx), 1)
    if how == "mean":
        total = np.zeros(shape)
        np.add.at(total, (r_idx, s_idx), values)
        with np.errstate(invalid="ignore"):
            z = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    else:
        z = np.full(shape, -np.inf if how == "max" else np.inf)
        (np.maximum if how == "max" else np.minimum).at(z, (r_idx, s_idx), values)
        z = np.where(count > 0, z, np.nan)
    ylab = [f"{ranks[i * rbin]}" if rbin == 1 else f"{ranks[i * rbin]}-{ranks[min(len(ranks), (i + 1) * rbin) - 1]}"
            for i in range(shape[0])]
    xlab = (first + sbin * np.arange(shape[1])).astype(np.int32)
    return z.astype(np.float32), ylab, xlab  # float32: half the bytes of the embedded data


def heatmap(report: ReportData):
    if report.table is None:
        return None
    import plotly.graph_objects as go

    f = report.table.frame
    # busy as the stage chart has it: a pipeline stage's waits on its neighbours are not busy
    idle = f["wait_ns"] + (f["bubble_ns"] if "bubble_ns" in f else 0)
    frame = f.assign(busy_ns=f["step_ns"] - idle)
    # what differs between ranks first: in a synchronous step every rank's step time is the
    # same, but a straggler is busier and the others wait
    views = (("busy_ns", "busy (step minus waiting on other ranks), max per bin", "max"),
             ("wait_ns", "wait, min per bin", "min"), ("data_ns", "data wait, max per bin", "max"),
             ("step_ns", "step time, mean per bin", "mean"))
    fig = go.Figure()
    for i, (col, title, how) in enumerate(views):
        z, ylab, xlab = _binned(frame, col, how)
        steps = "steps from" if len(xlab) > 1 and xlab[1] - xlab[0] > 1 else "step"
        fig.add_trace(go.Heatmap(z=z, x=xlab, y=ylab, colorscale="Viridis", visible=i == 0,
                                 colorbar=dict(title="ms"), name=esc(title),
                                 hovertemplate=f"ranks %{{y}}, {steps} %{{x}}: %{{z:.2f}} ms"
                                               "<extra></extra>"))
    buttons = [{"label": esc(title), "method": "update",
                "args": [{"visible": [j == i for j in range(len(views))]}]}
               for i, (_, title, _) in enumerate(views)]
    fig.update_layout(title="Rank x step (ms): a straggler shows as a bright row of busy time",
                      height=420,
                      margin=dict(l=70, r=20, t=50, b=40), yaxis=dict(title="rank", type="category"),
                      xaxis=dict(title="step"),
                      updatemenus=[{"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.18}])
    return fig


def rank_bars(report: ReportData):
    import plotly.graph_objects as go

    ranks = report.ranks
    x = [esc(f"{r.rank}") for r in ranks]
    fig = go.Figure()
    for part, color in _stack(report).items():
        values = np.array([r.transfer_ns if part == "transfer" else r.part_ns(part)
                           for r in ranks], dtype=np.float64)
        fig.add_trace(go.Bar(x=x, y=(values / MS).round(3), name=part, marker_color=color,
                             hovertemplate=f"rank %{{x}}<br>{part}: %{{y:.2f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack", title="Per rank: mean ms per step", height=380,
                      xaxis=dict(title="rank", type="category"), yaxis=dict(title="ms"),
                      margin=dict(l=60, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.2))
    return fig


def phase_bars(report: ReportData):
    """Per rank: forward, backward, optimizer and each kind of collective, mean ms per step."""
    ranks = report.ranks
    phases = [p for p in ("forward", "backward", "optimizer") if any(p in r.phases_pct
                                                                      for r in ranks)]
    kinds = sorted({k for r in ranks for k in r.comm_by_kind})
    if not phases and not kinds:
        return None
    import plotly.graph_objects as go

    x = [esc(f"{r.rank}") for r in ranks]
    fig = go.Figure()
    for p in phases:
        y = [r.step_ns * r.phases_pct.get(p, 0.0) / 100 / MS for r in ranks]
        fig.add_trace(go.Bar(x=x, y=np.round(y, 3), name=p,
                             hovertemplate=f"rank %{{x}}<br>{p}: %{{y:.2f}} ms<extra></extra>"))
    for k in kinds:
        y = [r.comm_by_kind.get(k, 0.0) / MS for r in ranks]
        fig.add_trace(go.Bar(x=x, y=np.round(y, 3), name=esc(k), marker_pattern_shape="/",
                             hovertemplate=f"rank %{{x}}<br>{esc(k)}: %{{y:.2f}} ms"
                                           "<extra></extra>"))
    fig.update_layout(barmode="group", height=360,
                      title="Compute by phase and collectives by kind: mean ms per step",
                      xaxis=dict(title="rank", type="category"), yaxis=dict(title="ms"),
                      margin=dict(l=60, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.2))
    return fig


def stage_bars(report: ReportData):
    """Per pipeline stage: busy, waiting on the previous and on the next stage, mean ms."""
    p = report.pipeline
    if p is None:
        return None
    import plotly.graph_objects as go

    def name(st) -> str:
        return (f"p{st.pipeline} s{st.stage} r{st.rank}" if st.stage is not None
                else f"rank {st.rank}")

    x = [esc(name(st)) for st in p.stages]
    fig = go.Figure()
    if all(st.stage is not None for st in p.stages):
        parts = (("busy", "busy_ns", STACK_COLORS["compute"]),
                 ("waits on previous stage", "wait_prev_ns", STACK_COLORS["bubble"]),
                 ("waits on next stage", "wait_next_ns", "#1f78b4"))
    else:  # profiler traces name no peers
        parts = (("busy", "busy_ns", STACK_COLORS["compute"]),
                 ("waits on other stages (bubble)", "bubble_ns", STACK_COLORS["bubble"]))
    for label, attr, color in parts + (("waits in collectives", None, STACK_COLORS["wait"]),):
        if attr is None:  # the rest of the step: waiting in its group's collectives
            y = np.array([max(st.step_ns - st.busy_ns - sum(getattr(st, a) for _, a, _ in parts
                                                            if a != "busy_ns"), 0)
                          for st in p.stages], dtype=np.float64) / MS
        else:
            y = np.array([getattr(st, attr) for st in p.stages], dtype=np.float64) / MS
        fig.add_trace(go.Bar(x=x, y=y.round(3), name=label, marker_color=color,
                             hovertemplate=f"%{{x}}<br>{label}: %{{y:.2f}} ms<extra></extra>"))
    ideal = (f", GPipe/1F1B ideal {p.ideal_bubble_share:.0%}"
             if p.ideal_bubble_share is not None else "")
    fig.update_layout(barmode="stack", height=360,
                      title=f"Pipeline stages: mean ms per step (bubble {p.bubble_share:.0%}{ideal})",
                      xaxis=dict(title="pipeline / stage / rank", type="category"),
                      yaxis=dict(title="ms"), margin=dict(l=60, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def gpu_breakdown_bars(report: ReportData):
    import plotly.graph_objects as go

    gb = {r.rank: r.gpu_breakdown.to_dict() for r in report.ranks if r.gpu_breakdown is not None}
    if not gb:
        return None
    ranks = sorted(gb)
    fig = go.Figure()
    for key, name, color in (("idle_pct", "idle", "#9aa5b1"), ("compute_pct", "compute", "#2e9d5b"),
                             ("non_compute_pct", "non-compute", "#9b59b6")):
        fig.add_trace(go.Bar(x=[str(r) for r in ranks], y=[gb[r][key] for r in ranks], name=name,
                             marker_color=color))
    overlap = [gb[r].get("comm_overlap_pct") for r in ranks]
    if any(v is not None for v in overlap):
        fig.add_trace(go.Scatter(x=[str(r) for r in ranks], y=overlap, mode="markers",
                                 name="comm overlap %", marker=dict(size=12, color="#d9534f")))
    fig.update_layout(barmode="stack", title="GPU time breakdown (HTA-compatible, % of kernel time)",
                      height=360, xaxis=dict(title="rank", type="category"),
                      yaxis=dict(title="%"), margin=dict(l=60, r=20, t=50, b=40))
    return fig


def telemetry_lines(report: ReportData):
    tel = report.table.telemetry if report.table is not None else None
    if tel is None or len(tel) == 0:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = [c for c in ("util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz", "temp_c")
               if c in tel]
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True,
                        subplot_titles=[esc(m) for m in metrics])
    t0 = tel["t_ns"].min()
    for i, m in enumerate(metrics, 1):
        for rank, g in tel.groupby("rank"):
            fig.add_trace(go.Scattergl(x=(g["t_ns"] - t0) / 1e9, y=g[m], mode="lines",
                                       name=f"rank {rank}", legendgroup=str(rank),
                                       showlegend=i == 1), row=i, col=1)
    fig.update_layout(title="GPU telemetry (NVML) over time (s)", height=180 * len(metrics) + 80)
    return fig


def memory_lines(report: ReportData):
    """Memory over steps per rank: the resident set, and the device's peak allocated (MiB)."""
    mem = report.table.memory if report.table is not None else None
    if mem is None or len(mem) == 0:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    kinds = [(c, t) for c, t in (("rss_bytes", "resident set (host)"),
                                 ("device_peak_bytes", "device: peak allocated"))
             if c in mem and mem[c].notna().any()]
    if not kinds:
        return None
    fig = make_subplots(rows=len(kinds), cols=1, shared_xaxes=True,
                        subplot_titles=[t for _, t in kinds])
    for i, (col, _) in enumerate(kinds, 1):
        for rank, g in mem[mem[col].notna()].groupby("rank"):
            fig.add_trace(go.Scattergl(x=g["step"], y=g[col] / 2**20, mode="lines+markers",
                                       name=f"rank {rank}", legendgroup=str(rank),
                                       showlegend=i == 1), row=i, col=1)
    fig.update_layout(title="Memory over steps (MiB)", height=220 * len(kinds) + 80)
    fig.update_xaxes(title_text="step", row=len(kinds), col=1)
    return fig


def _throughput_html(report: ReportData) -> str:
    from .terminal import energy_line, throughput_line

    out = ""
    line = throughput_line(report.throughput)
    if line:
        out += f'<p id="throughput"><b>Throughput:</b> {esc(line)}</p>'
    line = energy_line(report.energy)
    if line:
        out += f'<p id="energy"><b>Energy:</b> {esc(line)}</p>'
    return out


def _memory_html(report: ReportData) -> str:
    found = report.memory.findings if report.memory is not None else []
    if not found:
        return ""
    items = "".join(f"<li>{esc(f['text'])}</li>" for f in found)
    return f'<h2>Memory</h2><ul id="memory">{items}</ul>'


# ------------------------------------------------------------------------------ page
def _steps_text(report: ReportData) -> str:
    micro = report.knobs.get("sync_interval") or 1
    n = len(report.steps)
    return f"{n} optimizer steps of {micro} micro-steps" if micro > 1 else f"{n} steps"


def _layout_html(report: ReportData) -> str:
    lay = report.layout
    groups = (lay.groups if lay is not None else None) or []
    chains = (lay.pipelines if lay is not None else None) or []
    items = [f"<li>process group {esc(g.name)}: ranks {esc(', '.join(map(str, g.ranks)))}"
             "</li>" for g in groups]
    items += [f"<li>pipeline {i}: ranks {esc(' → '.join(map(str, c)))}</li>"
              for i, c in enumerate(chains)]
    p = report.pipeline
    if p is not None:
        slow = p.slowest()
        where = (f"stage {slow.stage} (rank {slow.rank})" if slow.stage is not None
                 else f"rank {slow.rank}")
        ideal = (f" against {p.ideal_bubble_share:.0%} for GPipe/1F1B with balanced stages"
                 if p.ideal_bubble_share is not None else "")
        micro = f" x {p.microbatches} micro-batches" if p.microbatches else ""
        items.append(f"<li>{p.n_stages} stages{micro}: bubble {p.bubble_share:.0%} of step "
                     f"time{ideal}; slowest {esc(where)}, {p.imbalance:.2f}x the mean stage</li>")
    dp = report.dataparallel
    if dp is not None and dp.forward_ms:
        fwd = ", ".join(f"{esc(d)}: {v:.1f}" for d, v in dp.forward_ms.items())
        mem = dp.peak_memory_gb or {}
        items.append(f"<li>nn.DataParallel over {len(dp.devices)} GPUs: forward ms per step "
                     f"by device {fwd}; scatter {dp.scatter_ms:.1f}, replicate "
                     f"{dp.replicate_ms:.1f}, gather {dp.gather_ms:.1f} ms per step"
                     + (f"; peak GB by device "
                        f"{', '.join(f'{esc(d)}: {v:.2f}' for d, v in mem.items())}"
                        if mem else "") + "</li>")
    return f'<h2>Layout</h2><ul id="layout">{"".join(items)}</ul>' if items else ""


def _mesh_html(report: ReportData) -> str:
    """Communication by process group, named by its mesh dimension (analyze/comm_groups.py)."""
    groups = report.comm_by_group
    if not groups or (len(groups) == 1 and not groups[0].dim):
        return ""
    split = all(g.wait_ms is not None for g in groups)
    head = ("<tr><th>dimension</th><th>group</th><th>ranks</th><th>collectives</th>"
            "<th>comm ms</th><th>exposed ms</th>"
            + ("<th>wait ms</th><th>transfer ms</th>" if split else "") + "</tr>")
    rows = "".join(
        f"<tr><td>{esc(g.dim or '-')}</td><td>{esc(g.group)}</td>"
        f"<td>{esc(', '.join(map(str, g.ranks)))}</td><td>{esc(', '.join(g.kinds))}</td>"
        f"<td>{g.comm_ms:.1f}</td><td>{g.exposed_ms:.1f}</td>"
        + (f"<td>{g.wait_ms:.1f}</td><td>{g.transfer_ms:.1f}</td>" if split else "")
        + "</tr>" for g in groups)
    from .terminal import holds_back_words

    held = holds_back_words(report.layout)  # the terminal's words
    note = f'<p id="mesh-holds-back"><b>{esc(held)}</b></p>' if held else ""
    return ("<h2>Communication by mesh dimension</h2><p class=\"dim\">mean ms per analysed step "
            "over each group's ranks</p>"
            f'<table id="mesh">{head}{rows}</table>{note}')


def _routing_html(report: ReportData) -> str:
    r = report.routing
    if r is None:
        return ""
    rows = ", ".join(f"rank {esc(k)}: {v:,.0f}" for k, v in r.rows_by_rank.items())
    verdict = (f"; <b>rank {r.busiest_rank} gets {r.busiest_share:.0%}, "
               f"{r.max_over_mean:.1f}x the mean</b>" if r.uneven else "; even")
    return (f'<p id="routing">All-to-all rows per step (call {r.instance + 1} of '
            f'{r.instances}, the most uneven: an expert layer\'s dispatch): {rows}{verdict}'
            "</p>")


def mesh_bars(report: ReportData):
    """Per mesh dimension and rank: exposed communication split into wait and transfer, and
    the hidden rest, mean ms per analysed step (analyze/comm_groups.dim_steps)."""
    per = report.comm_by_dim_steps
    if per is None or not len(per):
        return None
    import plotly.graph_objects as go

    # per analysed step of the rank: a step without that dimension's collectives counts as 0
    n_steps = (report.table.frame.groupby("rank").size() if report.table is not None
               else per.groupby("rank")["step"].nunique())
    mean = per.groupby(["dim", "rank"], sort=True).sum(numeric_only=True).reset_index()
    for col in ("comm_ns", "exposed_ns", "wait_ns"):
        if col in mean:
            mean[col] = mean[col] / mean["rank"].map(n_steps).to_numpy(np.float64)
    x = [mean["dim"].astype(str).map(esc).tolist(), mean["rank"].astype(str).tolist()]
    exposed = mean["exposed_ns"].to_numpy(np.float64)
    wait = (np.minimum(mean["wait_ns"].to_numpy(np.float64), exposed) if "wait_ns" in mean
            else None)
    parts = ({"wait": wait, "transfer": exposed - wait} if wait is not None
             else {"exposed": exposed})
    parts["hidden"] = np.maximum(mean["comm_ns"].to_numpy(np.float64) - exposed, 0)
    colors = {"wait": "#e53935", "transfer": "#fb8c00", "exposed": "#fb8c00",
              "hidden": "#bdbdbd"}
    fig = go.Figure()
    for name, values in parts.items():
        fig.add_trace(go.Bar(x=x, y=(values / MS).round(3), name=name,
                             marker_color=colors[name],
                             hovertemplate=f"%{{x}}<br>{name}: %{{y:.2f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack", height=360,
                      title="Communication by mesh dimension and rank: mean ms per step",
                      yaxis=dict(title="ms"), margin=dict(l=60, r=20, t=50, b=60),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def _stall_html(stall: Stall | None) -> list[str]:
    """The stall (analyze/stall.py), with the stacks of the ranks it points at, and the pauses
    the run came back from."""
    out: list[str] = []
    if stall is None:
        return out
    if stall.stalled:  # a run that hung says so first, with the stacks of the ranks
        out.append(f'<p class="died" id="stall">The run stalled: {esc(stall.story)}</p>')
        if stall.flight_recorder_text:  # what the dumps beside the records say
            out.append('<pre class="meta" id="flight-recorder">'
                       f'{esc(stall.flight_recorder_text)}</pre>')
        for r in (stall.never_reached or []) + (stall.odd_ones or []):
            frames = (stall.stacks or {}).get(r) or []
            if frames:
                out.append(f'<details><summary>rank {r}: its stack as it stalled (innermost '
                           'first)</summary><pre>' + esc("\n".join(
                               f'{f["file"]}:{f["line"]} in {f["func"]}' for f in frames[:12]))
                           + '</pre></details>')
    out += [f'<p class="meta">Paused: rank {p.rank} made no step for {p.lasted_s:.0f} s at '
            f'step {p.step} (in {esc(str(p.in_))})</p>' for p in (stall.pauses or [])[:3]]
    return out


def _suggestions_html(report: ReportData) -> str:
    """The suggestions, in the report's order, each with its estimate and range; or why none."""
    if report.suggestions:
        items = "".join(
            f'<li><b>{esc(s.knob)}</b>: {esc(s.current)} &rarr; {esc(s.proposed)} '
            f'<span class="gain">~{s.estimated_step_ms:.1f}'
            + (f' ({s.estimated_step_ms_range[0]:.1f}-{s.estimated_step_ms_range[1]:.1f})'
               if s.estimated_step_ms_range else '')
            + f' ms/step, {s.gain_pct:+.0f}% '
            f'throughput</span><br><span class="why">{esc(s.why)}</span></li>'
            for s in report.suggestions)
        return ('<h2>Suggestions</h2><p class="why">What fixes the verdict first, then by '
                "estimated gain; each estimate is the mean time per step of today's global "
                f'batch.</p><ol id="suggestions">{items}</ol>')
    return ('<h2>Suggestions</h2><p id="suggestions">'
            + ("No suggestion: the run is compute-bound, the healthy state."
               if report.verdict.label == "compute-bound"
               else "No suggestion: the warnings below say why.") + "</p>")


def _summary_html(report: ReportData) -> str:
    v = report.verdict
    color = LABEL_COLORS.get(v.label, "#333")
    out = [f'<h1>gpuscope <small>{esc(report.source)}: {esc(report.path)}</small></h1>']
    out += _stall_html(report.stall)  # a run that hung says so first
    out += [('<p class="died">Also died: ' if i else '<p class="died" id="died">The run died: ')
            + f'{esc(d.text)}</p>'
            for i, d in enumerate(report.died[:4])]  # a run that died says so first
    out += [f'<p class="meta">{len(report.ranks)} of {report.world_size} ranks, '
           f'{_steps_text(report)}</p>',
           f'<div class="verdict" style="border-color:{color}"><span class="label" '
           f'style="background:{color}">{esc(v.label)}</span> {v.share:.0%} of step time, '
           f'confidence {esc(v.confidence)}']
    from .terminal import also_words

    also = also_words(v)  # the terminal's words
    if also:
        out.append(f' <span class="dim">({esc(also)})</span>')
    if v.evidence:
        out.append(f'<div class="dim" id="confidence-why">confidence {esc(v.confidence)}: '
                   f'{esc("; ".join(v.evidence))}</div>')
    out.append("</div>")
    out.append(_throughput_html(report))
    if report.stragglers:
        items = "".join(
            f"<li>{'probably ' if s.probable else ''}rank {s.rank}"
            f"{' on ' + esc(s.host) if s.host else ''}: "
            + (f"{esc(s.probable)}; " if s.probable else f"{esc(s.lateness)}, ")
            + f"{s.excess_ns / MS:.1f} ms busier per step, mostly in {esc(s.part)}"
            + (f"; it holds back its group (ranks {', '.join(map(str, s.group))})"
               if s.group else "")
            + (f"; {esc(excess_words(s.ops))}" if s.ops else "") + "</li>"
            for s in report.stragglers)
        out.append(f'<h2>Stragglers</h2><ul id="stragglers">{items}</ul>')
    if report.minor_stragglers:
        items = "".join(f"<li>{esc(m.line(report.thresholds.wait))}</li>"
                        for m in report.minor_stragglers)
        out.append(f'<h3>Minor stragglers</h3><ul id="minor-stragglers">{items}</ul>')
    if report.not_ruled_out:
        out.append(f'<p id="not-ruled-out">{esc(report.not_ruled_out_line)}</p>')
    if report.straggler_floor and not report.stragglers:
        out.append(f'<p id="straggler-floor">Stragglers: none; '
                   f'{esc(report.straggler_floor_line)}</p>')
    note = report.jitter.note(report.late_ranks)
    if note:
        out.append(f'<p id="jitter">{esc(note)}</p>')
    layout = _layout_html(report)
    if layout:
        out.append(layout)
    out.append(_mesh_html(report))
    out.append(_routing_html(report))
    out.append(_memory_html(report))
    out.append(ops_html.section(report.ops))
    out.append(_suggestions_html(report))
    if report.warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
        out.append(f'<details id="warnings"><summary>{len(report.warnings)} warning(s)</summary>'
                   f"<ul>{items}</ul></details>")
    if report.table is None:
        out.append('<p class="dim">read from a saved JSON report: the rank x step panels need '
                   'the run itself (gpuscope analyze RUN --html FILE)</p>')
    th = report.thresholds
    out.append(f'<p class="dim">thresholds: data &ge; {th.data_high:.0%} (moderate '
               f'{th.data_moderate:.0%}), exposed comm &ge; {th.comm:.0%}, wait &ge; '
               f'{th.wait:.0%}' + (f', bubble &ge; {th.bubble:.0%}' if report.pipeline else '')
               + '</p>')
    return "\n".join(out)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px}h1 small{font-weight:normal;color:#666;font-size:14px}
.died{color:#b00020;font-weight:600}h2{font-size:17px;margin:18px 0 6px}.meta,.dim{color:#666}.verdict{border-left:6px solid;
padding:8px 12px;font-size:18px;background:#fafafa}.label{color:#fff;padding:2px 8px;
border-radius:4px;text-transform:uppercase;font-weight:bold}.gain{color:#2e7d32}
.why{color:#555;font-size:14px}.panel{margin-top:18px}li{margin-bottom:6px}
table{border-collapse:collapse;font-size:14px}th,td{border-bottom:1px solid #ddd;padding:3px 10px;
text-align:right}th:nth-child(-n+4),td:nth-child(-n+4){text-align:left}
table[id^=ops-] td:nth-child(n+2),table[id^=ops-] th:nth-child(n+2){text-align:right}
h3{font-size:15px;margin:12px 0 4px}h4{font-size:14px;margin:8px 0 2px}"""


def figures(report: ReportData) -> list[tuple[str, object]]:
    """(div id, plotly figure) of every panel the report has data for."""
    figs = (("panel-steps", step_bars(report)), ("panel-heatmap", heatmap(report)),
            ("panel-ranks", rank_bars(report)), ("panel-stages", stage_bars(report)),
            ("panel-phases", phase_bars(report)), ("panel-mesh", mesh_bars(report)),
            ("panel-gpu", gpu_breakdown_bars(report)),
            ("panel-telemetry", telemetry_lines(report)),
            ("panel-memory", memory_lines(report)))
    return [(pid, fig) for pid, fig in figs if fig is not None]


def render(report: ReportData, *, plotlyjs: str = "inline") -> str:
    """The dashboard page. plotlyjs: "inline" (self-contained, offline) or a script URL/path
    (shared plotly.js, for a folder of dashboards)."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    if plotlyjs == "inline":
        script = f"<script>{get_plotlyjs()}</script>"
    else:
        script = f'<script src="{esc(plotlyjs)}"></script>'
    parts = []
    for pid, fig in figures(report):
        div = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=pid,
                          config={"displaylogo": False, "responsive": True})
        parts.append(f'<div class="panel">{div}</div>')
    title = esc(f"gpuscope: {report.verdict.label} - {report.path}")
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style>{script}</head><body>{_summary_html(report)}"
            f"{''.join(parts)}</body></html>")
