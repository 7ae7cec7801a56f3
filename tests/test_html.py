"""The HTML dashboard: self-contained, loads in headless Chromium without errors, escapes
names from runs and traces, and stays light for 1,000 ranks x 1,000 steps."""

import json
import os
import re
import shutil

import numpy as np
import pandas as pd
import pytest

import gpuscope
from gpuscope.analyze.run import analyze_table
from gpuscope.render.html import render as render_html
from gpuscope.runtable import RankInfo, RunTable
from gpuscope.thresholds import Thresholds

from browser import Page, launch

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
HTA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces", "hta")
EVIL = '<img src=x onerror="alert(1)">'


@pytest.fixture(scope="module")
def browser():
    pw, b = launch()
    yield b
    b.close()
    pw.stop()


def _evil_run(tmp_path):
    """A real recorded run whose host name is markup (as a hostile or odd hostname would be)."""
    src = os.path.join(SAMPLES, "imbalanced", "record")
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    for f in dst.glob("*.jsonl"):
        (dst / f.name.replace(".jsonl", ".cols")).unlink(missing_ok=True)  # counts old header bytes
        lines = f.read_text().splitlines()
        header = json.loads(lines[0])
        header["host"] = EVIL
        lines[0] = json.dumps(header)
        f.write_text("\n".join(lines) + "\n")
    return dst


def test_offline_self_contained(tmp_path):
    from plotly.offline import get_plotlyjs

    html = render_html(gpuscope.analyze(os.path.join(SAMPLES, "data", "record")))
    assert get_plotlyjs() in html  # plotly.js inlined once
    ours = html.replace(get_plotlyjs(), "")
    assert "cdn.plot.ly" not in ours and not re.search(r'(src|href)="https?:', ours)
    assert ours.count("Plotly.newPlot") >= 3


def test_markup_in_names_is_escaped(tmp_path):
    html = render_html(gpuscope.analyze(_evil_run(tmp_path)))
    assert EVIL not in html
    assert "&lt;img src=x" in html


@pytest.mark.parametrize("source", ["sample_traces/imbalanced/record",
                                    "sample_traces/imbalanced/kineto", "hta:trace_filter"])
def test_dashboard_loads_in_chromium(browser, tmp_path, source):
    path = (os.path.join(HTA, source[4:]) if source.startswith("hta:")
            else os.path.join(SAMPLES, "..", source))
    if not os.path.exists(path):
        pytest.skip("trace folder missing")
    out = tmp_path / "report.html"
    out.write_text(render_html(gpuscope.analyze(path)))
    p = Page(browser)
    external = []
    p.page.route("**/*", lambda route: (external.append(route.request.url), route.abort())
                 if not route.request.url.startswith(("file:", "data:")) else route.continue_())
    p.page.goto(out.as_uri())
    p.page.wait_for_selector("#panel-ranks .main-svg", timeout=20000)
    assert external == []  # opens offline: nothing fetched from the network
    ids = p.page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.id)")
    assert {"panel-steps", "panel-heatmap", "panel-ranks"} <= set(ids)
    if source.startswith("hta:"):
        assert "panel-gpu" in ids  # the HTA-compatible breakdown for Kineto GPU traces
    from gpuscope.vocab import LABELS

    assert p.page.locator(".verdict .label").inner_text().lower() in LABELS
    assert p.errors == []
    p.screenshot(f"dashboard_{source.replace('/', '_').replace(':', '_')}.png")


def test_escaped_page_runs_no_injected_markup(browser, tmp_path):
    out = tmp_path / "evil.html"
    out.write_text(render_html(gpuscope.analyze(_evil_run(tmp_path))))
    p = Page(browser)
    p.page.goto(out.as_uri())
    p.page.wait_for_selector("#panel-ranks .main-svg", timeout=20000)
    box = p.page.locator("#panel-ranks .bars path").first.bounding_box()
    p.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # hover label
    p.page.wait_for_timeout(300)
    assert p.page.locator("img[src=x]").count() == 0
    assert p.dialogs == [] and p.errors == []
    assert EVIL in p.page.locator("#stragglers").inner_text()  # shown as text


