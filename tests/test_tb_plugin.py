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
from gpuscope.vocab import LABELS

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
JITTER = os.path.join(os.path.dirname(__file__), "fixtures", "jitter", "kineto")
EVIL_DIR = "<img src=x onerror=alert(1)>"
#: a 4-rank run whose rank 2 blocked in forward at step 20 (tests/workloads/hangs.py --how block)
STALLED = os.path.join(os.path.dirname(__file__), "fixtures", "stalled")



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
    shutil.copytree(JITTER, logdir / "nested" / "traces")
    shutil.copytree(os.path.join(SAMPLES, "parallel", "pipeline", "record"), logdir / "pipeline")
    shutil.copytree(STALLED, logdir / "stalled")
    shutil.copytree(os.path.join(SAMPLES, "data", "record"), logdir / EVIL_DIR)
    (logdir.parent / "secret.json").write_text('{"traceEvents": []}')
    # traces named as HTA's test data and export_chrome_trace name them (the CLI reads them)
    hta = logdir / "hta_style"
    hta.mkdir()
    one_per_process = {f.split(".")[0]: f for f in sorted(os.listdir(os.path.join(SAMPLES, "data",
                                                                                   "kineto")))}
    for i, f in enumerate(sorted(one_per_process.values())):
        shutil.copy(os.path.join(SAMPLES, "data", "kineto", f), hta / f"rank-{i}.json.gz")
    (logdir / "configs").mkdir()
    (logdir / "configs" / "MANIFEST.json").write_text('{"runs": ["a"], "seed": 0}')
    # links out of the logdir: a folder, a rank file, and one of two rank files
    outside = logdir.parent / "outside"
    shutil.copytree(os.path.join(SAMPLES, "comm", "record"), outside)
    os.symlink(outside, logdir / "linked_dir")
    (logdir / "linked_file").mkdir()
    os.symlink(outside / "rank-00000.gpuscope.jsonl", logdir / "linked_file" / "rank-00000.gpuscope.jsonl")
    (logdir / "mixed").mkdir()
    shutil.copy(outside / "rank-00000.gpuscope.jsonl", logdir / "mixed")
    os.symlink(outside / "rank-00001.gpuscope.jsonl", logdir / "mixed" / "rank-00001.gpuscope.jsonl")
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
    assert runs["hta_style"] == "kineto"  # found by the CLI's rule, not only *.pt.trace.json
    assert "configs" not in runs  # a JSON file that is plainly no trace
    assert "linked_dir" not in runs and "linked_file" not in runs  # links out are not followed


def test_hta_style_names_give_the_clis_report(server):
    base, logdir = server
    status, body = get(base, "/data/plugin/gpuscope/report?run=hta_style")
    assert status == 200 and "error" not in body
    assert body["report"]["verdict"] == gpuscope.analyze(logdir / "hta_style").verdict.label
    assert body["report"]["ranks_analysed"] == 2


def test_a_run_with_a_link_out_of_the_logdir_is_not_read(server):
    base, _ = server
    status, body = get(base, "/data/plugin/gpuscope/report?run=mixed")
    assert status == 200 and "report" not in body
    assert "link(s) to files outside the logdir" in body["error"]


def test_the_tab_reads_while_a_run_is_written(server):
    """A training run writes rank files (every step flushed) while the tab is asked for its
    report over and over: every answer is a report, never an error or a broken response."""
    import threading

    base, logdir = server
    live = logdir / "busy"
    done = threading.Event()

    def train():
        with gpuscope.record(live, flush_rows=1) as rec:
            for _ in rec.data(range(2500)):
                time.sleep(0.004)
                rec.step()
        done.set()

    t = threading.Thread(target=train)
    t.start()
    try:
        while not (live / "rank-00000.gpuscope.jsonl").exists():
            time.sleep(0.05)
        time.sleep(RESCAN_WAIT)
        seen = []
        while not done.is_set():
            status, body = get(base, "/data/plugin/gpuscope/report?run=busy")
            assert status == 200 and body is not None
            if "error" in body:
                assert "no steps to analyse" in body["error"]  # only before the first row
            else:
                seen.append(body["report"]["steps_analysed"])
        assert len(seen) >= 3 and seen == sorted(seen)
    finally:
        t.join()


