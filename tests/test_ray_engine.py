"""`--engine ray`: each file read by a task on a real local Ray cluster (`ray start --head` on
127.0.0.1, reached through RAY_ADDRESS as users reach theirs); the report is the local engine's,
for run dirs, trace folders (a damaged file among them), fsspec URLs and the corpus traces."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

import gpuscope

ray = pytest.importorskip("ray")
ROOT = os.path.join(os.path.dirname(__file__), "..")
SAMPLES = os.path.join(ROOT, "sample_traces")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    port = _port()
    # a cluster on 127.0.0.1 for this test alone: no token (Ray 2.5x turns token authentication
    # on by default; the driver here and the cluster would otherwise need to share one)
    auth = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env = dict(os.environ, **auth)
    start = subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
                            str(port), "--num-cpus", "2", "--include-dashboard", "false",
                            "--disable-usage-stats"], env=env, capture_output=True, text=True,
                           timeout=180)
    assert start.returncode == 0, start.stderr[-2000:]
    address = f"127.0.0.1:{port}"
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_ADDRESS", address)
    for k, v in auth.items():
        mp.setenv(k, v)
    try:
        yield address
    finally:
        mp.undo()
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _same(path, url=None):
    local = gpuscope.analyze(path).to_dict()
    remote = gpuscope.analyze(url or path, engine="ray").to_dict()
    assert ray.is_initialized() is False  # the engine leaves no connection behind
    if url:
        assert remote.pop("path") == url
        local.pop("path")
    assert remote == local
    return remote


def test_a_run_dir_and_a_trace_folder_give_the_local_report(ray_cluster):
    rep = _same(os.path.join(SAMPLES, "imbalanced", "record"))
    assert rep["stragglers"] == [1]
    _same(os.path.join(SAMPLES, "comm", "kineto"))


def test_a_damaged_file_is_skipped_with_the_local_warning(ray_cluster, tmp_path):
    folder = tmp_path / "traces"
    shutil.copytree(os.path.join(SAMPLES, "data", "kineto"), folder)
    (folder / "rank9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts":')
    rep = _same(str(folder))
    assert any(w.startswith("skipped: ") and "rank9.pt.trace.json" in w for w in rep["warnings"])
    (tmp_path / "one").mkdir()
    shutil.copy(folder / "rank9.pt.trace.json", tmp_path / "one")
    with pytest.raises(gpuscope.TraceFormatError):
        gpuscope.analyze(str(tmp_path / "one"), engine="ray")


def test_fsspec_urls_are_read_where_the_tasks_run(ray_cluster):
    for rel in (("data", "record"), ("imbalanced", "kineto")):
        path = os.path.abspath(os.path.join(SAMPLES, *rel))
        _same(path, "file://" + path)


def test_the_corpus_traces_give_the_local_reports(ray_cluster):
    base = os.path.join(SAMPLES, "external")
    names = sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)))
    assert len(names) >= 9
    for name in names:
        _same(os.path.join(base, name))


def test_the_command_line_takes_the_engine(ray_cluster, tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze",
                          os.path.join(SAMPLES, "data", "record"), "--engine", "ray", "--json",
                          "-"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))  # RAY_ADDRESS: the fixture's cluster
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["verdict"] == "data-bound"
