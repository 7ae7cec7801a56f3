"""Draw the README's pictures from the current code and sample_traces/, in headless Chromium:

- docs/dashboard.png: the HTML dashboard of the imbalanced sample's record;
- docs/tensorboard_tab.png: the gpuscope tab of a real TensorBoard whose logdir holds that run;
- docs/timeline.png: that run's Perfetto export (`gpuscope export --perfetto`), every rank's
  tracks on one time axis, drawn from the exported JSON (Perfetto and chrome://tracing draw the
  same tracks; neither runs offline here).

It also writes docs/pictures.json: for each picture, what it shows in words and figures (the
verdict, stragglers, suggestions and panel titles; the timeline's tracks and their slices), as
`shows()` computes them. tests/test_pictures.py recomputes `shows()` with the code and samples
of the day and fails when a picture no longer shows what they give: then run

    python scripts/make_pictures.py        # needs Chromium (apt-get install chromium)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# generated reports are the models' own: what `gpuscope try` kept on this machine stays out
os.environ["GPUSCOPE_CALIBRATION"] = "off"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DOCS = os.path.join(ROOT, "docs")
STAMP = os.path.join(DOCS, "pictures.json")
#: the run the pictures show, relative to the clone's root
RUN = os.path.join("sample_traces", "imbalanced", "record")
CHROMIUM = os.environ.get("GPUSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _report():
    import gpuscope

    return gpuscope.analyze(RUN)  # from the clone's root: the page names the run as the README


def report_shows(report) -> dict:
    """What the dashboard and the tab show of a report: its words and figures, as drawn."""
    from gpuscope.render.html import figures

    d = report.to_dict()
    return {
        "verdict": d["verdict"], "share_pct": round(100 * d["verdict_share"]),
        "confidence": d["confidence"], "stragglers": d["stragglers"],
        "ranks": d["ranks_analysed"], "steps": d["steps_analysed"],
        "suggestions": [f"{s['knob']}: {s['current']} -> {s['proposed']} "
                        f"~{s['estimated_step_ms']:.1f} ms/step, {s['gain_pct']:+.0f}%"
                        for s in d["suggestions"]],
        "panels": [[pid, fig.layout.title.text] for pid, fig in figures(report) if fig is not None],
    }


def export(path: str) -> dict:
    """The Perfetto export of the run, as `gpuscope export` writes it."""
    subprocess.run([sys.executable, "-m", "gpuscope", "export", RUN,
                    "--perfetto", path], check=True, capture_output=True, cwd=ROOT)
    with open(path) as fh:
        return json.load(fh)


def tracks(doc: dict) -> dict[str, int]:
    """'process / thread' -> the slices on it, in the export's order of processes and threads."""
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    out: dict[str, int] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            key = f"{procs.get(e['pid'], e['pid'])} / {threads.get((e['pid'], e['tid']), e['tid'])}"
            out[key] = out.get(key, 0) + 1
    return out


def shows() -> dict:
    """What each picture shows, from today's code and samples."""
    os.chdir(ROOT)
    here = report_shows(_report())
    with tempfile.TemporaryDirectory() as tmp:
        doc = export(os.path.join(tmp, "timeline.json"))
    return {"run": RUN, "dashboard.png": here, "tensorboard_tab.png": here,
            "timeline.png": {"tracks": tracks(doc), "verdict": doc["otherData"]["verdict"],
                             "stragglers": doc["otherData"]["stragglers"]}}


def _browser(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)