def _big_table(n_ranks=1000, n_steps=1000) -> RunTable:
    rng = np.random.default_rng(0)
    rank = np.repeat(np.arange(n_ranks), n_steps)
    step = np.tile(np.arange(n_steps), n_ranks)
    compute = rng.normal(80e6, 2e6, rank.size).astype(np.int64)
    compute[rank == 7] += 30_000_000  # one straggler
    busy = compute + 5_000_000
    slowest = pd.Series(busy).groupby(step).transform("max").to_numpy()
    exposed = (slowest - busy + 3_000_000).astype(np.int64)
    frame = pd.DataFrame({"rank": rank, "step": step, "start_ns": step * 120_000_000,
                          "step_ns": slowest + 3_000_000 + 5_000_000, "data_ns": 5_000_000,
                          "compute_ns": compute, "comm_ns": exposed + 20_000_000,
                          "comm_exposed_ns": exposed, "wait_ns": 0, "other_ns": 0,
                          "forward_ns": 0, "backward_ns": 0, "optimizer_ns": 0, "n_comm": 4,
                          "data_cpu_ns": 5_000_000})
    frame["other_ns"] = (frame["step_ns"] - frame["data_ns"] - frame["compute_ns"]
                         - frame["comm_exposed_ns"]).clip(lower=0)
    ranks = {r: RankInfo(r, f"node{r // 8}") for r in range(n_ranks)}
    return RunTable(frame, "record", "<synthetic 1000x1000>", ranks, n_ranks, [])


def test_thousand_ranks_by_thousand_steps_stays_light(browser, tmp_path):
    report = analyze_table(_big_table(), Thresholds())
    assert [s.rank for s in report.stragglers] == [7]
    from gpuscope.render.html import figures

    figs = dict(figures(report))
    traces = {pid: len(fig.data) for pid, fig in figs.items()}
    assert traces["panel-heatmap"] == 4 and sum(traces.values()) < 80  # aggregated, not per rank
    # the heatmap opens on busy time, binned by the max: the straggler's bin stands out
    busy = np.array(figs["panel-heatmap"].data[0].z, dtype=float)
    rows = np.nanmedian(busy, axis=1)
    labels = list(figs["panel-heatmap"].data[0].y)
    hot = int(np.argmax(rows))
    lo, hi = (int(x) for x in labels[hot].split("-"))
    assert lo <= 7 <= hi and rows[hot] - np.median(rows) > 20  # +30 ms on rank 7 of 1,000
    html = render_html(report, plotlyjs="plotly.min.js")  # measure our part, not plotly.js
    assert len(html) < 3_000_000
    out = tmp_path / "big.html"
    out.write_text(html)
    from plotly.offline import get_plotlyjs

    (tmp_path / "plotly.min.js").write_text(get_plotlyjs())
    p = Page(browser)
    p.page.goto(out.as_uri())
    p.page.wait_for_selector("#panel-heatmap .main-svg", timeout=30000)
    assert p.errors == []


