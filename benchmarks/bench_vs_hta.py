"""gpuscope vs Holistic Trace Analysis on the same torch.profiler traces, in one run.

For each trace folder, each tool runs in a fresh process:
- in-process: imports done first, then the clock and the memory baseline; gpuscope runs its whole
  analysis (`gpuscope.analyze`: read, steps, verdict, suggestions), HTA only its load
  (`TraceAnalysis(trace_dir=...)`). Timed `--repeat` times in pairs, one tool right after the
  other (this VM's speed drifts over minutes), with nothing sampling them (on 2 cores a sampler
  takes time from a tool that uses both); the ratio is the median of the pairs' ratios. Peak
  memory comes from one more run of each, sampled every 10 ms from /proc by this script: the
  peak over that baseline of the summed proportional set size (PSS) of the process and all its
  children (gpuscope's forked decoder, HTA's worker pool): pages a fork shares with its parent
  count once; also its anonymous part alone (heap and arrays: what grows with the trace),
  without the pages of the tools' own code that running it first faults in;
- end to end: the command a user types (`gpuscope analyze DIR -q` against a python -c that
  constructs HTA's TraceAnalysis), imports and interpreter start-up included; timed `--repeat`
  times in pairs (gpuscope, then HTA: the speed-up is the median of the pairs' ratios), and its whole process tree's peak PSS (interpreter and imports included) taken in one
  more run, sampled every 5 ms.
HTA lives in its own virtual environment (benchmarks/.venv-hta, created on first use:
HolisticTraceAnalysis 0.5.0, which needs pandas < 2.3).

HTA's own test traces that ../shared lacks (its package ships none: FROM_HTA_REPO, e.g. the
53.7 MB df_index_resolver trace) are read from a clone of its repository named by
$GPUSCOPE_HTA_REPO (tests/data/NAME), else from build/traces/hta/NAME; a trace found in neither
is left out, and the run says where to put it.

    python benchmarks/bench_vs_hta.py [--repeat 3] [folders ...]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measured import commit, process_tree  # noqa: E402  (benchmarks/measured.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(ROOT, "..", "shared", "traces", "hta")
HTA_VENV = os.path.join(HERE, ".venv-hta")
DEFAULT = ["trace_filter", "nccl_parser_config", "ns_resolution_trace", "mtia_trace_single_rank",
           "sample_traces/imbalanced/kineto", "nanogpt_2_ranks", "df_index_resolver"]
#: HTA test traces that are not in ../shared: the folder under its repository's tests/data
FROM_HTA_REPO = ("df_index_resolver",)
#: traces this benchmark makes on first use (under build/traces/NAME/kineto): a nanoGPT-shaped
#: loop (tests/workloads/cases.py) on 2 ranks, 66 micro-steps profiled per rank (53 MB of JSON)
MADE = {"nanogpt_2_ranks": ["--case", "nanogpt", "--steps", "20", "--profile",
                            "--profile-steps", "66"]}

_MEASURE = r"""
import json, resource, sys, time, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
{imports}
base = rss()
print("ready", flush=True)
sys.stdin.readline()  # the sampler took its baseline
t0 = time.perf_counter()
{work}
wall = time.perf_counter() - t0
# this image's peak (VmHWM): ru_maxrss would keep the forking parent's size across exec
peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({{"wall_s": wall, "peak_over_base": peak - base, "child_peak": kids}}))
"""

TOOLS = {
    "gpuscope": ("import gpuscope, gpuscope.analyze.run, gpuscope.readers.rundir, "
                 "gpuscope.readers.kineto.reader, gpuscope.trace_files",
                 "gpuscope.analyze(sys.argv[1])"),
    "hta": ("from hta.trace_analysis import TraceAnalysis",
            "TraceAnalysis(trace_dir=sys.argv[1])"),
}


def hta_python() -> str:
    py = os.path.join(HTA_VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", HTA_VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "HolisticTraceAnalysis==0.5.0",
                        "pandas<2.3", "numpy<2.1"], check=True)
    return py


def raw_size(folder: str) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            if f.endswith(".gz"):
                with gzip.open(p, "rb") as fh:
                    while chunk := fh.read(1 << 22):
                        total += len(chunk)
            elif f.endswith(".json"):
                total += os.path.getsize(p)
    return total


def tree_pss(pid: int, field: str = "Pss:") -> int:
    """Summed PSS (bytes) of pid and its descendants; with field="Pss_Anon:" only their
    anonymous memory (heap, arrays), without the pages of code and data files mapped in."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith(field):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:  # gone meanwhile
            pass
    return total


