"""A 2-rank run killed with SIGKILL mid-way still analyzes, with a warning about the cut."""

import os
import signal
import subprocess
import sys
import time

import gpuscope
from gpuscope.demo.launch import torchrun_cmd
from gpuscope.record_format import rank_file_name


def _rows(path):
    try:
        with open(path) as fh:
            return sum(1 for line in fh if line.startswith("["))
    except FileNotFoundError:
        return 0


def test_sigkill_mid_run_keeps_completed_steps(tmp_path):
    run_dir = tmp_path / "run"
    cmd = torchrun_cmd(2, "--scenario", "compute", "--steps", "2000", "--run-dir", str(run_dir))
    proc = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if all(_rows(run_dir / rank_file_name(r)) >= 40 for r in (0, 1)):
                break
            assert proc.poll() is None, "training ended before it could be killed"
            time.sleep(0.2)
        else:
            raise AssertionError("no steps recorded in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, no chance to clean up
        proc.wait(timeout=30)
    rep = gpuscope.analyze(run_dir)
    d = rep.to_dict()
    assert d["ranks_analysed"] == 2 and d["steps_analysed"] >= 39
    assert d["verdict"] in ("compute-bound", "imbalanced", "comm-bound", "data-bound")
    cut = [w for w in d["warnings"] if "no end record" in w]
    assert len(cut) == 2, d["warnings"]


def test_cli_reports_the_cut(tmp_path):
    # a half-written last line (killed during a write) is dropped with a warning
    run_dir = tmp_path / "run"
    with gpuscope.record(run_dir) as rec:
        for _ in rec.data(range(6)):
            rec.step()
    path = run_dir / rank_file_name(0)
    lines = path.read_text().splitlines()[:-1]  # drop the end record
    path.write_text("\n".join(lines) + "\n" + '[99,1,2,3')
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(run_dir)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "cut mid-write" in out.stdout and "no end record" in out.stdout
