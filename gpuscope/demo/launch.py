"""`gpuscope demo`: launch a scenario under torchrun, then analyze what it recorded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..errors import GpuscopeError
from ..record.options import RUN_DIR_ENV, stop_after


def torchrun_cmd(nproc: int, *train_args: str) -> list[str]:
    """torchrun running train.py by its path, not as `-m gpuscope.demo.train`: a module run puts
    the working folder first on sys.path, and from the clone's parent folder (a folder named
    gpuscope) `import gpuscope` then found the clone, not the package."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", script, *train_args]


def run_training(scenario: str, run_dir: str, steps: int = 30, nproc: int = 2,
                 profile_dir: str | None = None, extra: tuple = (), timeout: float = 300) -> None:
    """Run one scenario to completion; raises CalledProcessError with its output on failure."""
    args = ["--scenario", scenario, "--run-dir", run_dir, "--steps", str(steps), *extra]
    if profile_dir:
        args += ["--profile", profile_dir]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(torchrun_cmd(nproc, *args), env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)


class DemoFailed(GpuscopeError):
    """The demo's training run did not finish."""


@dataclass
class DemoResult:
    """What `run_demo` made."""

    report: object              # gpuscope.Report of the recorded run
    record_dir: str
    trace_dir: str | None       # the same run as torch.profiler traces
    json_path: str
    html_path: str
    out: str


def run_demo(scenario: str, out: str, steps: int = 30, nproc: int = 2,
             profile: bool = True, extra: tuple = ()) -> DemoResult:
    """Train the scenario (recorded, and profiled when `profile`), analyze the record, and write
    report.json and report.html into `out`. Raises DemoFailed with the training's output."""
    from .. import analyze

    # a `gpuscope try` trial of the demo records where the trial says (trials.py), and trains
    # until the trial ends it (its micro-steps may be more than the demo's own: a whole epoch)
    record_dir = os.environ.get(RUN_DIR_ENV) or os.path.join(out, "record")
    steps = max(steps, stop_after() or 0)
    trace_dir = os.path.join(out, "kineto") if profile else None
    for d in (record_dir, trace_dir):
        if d and os.path.isdir(d):
            shutil.rmtree(d)
    try:
        run_training(scenario, record_dir, steps, nproc, trace_dir,
                     extra=("--tensorboard", *extra))
    except subprocess.CalledProcessError as exc:
        raise DemoFailed(f"training failed (exit {exc.returncode}):\n{exc.stderr[-3000:]}") \
            from None
    report = analyze(record_dir)
    result = DemoResult(report, record_dir, trace_dir, os.path.join(out, "report.json"),
                        os.path.join(out, "report.html"), out)
    report.write_json(result.json_path)
    report.write_html(result.html_path)
    return result