RESCAN_WAIT = 3.5  # the run list is re-scanned at most every 3 s


# nested/traces: a balanced 2-rank run whose ranks trade lateness (tests/fixtures/jitter)
@pytest.mark.parametrize("run,verdicts,stragglers", [
    ("exp1", ("imbalanced",), [1]), ("nested/traces", ("jitter-bound",), [])])
def test_report_route_gives_the_same_findings_as_the_cli(server, run, verdicts, stragglers):
    base, logdir = server
    status, body = get(base, "/data/plugin/gpuscope/report?run=" + run)
    assert status == 200
    expected = gpuscope.analyze(logdir / run).to_dict()
    assert body["report"]["verdict"] == expected["verdict"] in verdicts
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
        # the tab opens the newest run, which is whichever the fixture wrote last ("mixed", refused,
        # when its copies land in the same second): pick one that draws
        frame.wait_for_selector("#run-select option", state="attached", timeout=60000)
        frame.select_option("#run-select", "exp1")
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        options = frame.eval_on_selector_all("#run-select option", "els => els.map(e => e.value)")
        assert {"exp1", "nested/traces", EVIL_DIR, "hta_style"} <= set(options)
        assert not {"linked_dir", "linked_file", "configs"} & set(options)
        assert frame.locator(".verdict .label").inner_text().lower() in LABELS
        for pid in ("panel-steps", "panel-heatmap", "panel-ranks"):
            assert frame.locator(f"#{pid} .main-svg").count() >= 1
        frame.select_option("#run-select", EVIL_DIR)  # markup in a run name stays text
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        assert frame.locator("img[src=x]").count() == 0 and p.dialogs == []
        frame.select_option("#run-select", "mixed")  # refused: says why, draws nothing
        frame.wait_for_selector(".error", timeout=60000)
        assert "outside the logdir" in frame.locator(".error").inner_text()
        frame.select_option("#run-select", "hta_style")
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        frame.select_option("#run-select", "nested/traces")  # its ranks wait with no straggler
        frame.wait_for_selector("#jitter", timeout=60000)
        expected = gpuscope.analyze(JITTER).to_dict()["jitter"]
        assert f"{expected['wait_pct']:.1f}% of step time" in frame.locator("#jitter").inner_text()
        # the ops section: the run's top op first, as the report has it
        frame.wait_for_selector("#ops-run-ops", timeout=60000)
        top = gpuscope.analyze(JITTER).ops.run["ops"][0]
        cells = frame.locator("#ops-run-ops tr").nth(1).inner_text()
        assert top["name"][:77] in cells and f"{top['per_step_ms']:.3f}" in cells
        frame.wait_for_selector("#panel-ranks .main-svg", timeout=60000)
        p.page.wait_for_timeout(500)
        p.screenshot("tensorboard_tab_traces.png")
        frame.select_option("#run-select", "pipeline")  # the stage chart beside the heatmaps
        frame.wait_for_selector("#panel-stages .main-svg", timeout=60000)
        p.page.wait_for_timeout(500)
        p.screenshot("tensorboard_tab_pipeline.png")
        frame.select_option("#run-select", "stalled")  # a hung run says so first
        frame.wait_for_selector("#stall", timeout=60000)
        said = frame.locator("#stall").inner_text()
        assert said.startswith("The run stalled: at step 20") and \
            "rank 2 never reached it: in forward of step 20" in said, said
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
    # memory, once per flush (every 16 rows or second, and the last ones): at the windows'
    # last steps, in MiB, what the run dir holds
    mem = acc.Scalars("gpuscope/memory_resident_mib")
    from gpuscope.readers import read_path

    table = read_path(str(tmp_path / "run")).memory
    assert [e.step for e in mem] == table["step"].tolist() and mem[-1].step == 19
    assert [e.value for e in mem] == pytest.approx((table["rss_bytes"] / 2**20).tolist())


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