def measure(py: str, tool: str, folder: str, sample: bool = True) -> dict:
    """Run one tool in a fresh process; its result plus (`sample`) the peak PSS of its process
    tree over the baseline taken after its imports. Unsampled, nothing else runs meanwhile."""
    imports, work = TOOLS[tool]
    code = _MEASURE.format(imports=imports, work=work)
    proc = subprocess.Popen([py, "-c", code, folder], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "ready"
    base, base_anon = (tree_pss(proc.pid), tree_pss(proc.pid, "Pss_Anon:")) if sample else (0, 0)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    peak, peak_anon = base, base_anon
    while sample and proc.poll() is None:
        peak = max(peak, tree_pss(proc.pid))
        peak_anon = max(peak_anon, tree_pss(proc.pid, "Pss_Anon:"))
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    res = json.loads(out.strip().splitlines()[-1])
    res["tree_pss_peak_over_base"] = peak - base
    res["tree_anon_peak_over_base"] = peak_anon - base_anon
    return res


def made_folder(name: str) -> str:
    """The traces of a MADE entry, recorded with torchrun the first time."""
    out = os.path.join(ROOT, "build", "traces", name)
    kineto = os.path.join(out, "kineto")
    if not glob.glob(os.path.join(kineto, "*.json")):
        print(f"making {kineto} ...", flush=True)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", os.path.join(ROOT, "tests", "workloads",
                                                              "cases.py"), *MADE[name],
                        "--out", out], check=True, cwd=ROOT, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return kineto


def hta_repo_folder(name: str) -> str:
    """Where one of HTA's own test traces lies: $GPUSCOPE_HTA_REPO/tests/data/NAME, else
    build/traces/hta/NAME."""
    repo = os.environ.get("GPUSCOPE_HTA_REPO")
    there = os.path.join(repo, "tests", "data", name) if repo else ""
    return there if there and os.path.isdir(there) else os.path.join(ROOT, "build", "traces",
                                                                     "hta", name)


def end_to_end(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT)
    return time.perf_counter() - t


