"""Flight Recorder dumps at scale: a Megatron-style job of R ranks in five kinds of group (TP 8, CP
2, EP 8, PP 4, DP the rest; benchmarks/fr_dumps.py) hung by one rank that stops before its
expert-parallel all-to-all, every rank's ring of 2,000 entries (TORCH_FR_BUFFER_SIZE=2000) as
torch pickles it. Side by side, each in a fresh process:

- the floor: `pickle.load` of every dump, one process (what reading them cannot go under);
- gpuscope: `gpuscope analyze DIR -q --json F`, start-up included, with its peak memory (the
  process's and its forked reader's), and whether it blames the rank that stopped;
- torch's own analyzer (`python -m torch.distributed.flight_recorder.fr_trace DIR --prefix
  _dump_`): its time, whether it names the rank ("missing ranks: {R}") and how many lines it
  prints.

    python benchmarks/bench_fr.py [--sizes 128,1024] [--repeat 3] [--work /tmp/gpuscope-fr]
Writes benchmarks/results/fr.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from fr_dumps import Layout, make_job  # noqa: E402
from measured import commit  # noqa: E402

_FLOOR = r"""
import os, pickle, sys, time
t = time.perf_counter()
for n in os.listdir(sys.argv[1]):
    with open(os.path.join(sys.argv[1], n), "rb") as fh:
        pickle.load(fh)
print(time.perf_counter() - t)
"""


def _timed(cmd: list[str], both: bool = False) -> tuple[float, str, int]:
    """(seconds, stdout (and stderr with `both`: torch's tool logs there), the largest
    process's peak RSS in MB)."""
    t = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True,
                         cwd=ROOT)
    took = time.perf_counter() - t
    err = out.stderr.strip().splitlines()
    peak = int(err[-1]) // 1024 if err and err[-1].isdigit() else -1
    return took, out.stdout + ("\n".join(err[:-1]) if both else ""), peak


def _layout(world: int) -> Layout:
    return Layout(tp=8, cp=2, ep=8, pp=4, world=world) if world >= 1024 else \
        Layout(tp=4, cp=2, ep=4, pp=2, world=world)


def measure(world: int, repeat: int, work: str) -> dict:
    folder = os.path.join(work, f"job{world}")
    culprit = world // 2 + 5
    truth_file = folder + ".truth.json"
    if not os.path.exists(truth_file):
        t = time.perf_counter()
        truth = make_job(folder, _layout(world), fault="behind", rank=culprit, at=2, step=300,
                         ring=2000)
        truth = {k: v for k, v in truth.items() if k not in ("issued", "done")}
        truth["made_s"] = round(time.perf_counter() - t, 1)
        with open(truth_file, "w") as fh:
            json.dump(truth, fh)
    with open(truth_file) as fh:
        truth = json.load(fh)
    size_mb = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) / 2**20
    py = sys.executable
    floor, ours, torch_s, peaks = [], [], [], []
    report = torch_out = None
    for _ in range(repeat):  # interleaved: the machine's load moves all three alike
        floor.append(float(subprocess.run([py, "-c", _FLOOR, folder], capture_output=True,
                                          text=True, check=True).stdout))
        took, _, peak = _timed([py, "-m", "gpuscope", "analyze", folder, "-q", "--json",
                                folder + ".report.json"])
        ours.append(took)
        peaks.append(peak)
        with open(folder + ".report.json") as fh:
            report = json.load(fh)
        took, torch_out, _ = _timed([py, "-m", "torch.distributed.flight_recorder.fr_trace",
                                     folder, "--prefix", "_dump_"], both=True)
        torch_s.append(took)
    named = sorted({int(x) for m in re.findall(r"missing ranks: \{([\d, ]+)\}", torch_out)
                    for x in m.split(",")})
    return {"ranks": world, "entries_per_rank": 2000, "dumps_mb": round(size_mb, 1),
            "truth": {"culprit": culprit, "group": truth["group"], "desc": truth["desc"],
                      "seq": truth["seq"]},
            "floor_pickle_load_s": round(statistics.median(floor), 2),
            "gpuscope_cli_s": round(statistics.median(ours), 2),
            "gpuscope_over_floor": round(statistics.median(ours) / statistics.median(floor), 2),
            "gpuscope_peak_mb": max(peaks),
            "gpuscope_blamed": report["blamed"],
            "gpuscope_first_place": report["stopped_by"][0]["holds"][0]["group"]
            if report["stopped_by"] else None,
            "gpuscope_report_lines": len(report["text"].splitlines()),
            "gpuscope_report_chars": len(report["text"]),
            "torch_fr_trace_s": round(statistics.median(torch_s), 2),
            "torch_fr_trace_missing_ranks": named,
            "torch_fr_trace_lines": len(torch_out.splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="128,1024")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default="/tmp/gpuscope-fr")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rows = []
    for world in map(int, args.sizes.split(",")):
        rows.append(measure(world, args.repeat, args.work))
        print(json.dumps(rows[-1]))
    out = {"commit": commit(), "cpu_count": os.cpu_count(), "repeat": args.repeat,
           "rows": rows}
    with open(os.path.join(HERE, "results", "fr.json"), "w") as fh:
        json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