def dashboard(pw, out: str) -> None:
    from gpuscope.render.html import render

    with tempfile.TemporaryDirectory() as tmp:
        page_path = os.path.join(tmp, "report.html")
        with open(page_path, "w") as fh:
            fh.write(render(_report()))
        b = _browser(pw)
        page = b.new_page(viewport={"width": 1200, "height": 1500})
        page.goto("file://" + page_path)
        page.wait_for_selector("#panel-ranks .main-svg")
        page.wait_for_timeout(500)
        page.screenshot(path=out)
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorboard_tab(pw, out: str) -> None:
    with tempfile.TemporaryDirectory() as logdir:
        shutil.copytree(os.path.join(ROOT, RUN), os.path.join(logdir, "imbalanced"))
        port = _free_port()
        tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
                               "--host", "127.0.0.1", "--port", str(port), "--load_fast",
                               "false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(base + "/data/plugins_listing", timeout=2)
                    break
                except OSError:
                    time.sleep(0.3)
            b = _browser(pw)
            page = b.new_page(viewport={"width": 1280, "height": 1400})
            page.goto(base + "/#gpuscope")
            frame = None
            for _ in range(240):
                frame = next((f for f in page.frames if "gpuscope" in f.url
                              and f != page.main_frame), None)
                if frame is not None:
                    break
                page.wait_for_timeout(250)
            frame.wait_for_selector("#panel-heatmap .main-svg", timeout=60000)
            page.wait_for_timeout(800)
            page.screenshot(path=out)
            b.close()
        finally:
            tb.terminate()
            tb.wait(timeout=20)


def timeline(pw, out: str) -> None:
    """The export's slices as horizontal bars, one row per rank's track, on one time axis."""
    import plotly.graph_objects as go

    with tempfile.TemporaryDirectory() as tmp:
        doc = export(os.path.join(tmp, "timeline.json"))
        procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
                 if e.get("ph") == "M" and e["name"] == "process_name"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
                   if e.get("ph") == "M" and e["name"] == "thread_name"}
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        t0 = min(e["ts"] for e in xs)
        rows = sorted({(e["pid"], e["tid"]) for e in xs}, reverse=True)
        label = {k: f"{procs.get(k[0], k[0])} · {threads.get(k, k[1])}" for k in rows}
        colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
                  "#8c8c8c"]
        fig = go.Figure()
        for i, k in enumerate(sorted({(e["tid"]) for e in xs})):
            mine = [e for e in xs if e["tid"] == k]
            fig.add_trace(go.Bar(
                y=[label[(e["pid"], e["tid"])] for e in mine],
                x=[e["dur"] / 1000 for e in mine], base=[(e["ts"] - t0) / 1000 for e in mine],
                orientation="h", marker_color=colors[i % len(colors)],
                text=[e["name"] for e in mine], textposition="inside", insidetextanchor="middle",
                showlegend=False))
        fig.update_layout(barmode="overlay", height=60 + 26 * len(rows), width=1500,
                          margin=dict(l=260, r=20, t=40, b=40), template="plotly_white",
                          title=f"{RUN}: gpuscope export --perfetto, every rank on one timeline",
                          xaxis=dict(title="ms"),
                          yaxis=dict(categoryorder="array",
                                     categoryarray=[label[k] for k in rows]))
        page_path = os.path.join(tmp, "timeline.html")
        fig.write_html(page_path, include_plotlyjs=True)
        b = _browser(pw)
        page = b.new_page(viewport={"width": 1520, "height": 80 + 26 * len(rows)})
        page.goto("file://" + page_path)
        page.wait_for_selector(".main-svg")
        page.wait_for_timeout(500)
        page.screenshot(path=out, full_page=True)
        b.close()


def main() -> None:
    from playwright.sync_api import sync_playwright

    os.chdir(ROOT)
    with sync_playwright() as pw:
        dashboard(pw, os.path.join(DOCS, "dashboard.png"))
        tensorboard_tab(pw, os.path.join(DOCS, "tensorboard_tab.png"))
        timeline(pw, os.path.join(DOCS, "timeline.png"))
    with open(STAMP, "w") as fh:
        json.dump(shows(), fh, indent=1)
        fh.write("\n")
    print("wrote docs/dashboard.png, docs/tensorboard_tab.png, docs/timeline.png, "
          "docs/pictures.json")


if __name__ == "__main__":
    main()