def end_to_end_peak(cmd: list[str]) -> int:
    """Peak summed PSS (bytes) of the command's whole process tree, interpreter and imports
    included (a separate run: sampling slows what it samples, so the timed runs are not)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_pss(proc.pid))
        time.sleep(0.005)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "vs_hta.json"))
    args = ap.parse_args()
    pys = {"gpuscope": sys.executable, "hta": hta_python()}
    gpuscope_cli = [sys.executable, "-m", "gpuscope", "analyze", "-q"]
    hta_cli = [pys["hta"], "-c", "import sys; from hta.trace_analysis import TraceAnalysis; "
               "TraceAnalysis(trace_dir=sys.argv[1])"]
    results = []
    for name in args.folders:
        local = os.path.join(ROOT, name)
        folder = os.path.normpath(made_folder(name) if name in MADE else hta_repo_folder(name)
                                  if name in FROM_HTA_REPO else local
                                  if os.path.isdir(local) else os.path.join(SHARED, name))
        if not os.path.isdir(folder):
            print(f"{name}: left out (not found: {folder}; clone "
                  "https://github.com/facebookresearch/HolisticTraceAnalysis and set "
                  "GPUSCOPE_HTA_REPO to it)", flush=True)
            continue
        size = raw_size(folder)
        row = {"trace": name, "raw_json_mb":
               round(size / 1e6, 2)}
        # in pairs, unsampled: gpuscope then HTA, back to back
        timed = [(measure(pys["gpuscope"], "gpuscope", folder, sample=False)["wall_s"],
                  measure(pys["hta"], "hta", folder, sample=False)["wall_s"])
                 for _ in range(args.repeat)]
        row["gpuscope_s"] = round(statistics.median(g for g, _ in timed), 4)
        row["hta_s"] = round(statistics.median(h for _, h in timed), 4)
        row["time_ratio_pairs"] = [round(g / h, 4) for g, h in timed]
        for tool in ("gpuscope", "hta"):
            runs = [measure(pys[tool], tool, folder)]  # memory: one sampled run
            row[f"{tool}_peak_mb"] = round(max(r["peak_over_base"] for r in runs) / 1e6, 1)
            row[f"{tool}_child_peak_mb"] = round(max(r["child_peak"] for r in runs) / 1e6, 1)
            row[f"{tool}_tree_peak_mb"] = round(max(r["tree_pss_peak_over_base"]
                                                    for r in runs) / 1e6, 1)
            row[f"{tool}_tree_anon_peak_mb"] = round(max(r["tree_anon_peak_over_base"]
                                                         for r in runs) / 1e6, 1)
        # in pairs, one tool right after the other: this VM's speed drifts over minutes
        pairs = [(end_to_end(gpuscope_cli + [folder]), end_to_end(hta_cli + [folder]))
                 for _ in range(args.repeat)]
        row["gpuscope_cli_s"] = round(statistics.median(g for g, _ in pairs), 3)
        row["hta_cli_s"] = round(statistics.median(h for _, h in pairs), 3)
        row["cli_speedup_pairs"] = [round(h / g, 2) for g, h in pairs]
        row["cli_speedup"] = round(statistics.median(h / g for g, h in pairs), 2)
        row["gpuscope_cli_peak_mb"] = round(end_to_end_peak(gpuscope_cli + [folder]) / 1e6, 1)
        row["hta_cli_peak_mb"] = round(end_to_end_peak(hta_cli + [folder]) / 1e6, 1)
        row["time_ratio"] = round(statistics.median(g / h for g, h in timed), 4)
        row["cli_time_ratio"] = round(row["gpuscope_cli_s"] / row["hta_cli_s"], 3)
        row["gpuscope_peak_over_raw"] = round(row["gpuscope_peak_mb"] / max(row["raw_json_mb"],
                                                                             1e-9), 2)
        row["gpuscope_tree_over_raw"] = round(row["gpuscope_tree_peak_mb"]
                                              / max(row["raw_json_mb"], 1e-9), 2)
        row["gpuscope_tree_anon_over_raw"] = round(row["gpuscope_tree_anon_peak_mb"]
                                                   / max(row["raw_json_mb"], 1e-9), 2)
        row["memory_ratio"] = round(row["gpuscope_peak_mb"] / max(row["hta_peak_mb"], 1e-9), 3)
        results.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"commit": commit(), "cpu_count": os.cpu_count(), "repeat": args.repeat,
                   "rows": results}, fh, indent=2)
    print("\n| trace | raw JSON | gpuscope | HTA load | ratio | gpuscope memory, all processes "
          "(x raw JSON) [heap and arrays only] | HTA memory | CLI end to end: gpuscope / HTA | "
          "CLI peak, all processes: gpuscope / HTA |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['trace']} | {r['raw_json_mb']} MB | {r['gpuscope_s']:.3f} s | "
              f"{r['hta_s']:.3f} s | {r['time_ratio']:.2f} | {r['gpuscope_tree_peak_mb']} MB "
              f"({r['gpuscope_tree_over_raw']}x) [{r['gpuscope_tree_anon_over_raw']}x] | "
              f"{r['hta_tree_peak_mb']} MB | {r['gpuscope_cli_s']:.2f} s / {r['hta_cli_s']:.2f} s "
              f"({r['cli_speedup']:.1f}x) | {r['gpuscope_cli_peak_mb']:.0f} MB / "
              f"{r['hta_cli_peak_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
