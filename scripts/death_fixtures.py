"""Record the death and hang cases of tests/test_deaths.py: real torchrun runs of
tests/workloads/deaths.py (gloo, CPU), each ended as a scheduler or a fault ends a job, copied into
tests/fixtures/deaths/<case>/ with each rank's own log (<case>.log: "rank R step S at T" lines,
the truth the tests check the report against).

    python scripts/death_fixtures.py [--only killed_before_flush,...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "deaths")

#: case: (ranks, SIGTERM to the launcher after this many seconds or None, the workload's args)
CASES = {
    # rank 2 SIGKILLed at step 40, before its first rows were written (its file: a header)
    "killed_before_flush": (4, None, ["--how", "kill", "--rank", "2", "--at", "40"]),
    # the same with 2 ranks: the survivor's data alone
    "one_rank_left": (2, None, ["--how", "kill", "--rank", "1", "--at", "40"]),
    # rank 2 raises at step 30 with rec.start() / rec.stop() around the loop
    "raised_start_form": (4, None, ["--how", "raise", "--rank", "2", "--at", "30", "--form",
                                    "start"]),
    # rank 2 blocks in Python at step 20; the stall watcher writes at 3 s; the process group's
    # 12 s timeout ends the others
    "timeout_after_stall": (4, None, ["--how", "block", "--rank", "2", "--at", "20",
                                      "--timeout-s", "12", "--stall-s", "3"]),
    # rank 2 blocks at step 20; the launcher's SIGTERM comes before the default stall bound
    "sigterm_while_blocked": (4, 12, ["--how", "block", "--rank", "2", "--at", "20",
                                     "--stall-s", "60"]),
    # rank 1 calls an all_gather rank 0 never does; SIGTERM before the stall bound
    "mismatch_at_sigterm": (2, 12, ["--how", "gather", "--rank", "1", "--at", "25",
                                    "--stall-s", "60"]),
    # rank 0 adds an all_reduce of [1] where rank 1 goes into DDP's buffer broadcast
    "extra_collective": (2, 12, ["--how", "extra", "--rank", "0", "--at", "20", "--stall-s",
                                 "3"]),
    # rank 0 aborted (SIGABRT) in its extra all_reduce
    "aborted_in_odd_collective": (4, None, ["--how", "abort", "--rank", "0", "--at", "20"]),
}


def record(name: str) -> None:
    n, term, args = CASES[name]
    tmp = tempfile.mkdtemp()
    run = os.path.join(tmp, "run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(n), os.path.join(ROOT, "tests", "workloads", "deaths.py"), "--run-dir", run, *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    if term:
        try:
            p.wait(term)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=300)
    dest = os.path.join(OUT, name)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(run, dest)
    with open(dest + ".log", "w") as fh:
        fh.write("".join(line + "\n" for line in out.splitlines()
                         if line.startswith("rank ") and " step " in line))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{name}: exit {p.returncode}, {len(os.listdir(dest))} files")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    for name in (args.only.split(",") if args.only else CASES):
        t = time.monotonic()
        record(name)
        print(f"  {time.monotonic() - t:.0f} s")


if __name__ == "__main__":
    main()
