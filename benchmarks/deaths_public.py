"""Deaths and hangs on training programs we did not write: pytorch/examples' DDP tutorial
(distributed/ddp-tutorial-series/multigpu_torchrun.py, BSD-3) and its FSDP2 example
(distributed/FSDP2/example.py), fetched at a pinned commit, run on CPU with gloo under torchrun
as a user would with gpuscope, a fault injected at a known rank and step. The truth is the
program's own side: the fault's own log line ("FAULT rank R step S how at T", printed by the
injected hook as it fires) and torchrun's failure summary; the job's duration and how long it
took to end after a SIGTERM are timed from outside. Writes benchmarks/results/deaths_public.json.

What changes in each program (each edit is checked to apply exactly once, so a changed upstream
fails loudly):
- CPU: gloo instead of NCCL, no device placement, DDP without device_ids; the FSDP2 example's
  GPU count check skipped, its step count and depth from the environment;
- gpuscope: the DDP tutorial's training loop inside `with gpuscope.record(...)`, the FSDP2
  example's by `rec.start()` / `rec.stop()` around its top-level loop, batches and steps told;
- the fault hook at the top of each step (GPUSCOPE_FAULT="how,rank,step"): kill (SIGKILL), raise,
  block (sleep for ever in Python), extra (an all_reduce of [1] the others do not make);
- the process group's timeout from PG_TIMEOUT_S.

    python benchmarks/deaths_public.py [--only ddp_tutorial] [--scenarios raise,kill]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
COMMIT = "77f55b9"
MIRROR = os.environ.get("EXAMPLES_GIT", "/work/.mirror/pytorch+examples/repo")

HOOK = '''
def _gpuscope_fault(step):
    """The injected fault (benchmarks/deaths_public.py): GPUSCOPE_FAULT=how,rank,step."""
    import os, signal, sys, time
    import torch, torch.distributed as dist
    how, rank, at = (os.environ.get("GPUSCOPE_FAULT", "none,-1,-1").split(",") + ["", ""])[:3]
    if dist.get_rank() != int(rank) or step != int(at):
        return
    print(f"FAULT rank {rank} step {step} {how} at {time.time():.3f}", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "raise":
        raise RuntimeError(f"injected failure at step {step}")
    if how == "block":
        while True:
            time.sleep(3600)
    if how == "extra":
        dist.all_reduce(torch.ones(1))

'''

PROGRAMS = {
    "ddp_tutorial": {
        "dir": "distributed/ddp-tutorial-series",
        "files": ("multigpu_torchrun.py", "datautils.py"),
        "main": "multigpu_torchrun.py",
        "args": ["40", "100", "--batch_size", "16"],
        "edits": (
            ("import os\n", "import os\nimport datetime\nimport gpuscope\n" + HOOK),
            ('    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n'
             '    init_process_group(backend="nccl")\n',
             '    init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=float('
             'os.environ.get("PG_TIMEOUT_S", "1800"))))\n'),
            ("        self.model = model.to(self.gpu_id)\n", "        self.model = model\n"),
            ("        self.model = DDP(self.model, device_ids=[self.gpu_id])\n",
             "        self.model = DDP(self.model)\n        self.step = 0\n"),
            ("    def _run_batch(self, source, targets):\n",
             "    def _run_batch(self, source, targets):\n        _gpuscope_fault(self.step)\n"),
            ("        for source, targets in self.train_data:\n"
             "            source = source.to(self.gpu_id)\n"
             "            targets = targets.to(self.gpu_id)\n"
             "            self._run_batch(source, targets)\n",
             "        for source, targets in self.rec.data(self.train_data):\n"
             "            self._run_batch(source, targets)\n"
             "            self.rec.step()\n            self.step += 1\n"),
            ("    def train(self, max_epochs: int):\n"
             "        for epoch in range(self.epochs_run, max_epochs):\n"
             "            self._run_epoch(epoch)\n",
             "    def train(self, max_epochs: int):\n"
             "      with gpuscope.record(os.environ['GPUSCOPE_RUN_DIR'], model=self.model) as "
             "self.rec:\n"
             "        for epoch in range(self.epochs_run, max_epochs):\n"
             "            self._run_epoch(epoch)\n"),
        ),
    },
    "fsdp2_example": {
        "dir": "distributed/FSDP2",
        "files": ("example.py", "model.py", "checkpoint.py", "utils.py"),
        "main": "example.py",
        "args": [],
        "edits": (
            ("import os\n", "import os\nimport datetime\nimport gpuscope\n" + HOOK),
            ("    if not verify_min_gpu_count(min_gpus=_min_gpu_count):\n",
             "    if False:\n"),
            ("    torch.distributed.init_process_group(backend=backend, device_id=device)\n",
             "    torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta("
             "seconds=float(os.environ.get('PG_TIMEOUT_S', '1800'))))\n"),
            ("        n_layers=10,\n", "        n_layers=2,\n"),
            ("    for _ in range(10):\n",
             "    rec = gpuscope.record(os.environ['GPUSCOPE_RUN_DIR'], model=model)\n"
             "    rec.start()\n"
             "    for _step in range(int(os.environ.get('STEPS', '60'))):\n"
             "        _gpuscope_fault(_step)\n"),
            ("        optim.zero_grad()\n", "        optim.zero_grad()\n        rec.step()\n"
                                          "    rec.stop()\n"),
        ),
    },
}

#: scenario: (fault how, rank, step, SIGTERM after s or None, PG timeout s, what the truth is:
#: the rank died in the step; it stalled the job there; or a mismatch, the rank the odd one out)
SCENARIOS = {
    "raise": ("raise", 1, 25, None, 1800, "died"),
    "kill": ("kill", 2, 25, None, 1800, "died"),
    "timeout": ("block", 2, 25, None, 12, "stalled"),
    "term_blocked": ("block", 2, 25, 25, 1800, "stalled"),
    "extra": ("extra", 0, 25, 25, 1800, "mismatch"),
}


def fetch(program: str, dest: str) -> None:
    p = PROGRAMS[program]
    for name in p["files"]:
        text = subprocess.run(["git", "-C", MIRROR, "show", f"{COMMIT}:{p['dir']}/{name}"],
                              capture_output=True, text=True, check=True).stdout
        if name == p["main"]:
            for old, new in p["edits"]:
                if text.count(old) != 1:
                    raise SystemExit(f"{program}: an edit does not apply once: {old[:60]!r}")
                text = text.replace(old, new)
        with open(os.path.join(dest, name), "w") as fh:
            fh.write(text)


def run(program: str, scenario: str, work: str) -> dict:
    how, rank, at, term, timeout, kind = SCENARIOS[scenario]
    src = os.path.join(work, program)
    run_dir = os.path.join(work, f"{program}-{scenario}")
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, GPUSCOPE_RUN_DIR=run_dir, GPUSCOPE_FAULT=f"{how},{rank},{at}",
               PG_TIMEOUT_S=str(timeout), OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "4", PROGRAMS[program]["main"], *PROGRAMS[program]["args"]]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    termed = None
    if term:
        try:
            p.wait(term)
        except subprocess.TimeoutExpired:
            termed = time.monotonic()
            p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=300)
    ended = time.monotonic()
    fault = re.search(r"FAULT rank (\d+) step (\d+) (\w+) at ([\d.]+)", out)
    rep = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", run_dir, "--json", "-"],
                         capture_output=True, text=True, env=env)
    d = json.loads(rep.stdout) if rep.returncode == 0 else {}
    died, stall = (d.get("died") or [None])[0], d.get("stall") or {}
    said = {"died": {"rank": died["rank"], "step": died["step"], "cause": died["cause"],
                     "text": died["text"]} if died else None,
            "stall": {"blamed": stall.get("blamed"), "step": stall.get("step"),
                      "text": stall.get("text")} if stall.get("text") else None}
    if kind == "died":
        right = bool(died) and died["rank"] == rank and died["step"] == at
    elif kind == "mismatch":  # told as the mismatch, the rank the odd one out, hung or aborted
        right = (bool(died) and died["rank"] == rank and died["step"] == at
                 and "mismatched collectives" in died["text"]) or (
            stall.get("odd_ones") == [rank] and stall.get("step") == at)
    else:
        right = bool(stall.get("text")) and stall.get("blamed") == [rank] and \
            stall.get("step") == at
    return {"program": program, "scenario": scenario, "fault": {"how": how, "rank": rank,
                                                                "step": at},
            "fault_logged": bool(fault), "job_s": round(ended - t0, 1),
            "after_term_s": round(ended - termed, 1) if termed else None,
            "exit": p.returncode, "right": right, "report": said,
            "first_line": next((x for x in (d and _first_line(run_dir, env)).splitlines()
                                if x.startswith("THE RUN")), None) if d else None}


def _first_line(run_dir: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", run_dir], env=env,
                         capture_output=True, text=True)
    return " ".join(out.stdout.split("\n")[1:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(PROGRAMS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "deaths-public"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rows = []
    for program in args.only.split(","):
        os.makedirs(os.path.join(args.work, program), exist_ok=True)
        fetch(program, os.path.join(args.work, program))
        for scenario in args.scenarios.split(","):
            rows.append(run(program, scenario, args.work))
            r = rows[-1]
            print(f"{program} {scenario}: {'right' if r['right'] else 'WRONG'} "
                  f"({r['job_s']} s) {r['first_line']}", flush=True)
    from measured import commit

    out = {"commit": commit(), "examples_commit": COMMIT, "cpu_count": os.cpu_count(),
           "rows": rows, "right": sum(r["right"] for r in rows), "of": len(rows)}
    with open(os.path.join(HERE, "results", "deaths_public.json"), "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"{out['right']} of {out['of']} right")


if __name__ == "__main__":
    main()
