"""The CLI: reports, JSON keys, and one clear line with exit 2 on bad input."""

import json
import subprocess
import sys

import pytest

import gpuscope
from gpuscope.vocab import LABELS


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "gpuscope", *args], capture_output=True, text=True)


@pytest.fixture
def small_run(tmp_path):
    with gpuscope.record(tmp_path / "run") as rec:
        for _ in rec.data(range(5)):
            rec.step()
    return tmp_path / "run"


def test_json_report_has_the_design_keys(small_run, tmp_path):
    out = run_cli("analyze", str(small_run), "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    assert "Verdict:" in out.stdout
    d = json.loads((tmp_path / "r.json").read_text())
    for key in ("schema", "source", "world_size", "verdict", "stragglers", "steps", "ranks",
                "suggestions", "warnings"):
        assert key in d
    assert d["schema"] == "gpuscope.report/1" and d["source"] == "record"
    assert d["verdict"] in LABELS
    assert {"step", "label", "step_ms"} <= set(d["steps"][0])
    assert {"rank", "data_pct", "compute_pct", "comm_exposed_pct", "wait_pct"} <= set(d["ranks"][0])


def _bad(path, match):
    out = run_cli("analyze", str(path))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuscope: error:")
    assert match in lines[0]


def test_missing_path(tmp_path):
    _bad(tmp_path / "nope", "no such file")


def test_empty_dir(tmp_path):
    _bad(tmp_path, "neither a gpuscope run dir")


def test_empty_record_file(tmp_path):
    (tmp_path / "rank-00000.gpuscope.jsonl").write_text("")
    _bad(tmp_path, "empty record file")


def test_corrupt_header(tmp_path):
    (tmp_path / "rank-00000.gpuscope.jsonl").write_text("{garbage\n[1,2]\n")
    _bad(tmp_path, "not a gpuscope header")


def test_run_with_no_steps(tmp_path):
    with gpuscope.record(tmp_path):
        pass
    _bad(tmp_path, "no steps")


def test_bad_threshold(small_run):
    out = run_cli("analyze", str(small_run), "--thresholds", "nonsense=1")
    assert out.returncode == 2 and "unknown threshold" in out.stderr


def test_terminal_table_shows_ms_beside_shares_only_when_they_fit():
    import os

    from gpuscope.render.terminal import render as render_text

    rep = gpuscope.analyze(os.path.join(os.path.dirname(__file__), "..", "sample_traces",
                                        "imbalanced", "record"))
    narrow, wide = render_text(rep, width=70), render_text(rep, width=140)
    assert "share of step time per part; step: mean ms" in narrow
    assert "mean ms per step and share of step time" in wide
    for text in (narrow, wide):
        assert "Verdict: IMBALANCED" in text and "Straggler:" in text
        assert "…" not in text  # nothing cut off


def test_one_unreadable_rank_file_is_skipped_and_the_rest_analysed(tmp_path):
    import os

    from gpuscope.readers import read_path as load_table

    with gpuscope.record(tmp_path / "run") as rec:
        for _ in rec.data(range(5)):
            rec.step()
    (tmp_path / "run" / "rank-00001.gpuscope.jsonl").write_text("{garbage\n[1,2]\n")
    table = load_table(str(tmp_path / "run"))
    assert sorted(table.ranks) == [0] and len(table.frame) == 5
    assert any(w.startswith("skipped:") and "rank-00001" in w for w in table.warnings)
    os.remove(tmp_path / "run" / "rank-00000.gpuscope.jsonl")
    (tmp_path / "run" / "rank-00002.gpuscope.jsonl").write_text("")
    _bad(tmp_path / "run", "no readable record file")


@pytest.mark.parametrize("spec,match", [("wait=abc", "must be a number"),
                                        ("wait=2", "between 0 and 1"),
                                        ("wait", "name=value"),
                                        ("warmup_steps=-1", "whole number")])
def test_bad_threshold_value_is_bad_input(small_run, spec, match):
    out = run_cli("analyze", str(small_run), "--thresholds", spec)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in out.stderr


def test_files_are_written_when_stdout_is_closed_early(small_run, tmp_path):
    """`gpuscope analyze DIR --json r.json | head -1`: the reader stops reading at once."""
    out = subprocess.run(["bash", "-c", "set -o pipefail; "
                          f"{sys.executable} -m gpuscope analyze {small_run} --json "
                          f"{tmp_path / 'r.json'} --html {tmp_path / 'r.html'} | head -c 1"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == "gpuscope.report/1"
    assert (tmp_path / "r.html").stat().st_size > 0


def test_skip_applies_to_records_and_to_profiler_traces():
    import os

    base = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "compute")
    rec = gpuscope.analyze(os.path.join(base, "record"), skip=3).to_dict()
    assert rec["thresholds"]["warmup_steps"] == 3
    assert min(s["step"] for s in rec["steps"]) == 3
    traces = os.path.join(base, "kineto")
    all_steps = gpuscope.analyze(traces).to_dict()
    assert all_steps["thresholds"]["warmup_steps"] == 0  # a profiler schedule skipped warm-up
    skipped = gpuscope.analyze(traces, skip=2).to_dict()
    assert skipped["steps_analysed"] == all_steps["steps_analysed"] - 2
    assert skipped["thresholds"]["warmup_steps"] == 2
    out = run_cli("analyze", traces, "--skip", "2", "-q", "--json", "/dev/stdout")
    assert json.loads(out.stdout)["steps_analysed"] == skipped["steps_analysed"]


def test_the_command_leaves_fast_with_everything_delivered(tmp_path):
    """`gpuscope` skips the interpreter's clean-up on its way out (cli.entry): what it printed
    to a pipe, wrote to files and the exit code all arrive; no process is left behind."""
    import os

    traces = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "imbalanced",
                          "kineto")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as usual
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", traces, "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpuscope kineto") and "Verdict:" in out.stdout
    assert out.stdout.endswith(f"JSON report: {tmp_path / 'r.json'}\n")  # the last print
    assert json.loads((tmp_path / "r.json").read_text())["ranks_analysed"] == 2
    bad = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(tmp_path / "missing")],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("gpuscope: error:")