def test_analysis_cache_is_used_and_bounded(tmp_path, monkeypatch):
    """In-process RunIndex: a second request is served from the cache (one analysis), a
    changed run is analysed again, the cache holds at most CACHE_RUNS, and a run over the size
    bound is refused with a message instead of being loaded into the server."""
    from gpuscope.integrations.tensorboard.plugin import RunIndex

    for name in ("a", "b", "c"):
        shutil.copytree(os.path.join(SAMPLES, "comm", "record"), tmp_path / name)
    monkeypatch.setattr(RunIndex, "CACHE_RUNS", 2)
    idx = RunIndex(str(tmp_path))
    first = idx.report("a")
    assert idx.report("a") is first and idx.analyses == 1
    with open(tmp_path / "a" / "rank-00000.gpuscope.jsonl", "a") as fh:
        fh.write("\n")  # the run changed: analysed again
    idx.report("a")
    assert idx.analyses == 2
    idx.report("b")
    idx.report("c")
    assert idx.cached_runs() == ["b", "c"] and idx.analyses == 4
    idx.report("a")
    assert idx.analyses == 5
    monkeypatch.setattr(RunIndex, "MAX_RUN_BYTES", 5_000)
    big = RunIndex(str(tmp_path))
    body = big.report("b")
    assert "report" not in body and "gpuscope analyze" in body["error"] and big.analyses == 0


def test_every_response_says_nosniff(server):
    """TensorBoard warns of plugin responses without X-Content-Type-Options: nosniff (an error
    from its 3.0 on): the static files, plotly.js and the JSON routes all carry it."""
    base, _ = server
    for path in ("/index.js", "/static/index.js", "/plotly.min.js", "/runs"):
        with urllib.request.urlopen(base + "/data/plugin/gpuscope" + path, timeout=60) as r:
            assert r.headers.get("X-Content-Type-Options") == "nosniff", path


def test_runs_are_listed_newest_first(server):
    """The tab opens the first run listed: the newest (a run just recorded), not the
    alphabetically first of the logdir."""
    base, logdir = server
    newest = logdir / "zz_newest"
    shutil.copytree(os.path.join(SAMPLES, "comm", "record"), newest)
    future = time.time() + 3600
    for f in newest.iterdir():
        os.utime(f, (future, future))
    deadline = time.time() + 60
    while time.time() < deadline:
        _, body = get(base, "/data/plugin/gpuscope/runs")
        if body["runs"] and body["runs"][0]["run"] == "zz_newest":
            break
        time.sleep(1)
    assert body["runs"][0]["run"] == "zz_newest", body["runs"][:3]


def test_without_plotly_every_view_gives_the_clis_one_line_hint(tmp_path, monkeypatch, capsys):
    """Installed without its optional plotly (`pip install gpuscope`), the tab's report and its
    plotly.js route answer with the same one-line hint the CLI gives, never a 500: plotly is
    hidden from the import system here, as a machine without it has it."""
    import importlib.util
    from types import SimpleNamespace

    from werkzeug.test import Client

    from gpuscope import cli
    from gpuscope.integrations.tensorboard.plugin import GpuscopePlugin, RunIndex

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == "plotly"
                        else real(name, *a, **k))
    shutil.copytree(os.path.join(SAMPLES, "comm", "record"), tmp_path / "run")
    index = RunIndex(str(tmp_path))
    body = index.report("run")
    assert body["error"] == ("the TensorBoard tab needs plotly: pip install "
                             "'gpuscope[tensorboard]', then reload this page")
    plugin = GpuscopePlugin(SimpleNamespace(logdir=str(tmp_path)))
    r = Client(plugin.get_plugin_apps()["/plotly.min.js"]).get("/plotly.min.js")
    assert r.status_code == 503 and "pip install 'gpuscope[tensorboard]'" in r.get_json()["error"]
    assert cli.main(["analyze", str(tmp_path / "run"), "--html", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "the HTML dashboard needs plotly: pip install 'gpuscope[html]'" in err
    # installed while TensorBoard runs: the same index answers with the report on reload
    monkeypatch.setattr(importlib.util, "find_spec", real)
    body = index.report("run")
    assert "error" not in body and body["report"]["verdict"]
