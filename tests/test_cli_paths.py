"""CLI paths end to end (real subprocesses): -q, --html, scaling on valid runs, bad Kineto
input, the internal-error exit 1, and the demo."""

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
SAMPLES = os.path.join(HERE, "..", "sample_traces")


def cli(*args, env=None, code=None):
    cmd = [sys.executable, "-m", "gpuscope", *args] if code is None else \
        [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def test_quiet_prints_nothing_and_html_is_a_dashboard(tmp_path):
    run = os.path.join(SAMPLES, "imbalanced", "record")
    loud = cli("analyze", run)
    assert loud.returncode == 0 and "IMBALANCED" in loud.stdout.upper()
    quiet = cli("analyze", run, "-q", "--html", str(tmp_path / "d.html"))
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    html = (tmp_path / "d.html").read_text()
    assert "<html" in html and "panel-heatmap" in html and "imbalanced" in html


def _one_rank_world(src, dst):
    """rank 0 of a 2-rank run alone, as the run of a 1-rank world (same per-rank batch)."""
    os.makedirs(dst)
    lines = open(os.path.join(src, "rank-00000.gpuscope.jsonl")).read().split("\n")
    head = json.loads(lines[0])
    head["world_size"] = 1
    head["knobs"]["world_size"] = 1
    lines[0] = json.dumps(head)
    open(os.path.join(dst, "rank-00000.gpuscope.jsonl"), "w").write("\n".join(lines))


def test_scaling_on_two_world_sizes(tmp_path):
    two = os.path.join(SAMPLES, "comm", "record")
    _one_rank_world(two, tmp_path / "one")
    out = cli("scaling", str(tmp_path / "one"), two, "--json", str(tmp_path / "s.json"))
    assert out.returncode == 0, out.stderr
    table = json.loads((tmp_path / "s.json").read_text())
    one, two_ = table["points"]
    assert [one["world_size"], two_["world_size"]] == [1, 2]
    assert two_["efficiency"] == pytest.approx(two_["throughput"] / (2 * one["throughput"]),
                                               abs=0.01)
    assert table["why"] in out.stdout


def test_bad_kineto_input_through_the_cli(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rank-0.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts":')
    out = cli("analyze", str(tmp_path / "bad"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("gpuscope: error:") and len(out.stderr.splitlines()) == 1
    # one damaged file among good ones: analysed, and said
    mixed = tmp_path / "mixed"
    shutil.copytree(os.path.join(SAMPLES, "compute", "kineto"), mixed)
    name = sorted(os.listdir(mixed))[0]
    (mixed / name).write_bytes((mixed / name).read_bytes()[:5000])
    out = cli("analyze", str(mixed))
    assert out.returncode == 0, out.stderr
    assert name in out.stdout and ("event by event" in out.stdout or "skipped" in out.stdout)


BOOM = """
import sys
import importlib
p = importlib.import_module("gpuscope.analyze.run")
from gpuscope import cli

def boom(*a, **k):
    raise RuntimeError("boom")

p.analyze_table = boom
sys.exit(cli.main(["analyze", sys.argv[1]]))
"""


def test_an_internal_error_is_exit_1_and_one_line():
    run = os.path.join(SAMPLES, "comm", "record")
    out = cli(run, code=BOOM)
    assert out.returncode == 1
    assert out.stderr.strip() == ("gpuscope: internal error: RuntimeError('boom') (set "
                                  "GPUSCOPE_DEBUG=1 for the traceback)")
    debug = cli(run, code=BOOM, env={"GPUSCOPE_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr


@pytest.mark.slow
def test_demo_runs_records_analyses_and_writes_the_dashboard(tmp_path):
    out = cli("demo", "--scenario", "imbalanced", "--steps", "12", "--no-profile",
              "--out", str(tmp_path / "demo"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "JSON report:" in out.stdout and "HTML dashboard:" in out.stdout
    report = json.loads(next((tmp_path / "demo").rglob("*.json")).read_text())
    assert report["schema"] == "gpuscope.report/1" and report["ranks_analysed"] == 2
    assert next((tmp_path / "demo").rglob("*.html")).stat().st_size > 10_000


def test_a_folder_holding_inputs_names_them(tmp_path):
    """The demo's output folder given whole (record/ beside report.json): the error names the
    run dir inside and the command for it; with traces beside the record, the traces are read
    and the report says the record is there too."""
    import shutil

    from gpuscope.errors import InputError
    from gpuscope.readers import read_path

    out = tmp_path / "demo"
    shutil.copytree(os.path.join(SAMPLES, "comm", "record"), out / "record")
    (out / "report.json").write_text("{}")
    with pytest.raises(InputError) as e:
        read_path(out)
    assert f"gpuscope analyze {out / 'record'}" in str(e.value)
    shutil.copytree(os.path.join(SAMPLES, "comm", "kineto"), out / "kineto")
    table = read_path(out)
    assert table.source == "kineto"
    assert any(f"`gpuscope analyze {out / 'record'}` reads the record" in w
               for w in table.warnings)