def test_version_json_to_stdout_and_commands_a_fresh_shell_runs(tmp_path, monkeypatch):
    """`--version`; `--json -` writes the JSON report to stdout (no file named '-'); the commands
    the demo prints run in a fresh shell: a venv's tools by their path when the shell would not
    find them."""
    import json as js
    import os
    import subprocess
    import sys

    from gpuscope.cli import command

    out = subprocess.run([sys.executable, "-m", "gpuscope", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.startswith("gpuscope ")
    monkeypatch.chdir(tmp_path)
    sample = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "data", "record")
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", sample, "--json", "-"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and js.loads(out.stdout)["verdict"] == "data-bound"
    assert not (tmp_path / "-").exists()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a fresh shell: the venv not activated
    here = os.path.join(os.path.dirname(sys.executable), "gpuscope")
    if os.path.exists(here):
        got = command("gpuscope")
        assert got != "gpuscope" and os.path.realpath(got) == os.path.realpath(here)


@pytest.mark.slow
def test_the_demo_trains_from_a_folder_holding_a_gpuscope_folder(tmp_path):
    """From the clone's parent folder (which holds a folder named gpuscope) the demo's training
    imported that folder as the package: 'module gpuscope has no attribute record' on every
    rank. torchrun now runs train.py by its path."""
    import os
    import subprocess
    import sys

    from gpuscope.demo.launch import torchrun_cmd

    (tmp_path / "gpuscope").mkdir()  # a clone named gpuscope, seen from its parent
    cmd = torchrun_cmd(1, "--scenario", "compute", "--steps", "3", "--run-dir",
                       str(tmp_path / "run"), "--batch-size", "64")
    assert "-m" not in cmd[cmd.index("--nproc_per_node=1"):]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(f.endswith(".gpuscope.jsonl") for f in os.listdir(tmp_path / "run"))
