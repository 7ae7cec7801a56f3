"""A 2-rank run killed with SIGKILL mid-way still analyzes, with a warning about the cut."""

import os
import signal
import subprocess
import sys
import time

import pytest

import gpuscope
from gpuscope.doctor import free_port
from gpuscope.run_format import rank_file_name
from gpuscope.vocab import LABELS


def _rows(path):
    try:
        with open(path) as fh:
            return sum(1 for line in fh if line.startswith("["))
    except FileNotFoundError:
        return 0



@pytest.mark.slow
def test_sigkill_mid_run_keeps_completed_steps(tmp_path):
    """Both ranks are started by hand in one process group (torchrun would put its workers
    out of reach of the signal) and killed together with SIGKILL."""
    run_dir = tmp_path / "run"
    port = str(free_port())
    procs = []
    try:
        for rank in (0, 1):
            env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
            group = {"process_group": 0 if rank == 0 else procs[0].pid}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gpuscope.demo.train", "--scenario", "compute",
                 "--steps", "2000", "--run-dir", str(run_dir)], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **group))
        deadline = time.time() + 120
        while time.time() < deadline:
            if all(_rows(run_dir / rank_file_name(r)) >= 40 for r in (0, 1)):
                break
            assert all(p.poll() is None for p in procs), "training ended before it was killed"
            time.sleep(0.2)
        else:
            raise AssertionError("no steps recorded in time")
    finally:
        os.killpg(procs[0].pid, signal.SIGKILL)  # both ranks at once, no chance to clean up
        for p in procs:
            p.wait(timeout=30)
    assert all(p.returncode == -signal.SIGKILL for p in procs)
    rep = gpuscope.analyze(run_dir)
    d = rep.to_dict()
    assert d["ranks_analysed"] == 2 and d["steps_analysed"] >= 39
    assert d["verdict"] in LABELS
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
