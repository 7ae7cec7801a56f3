"""An analysis-only install: gpuscope reads run dirs and traces and draws its dashboard with no
torch installed (issue 71, 1.), and what needs torch says so.

The environment is real: a fresh venv that sees this venv's packages except torch (links to
each of them, torch's left out), so `import torch` fails there as on a machine without it."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SAMPLES = os.path.join(ROOT, "sample_traces")
TORCH = ("torch", "functorch", "torchgen")


def _without_torch(tmp) -> str:
    """A venv's python whose packages are this one's less torch."""
    import site
    import venv

    here = next(p for p in site.getsitepackages() if os.path.isdir(p))
    links = os.path.join(tmp, "site")
    os.makedirs(links)
    for name in os.listdir(here):
        if name.split("-")[0] in TORCH or name.startswith("torch-"):
            continue
        os.symlink(os.path.join(here, name), os.path.join(links, name))
    env_dir = os.path.join(tmp, "venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    py = os.path.join(env_dir, "bin", "python")
    target = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(target, "_links.pth"), "w") as fh:  # its .pth files run too
        fh.write(f"import site; site.addsitedir({links!r})\n")
    return py


def _run(py, *args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([py, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_runs_and_traces_are_read_and_drawn_without_torch(tmp_path):
    py = _without_torch(str(tmp_path))
    got = _run(py, "-c", "import torch")
    assert got.returncode != 0 and "No module named 'torch'" in got.stderr
    html, js = tmp_path / "r.html", tmp_path / "r.json"
    for path in ("comm/record", "comm/kineto"):
        got = _run(py, "-m", "gpuscope", "analyze", os.path.join(SAMPLES, path), "--html",
                   str(html), "--json", str(js))
        assert got.returncode == 0, got.stderr[-2000:]
        assert "Verdict: COMM-BOUND" in got.stdout and html.stat().st_size > 10_000
    # what needs torch says so, and no traceback
    got = _run(py, "-m", "gpuscope", "doctor", "--no-smoke")
    assert got.returncode == 1 and "torch" in got.stdout and "not installed" in got.stdout
    got = _run(py, "-m", "gpuscope", "demo", "--out", str(tmp_path / "demo"))
    assert got.returncode == 2 and "needs torch: pip install torch" in got.stderr
    assert "Traceback" not in got.stderr
    code = ("import gpuscope, time\n"
            f"with gpuscope.record({str(tmp_path / 'run')!r}) as rec:\n"
            "    for _ in rec.data(iter(range(12))):\n"
            "        time.sleep(0.002)\n"
            "        rec.step()\n")
    got = _run(py, "-c", code)
    assert got.returncode == 0 and "gpuscope.record needs torch" in got.stderr, got.stderr
    got = _run(py, "-m", "gpuscope", "analyze", str(tmp_path / "run"))
    assert got.returncode == 0 and "Verdict:" in got.stdout, got.stderr[-2000:]
