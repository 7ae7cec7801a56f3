"""The TensorBoard plugin on a real TensorBoard server (loopback): routes, lazy discovery of new
runs, a run still being written, path traversal, and the tab in headless Chromium."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import gpuscope
from gpuscope.doctor import free_port
from browser import Page, launch

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
EVIL_DIR = "<img src=x onerror=alert(1)>"



def get(base, path, raw=False):
    try:
        with urllib.request.urlopen(base + path, timeout=30) as r:
            body = r.read()
            return r.status, (body if raw else json.loads(body))
    except urllib.error.HTTPError as e:
        return e.code, None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logdir")
    shutil.copytree(os.path.join(SAMPLES, "imbalanced", "record"), logdir / "exp1")
    shutil.copytree(os.path.join(SAMPLES, "compute", "kineto"), logdir / "nested" / "traces")
    shutil.copytree(os.path.join(SAMPLES, "data", "record"), logdir / EVIL_DIR)
    (logdir.parent / "secret.json").write_text('{"traceEvents": []}')
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                             "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(base + "/data/plugins_listing", timeout=2)
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("TensorBoard did not start")
    yield base, logdir
    proc.terminate()
    proc.wait(timeout=20)


def test_plugin_is_listed(server):
    base, _ = server
    status, listing = get(base, "/data/plugins_listing")
    assert status == 200 and "gpuscope" in listing
    assert listing["gpuscope"]["enabled"] is True


def test_runs_route_lists_record_and_kineto_runs(server):
    base, _ = server
    status, body = get(base, "/data/plugin/gpuscope/runs")
    runs = {r["run"]: r["kind"] for r in body["runs"]}
    assert runs["exp1"] == "record" and runs["nested/traces"] == "kineto"
    assert runs[EVIL_DIR] == "record"


@pytest.mark.parametrize("run,verdict,stragglers", [("exp1", "imbalanced", [1]),
                                                    ("nested/traces", "compute-bound", [])])
def test_report_route_gives_the_same_findings_as_the_cli(server, run, verdict, stragglers):
    base, logdir = server
    status, body = get(base, "/data/plugin/gpuscope/report?run=" + run)
    assert status == 200
    expected = gpuscope.analyze(logdir / run).to_dict()
    assert body["report"]["verdict"] == expected["verdict"] == verdict
    assert body["report"]["stragglers"] == expected["stragglers"] == stragglers
    assert [s["knob"] for s in body["report"]["suggestions"]] == \
        [s["knob"] for s in expected["suggestions"]]
    assert {f["id"] for f in body["figures"]} >= {"panel-steps", "panel-heatmap", "panel-ranks"}
    assert str(logdir) not in json.dumps(body)  # no server paths leak


@pytest.mark.parametrize("run", ["..", "../secret.json", "/etc", "exp1/../..", "nested/../../",
                                 "%2e%2e", "exp1\x00", "nonexistent"])
def test_report_route_refuses_paths_outside_the_listed_runs(server, run):
    base, _ = server
    status, _ = get(base, "/data/plugin/gpuscope/report?run=" + urllib.request.quote(run))
    assert status == 404


@pytest.mark.parametrize("path", ["/static/../plugin.py", "/static/..%2fplugin.py",
                                  "/static/%2e%2e/plugin.py", "/static/.hidden"])
def test_static_route_serves_only_its_files(server, path):
    base, _ = server
    status, _ = get(base, "/data/plugin/gpuscope" + path, raw=True)
    assert status == 404


def test_new_runs_are_noticed_and_growing_runs_reread(server):
    base, logdir = server
    live = logdir / "live"
    rec = gpuscope.record(live, flush_rows=1)  # every step on disk at once
    rec.__enter__()
    for _ in rec.data(range(6)):
        rec.step()
    time.sleep(3.5)  # the run list is re-scanned at most every 3 s
    status, body = get(base, "/data/plugin/gpuscope/runs")
    assert "live" in {r["run"] for r in body["runs"]}
    _, first = get(base, "/data/plugin/gpuscope/report?run=live")
    assert any("no end record" in w for w in first["report"]["warnings"])  # still being written
    for _ in rec.data(range(10)):
        rec.step()
    rec.__exit__(None, None, None)
    _, second = get(base, "/data/plugin/gpuscope/report?run=live")
    assert second["report"]["steps_analysed"] > first["report"]["steps_analysed"]
    assert not any("no end record" in w for w in second["report"]["warnings"])


def test_tab_renders_in_chromium(server):
    base, _ = server
    pw, browser = launch()
    try:
        p = Page(browser, height=2200)
        p.page.goto(base + "/#gpuscope")
        frame = None
        deadline = time.time() + 60
        while frame is None and time.time() < deadline:
            frame = next((f for f in p.page.frames if "gpuscope" in f.url and f != p.page.main_frame),
                         None)
            p.page.wait_for_timeout(250)
        assert frame is not None, [f.url for f in p.page.frames]
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        options = frame.eval_on_selector_all("#run-select option", "els => els.map(e => e.value)")
        assert {"exp1", "nested/traces", EVIL_DIR} <= set(options)
        assert frame.locator(".verdict .label").inner_text().lower() in (
            "data-bound", "comm-bound", "imbalanced", "compute-bound")
        for pid in ("panel-steps", "panel-heatmap", "panel-ranks"):
            assert frame.locator(f"#{pid} .main-svg").count() >= 1
        frame.select_option("#run-select", EVIL_DIR)  # markup in a run name stays text
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        assert frame.locator("img[src=x]").count() == 0 and p.dialogs == []
        frame.select_option("#run-select", "nested/traces")  # its ranks wait with no straggler
        frame.wait_for_selector("#jitter", timeout=60000)
        expected = gpuscope.analyze(os.path.join(SAMPLES, "compute", "kineto")).to_dict()["jitter"]
        assert f"{expected['wait_pct']:.1f}% of step time" in frame.locator("#jitter").inner_text()
        frame.select_option("#run-select", "exp1")
        frame.wait_for_selector("#stragglers", timeout=60000)
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        p.page.wait_for_timeout(500)
        p.screenshot("tensorboard_tab.png")
        assert [e for e in p.errors if "favicon" not in e] == []
    finally:
        browser.close()
        pw.stop()


def test_recorder_writes_scalars_for_the_scalars_tab(tmp_path):
    pytest.importorskip("torch")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with gpuscope.record(tmp_path / "run", tensorboard=True) as rec:
        for _ in rec.data(range(20)):
            rec.step()
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard" / "rank-00000"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "gpuscope/step_ms" in tags and "gpuscope/data_ms" in tags
    assert len(acc.Scalars("gpuscope/step_ms")) == 20


def test_scalars_are_written_off_the_training_thread(tmp_path, monkeypatch):
    import threading

    from gpuscope.record import tb_scalars

    threads = []
    real = tb_scalars.ScalarWriter.write

    def spy(self, rows):
        threads.append(threading.current_thread())
        real(self, rows)

    monkeypatch.setattr(tb_scalars.ScalarWriter, "write", spy)
    with gpuscope.record(tmp_path / "run", tensorboard=True) as rec:
        for _ in rec.data(range(40)):
            rec.step()
    assert threads and all(t is not threading.main_thread() for t in threads)


def test_a_failing_scalar_writer_only_turns_scalars_off(tmp_path, monkeypatch):
    from gpuscope.record import tb_scalars
    from gpuscope.readers import read_path as load_table

    def broken(self, run_dir, rank):
        raise OSError("disk full")

    monkeypatch.setattr(tb_scalars.ScalarWriter, "__init__", broken)
    seen = 0
    with gpuscope.record(tmp_path / "run", tensorboard=True) as rec:
        for _ in rec.data(range(40)):
            seen += 1
            rec.step()
    assert seen == 40
    table = load_table(str(tmp_path / "run"))
    assert len(table.frame) == 40
    assert any("TensorBoard scalars disabled" in w and "disk full" in w for w in table.warnings)