def test_binned_heatmap_values_are_the_mean_max_and_min_of_their_cells():
    """Two ranks per bin and two steps per bin (sizes just over the bin limits): each bin holds
    the mean (or max, min) of its 4 cells, worked out here from the cell values."""
    import pandas as pd

    from gpuscope.render import html

    n_ranks, n_steps = 2 * html.MAX_HEAT_RANKS, 2 * html.MAX_HEAT_STEPS
    rank = np.repeat(np.arange(n_ranks), n_steps)
    step = np.tile(np.arange(n_steps), n_ranks)
    value_ms = (rank * 10 + step % 7).astype(float)
    frame = pd.DataFrame({"rank": rank, "step": step, "x": (value_ms * 1e6).astype(np.int64)})
    cells = value_ms.reshape(n_ranks // 2, 2, n_steps // 2, 2)
    for how, expect in (("mean", cells.mean(axis=(1, 3))), ("max", cells.max(axis=(1, 3))),
                        ("min", cells.min(axis=(1, 3)))):
        z, ylab, xlab = html._binned(frame, "x", how)
        assert z.shape == (n_ranks // 2, n_steps // 2)
        assert np.allclose(z, expect, atol=1e-3), how
    assert ylab[0] == "0-1" and list(xlab[:2]) == [0, 2]


def test_the_heatmap_draws_only_steps_that_exist():
    """Steps 6-8 left out (a profiler's trace export, say): the bars leave a gap there, and so
    does the heatmap: empty cells at 6, 7 and 8, not steps 5 and 9 widened over them."""
    from gpuscope.render import html

    rows = [{"rank": r, "step": s, "x": (10 + s) * 1_000_000}
            for r in range(2) for s in list(range(1, 6)) + list(range(9, 16))]
    z, ylab, xlab = html._binned(pd.DataFrame(rows), "x", "max")
    assert list(xlab) == list(range(1, 16)) and ylab == ["0", "1"]
    assert np.isnan(z[:, 5:8]).all() and not np.isnan(z[:, :5]).any()
    assert z[0, 8] == pytest.approx(19)  # step 9's own cell
    # binned (800 steps into 400 columns by step number): the gap stays a gap
    rows = [{"rank": 0, "step": s, "x": 1} for s in range(800) if not 100 <= s < 110]
    z, _, xlab = html._binned(pd.DataFrame(rows), "x", "mean")
    assert z.shape == (1, 400) and list(xlab[:2]) == [0, 2]
    assert np.isnan(z[0, 50:55]).all() and not np.isnan(z[0, 49]) and not np.isnan(z[0, 55])


def test_the_busy_heatmap_agrees_with_the_pipeline_stage_chart():
    """On the pipeline sample, a stage's waits on its neighbours are not busy time: the heatmap's
    busy row of each stage averages to the stage chart's busy bar (122.6 vs 42.9 ms drawn as
    128-142 ms for both before)."""
    from gpuscope.render import html

    rep = gpuscope.analyze(os.path.join(SAMPLES, "parallel", "pipeline", "record"))
    fig = html.heatmap(rep)
    busy = next(t for t in fig.data if t.name.startswith("busy"))
    z = np.asarray(busy.z, dtype=float)
    stages = dict(zip(busy.y, np.nanmean(z, axis=1)))
    bars = next(t for t in html.stage_bars(rep).data if t.name == "busy")
    for st, y in zip(rep.pipeline.stages, bars.y):
        assert stages[str(st.rank)] == pytest.approx(y, rel=0.02), (st.rank, stages, bars.y)
    assert abs(stages["0"] - stages["1"]) > 30  # the stages differ, as the chart shows


def test_the_also_labels_are_in_one_order_in_the_terminal_and_the_page():
    """Issue 71, 16.: the terminal listed the other labels largest first, the page in the
    table's order (and with shares that round to 0%)."""
    import io

    from gpuscope.results import Verdict

    v = Verdict("data-bound", 0.6, "high", {"compute-bound": 0.1, "data-bound": 0.6,
                                            "comm-bound": 0.296, "host-bound": 0.004})
    assert v.others() == [("comm-bound", 0.296), ("compute-bound", 0.1)]
    rep = gpuscope.analyze(os.path.join(SAMPLES, "data", "record"))
    rep.verdict = v
    page = render_html(rep, plotlyjs="cdn")
    text = io.StringIO()
    rep.print(file=text, width=200)
    assert "(also: comm-bound 30%, compute-bound 10%)" in page
    assert "(also: comm-bound 30%, compute-bound 10%)" in text.getvalue()
