"""`gpuscope demo`: launch the scenario under torchrun, then analyze and report what it recorded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def torchrun_cmd(nproc: int, *train_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "-m", "gpuscope.demo.train", *train_args]


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


def run_demo(scenario: str, out: str, steps: int = 30, nproc: int = 2, profile: bool = True) -> int:
    from .. import cli

    record_dir = os.path.join(out, "record")
    trace_dir = os.path.join(out, "kineto") if profile else None
    for d in (record_dir, trace_dir):
        if d and os.path.isdir(d):
            shutil.rmtree(d)
    print(f"gpuscope demo: {nproc}-process DDP (gloo, CPU), scenario '{scenario}', {steps} steps ...",
          flush=True)
    try:
        run_training(scenario, record_dir, steps, nproc, trace_dir, extra=("--tensorboard",))
    except subprocess.CalledProcessError as exc:
        print(exc.stderr[-3000:], file=sys.stderr)
        print(f"gpuscope demo: training failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    rc = cli.main(["analyze", record_dir, "--json", os.path.join(out, "report.json"),
                   "--html", os.path.join(out, "report.html")])
    if rc == 0 and trace_dir:
        print(f"\nThe same run as torch.profiler traces: gpuscope analyze {trace_dir}\n"
              f"In TensorBoard (gpuscope tab + Scalars): tensorboard --logdir {out}")
    return rc
