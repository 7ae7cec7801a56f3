"""Every rank's profiler trace, at the sizes users gave up on: time, throughput and peak memory
of `gpuscope analyze` on generated runs of 1, 8, 32 and 128 ranks of ~150 MB of JSON each
(benchmarks/big_traces.py: a transformer's steps, NCCL buckets, a straggler and a data stall
on known ranks), on the public traces of ../shared/traces, with HTA's load of the same files in
the same run where it fits, the Ray engine on a local 2-node cluster, the floor of decoding the
same JSON into the same columns, and the command's start.

Per input, each in a fresh process (bench_vs_hta.measure): the in-process analysis after the
imports, its wall time from a run nothing samples, and from one more run its process tree's
peak PSS over the baseline taken after the imports, sampled every 10 ms (the forked readers
included, pages they share with their parent counted once); HTA's load likewise; the command a user types (`gpuscope analyze DIR -q --json F`), its wall time and whether
the report names the known straggler and stall. MB/s per core divides the JSON read by the wall
time and the cores (2 here); events/s counts the trace events the readers decoded.

    python benchmarks/bench_big_traces.py [--ranks 1,8,32,128] [--mb 150] [--work DIR]
        [--hta-max-ranks 8] [--no-ray] [--keep]

A job's many ranks, each a small trace (`--fleet 10000`, ~1.5 MB each: the generator's fewest
layers): the command's wall time and its process tree's peak PSS, beside the same command of
another checkout (`--base-root DIR`, e.g. a worktree of the previous commit) on the same files
in the same run, alternating; `--fleet-only` updates that part of the results file alone.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import big_traces  # noqa: E402
from bench_vs_hta import (end_to_end, end_to_end_peak, hta_python, measure, raw_size,  # noqa: E402
                          tree_pss)
from measured import commit  # noqa: E402

SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces"))
PUBLIC = ["hta/trace_filter", "hta/nccl_parser_config", "hta/ns_resolution_trace",
          "hta/mtia_trace_single_rank", "external/param_dlrm", "external/tb_resnet50_nw0",
          "external/tracelens_mi300_resnet_act_checkpoint"]
CORES = os.cpu_count() or 1


def generated(work: str, ranks: int, mb: float, gz: bool = False) -> str:
    """The run of `ranks` x `mb` MB under `work`, made once (FOLDER.known.json beside it says
    what is in it: not inside, where HTA would take it for a trace)."""
    folder = os.path.join(work, f"r{ranks}x{int(mb)}" + ("gz" if gz else ""))
    if not os.path.exists(folder + ".known.json"):
        shutil.rmtree(folder, ignore_errors=True)
        t = time.perf_counter()
        made = big_traces.generate(folder, ranks, mb, gz=gz, jobs=CORES)
        made["generate_s"] = round(time.perf_counter() - t, 1)
        with open(folder + ".known.json", "w") as fh:
            json.dump({k: v for k, v in made.items() if k != "files"}, fh)
    return folder


def known(folder: str) -> dict:
    with open(folder + ".known.json") as fh:
        return json.load(fh)


def report_of(folder: str, extra: list[str] = (), env: dict | None = None) -> tuple[float, dict]:
    """(wall s, JSON report) of the command a user types."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "report.json")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", folder, "-q",
                               "--json", out, *extra], capture_output=True, text=True, cwd=ROOT,
                              env=env)
        wall = time.perf_counter() - t
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        with open(out) as fh:
            return wall, json.load(fh)


def named(rep: dict, k: dict) -> dict:
    """Whether the report names the run's known straggler (compute) and stalled rank (data)."""
    by = {s["rank"]: s for s in rep.get("straggler_details", [])}
    out = {"stragglers": sorted(by), "verdict": rep["verdict"]}
    if k.get("straggler") is not None:
        s = by.get(k["straggler"])
        out["straggler_named"] = bool(s) and s["cause"] == "compute"
    if k.get("stall_rank") is not None:
        s = by.get(k["stall_rank"])
        out["stall_named"] = bool(s) and s["cause"] == "data"
    return out


def events_in(folder: str) -> int:
    """Trace events gpuscope decodes in the folder or file (its readers' count)."""
    code = ("import sys, json; from gpuscope.readers import read_path; t = read_path(sys.argv[1]); "
            "print(sum(i.meta.get('events', 0) for i in t.ranks.values()))")
    out = subprocess.run([sys.executable, "-c", code, folder], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def row_for(folder: str, name: str, hta: str | None, repeat: int = 1) -> dict:
    """gpuscope (and HTA where `hta` is its python) on one folder."""
    size = raw_size(folder)
    files = [f for f in os.listdir(folder) if f.endswith((".json", ".gz"))]
    row = {"input": name, "files": len(files), "raw_json_mb": round(size / 1e6, 1)}
    # the time unsampled (reading a big process's page tables every 10 ms slows it), the
    # memory from one more, sampled run
    timed = [measure(sys.executable, "gpuscope", folder, sample=False) for _ in range(repeat)]
    row["gpuscope_s"] = round(statistics.median(r["wall_s"] for r in timed), 2)
    sampled = measure(sys.executable, "gpuscope", folder)
    row["gpuscope_sampled_s"] = round(sampled["wall_s"], 2)
    row["gpuscope_peak_over_imports_mb"] = round(sampled["tree_pss_peak_over_base"] / 1e6, 1)
    largest = max(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*")))
    if all(not p.endswith(".gz") for p in glob.glob(os.path.join(folder, "*"))):
        row["largest_file_mb"] = round(largest / 1e6, 1)
        row["peak_over_largest_file"] = round(row["gpuscope_peak_over_imports_mb"] * 1e6
                                              / largest, 2)
    row["mb_per_s_per_core"] = round(size / 1e6 / row["gpuscope_s"] / CORES, 1)
    gen = os.path.exists(folder + ".known.json")
    # a generated run's ranks hold the same events: one rank's, times the ranks
    row["events"] = (events_in(os.path.join(folder, sorted(files)[0])) * len(files) if gen
                     else events_in(folder))
    row["events_per_s"] = int(row["events"] / row["gpuscope_s"])
    wall, rep = report_of(folder)
    row["command_s"] = round(wall, 2)
    row["command_peak_mb"] = round(end_to_end_peak([sys.executable, "-m", "gpuscope", "analyze",
                                                    folder, "-q"]) / 1e6, 1)
    if gen:
        row.update(named(rep, known(folder)))
    if hta is not None:
        try:
            h = measure(hta, "hta", folder)
            hta_s = measure(hta, "hta", folder, sample=False)["wall_s"]
        except subprocess.CalledProcessError as exc:  # e.g. killed for memory
            row["hta"] = f"failed: exit {exc.returncode}: {(exc.stderr or '')[-300:]}"
            return row
        row["hta_s"] = round(hta_s, 2)
        row["hta_peak_over_imports_mb"] = round(h["tree_pss_peak_over_base"] / 1e6, 1)
        row["gpuscope_over_hta_time"] = round(row["gpuscope_s"] / row["hta_s"], 3)
        row["gpuscope_over_hta_memory"] = round(row["gpuscope_peak_over_imports_mb"]
                                                / max(row["hta_peak_over_imports_mb"], 1e-9), 3)
    return row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_row(folder: str, local_s: float) -> dict:
    """`--engine ray` on a local cluster of 2 nodes (two `ray start` on 127.0.0.1, one CPU and
    their own memory budget each), against the local engine's time."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _free_port()
    env = dict(os.environ, RAY_ADDRESS=f"127.0.0.1:{port}")
    mem = str(int(6e9))
    subprocess.run([ray, "start", "--head", "--port", str(port), "--num-cpus", "1",
                    "--memory", mem, "--object-store-memory", str(int(5e8)),
                    "--include-dashboard", "false", "--disable-usage-stats"],
                   check=True, capture_output=True, cwd=ROOT)
    try:
        subprocess.run([ray, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1",
                        "--memory", mem, "--object-store-memory", str(int(5e8)),
                        "--disable-usage-stats"], check=True, capture_output=True, cwd=ROOT)
        nodes = subprocess.run([sys.executable, "-c", "import ray; ray.init(); "
                                "print(len([n for n in ray.nodes() if n['Alive']]))"],
                               capture_output=True, text=True, env=env, cwd=ROOT)
        wall, rep = report_of(folder, ["--engine", "ray"], env=env)
        out = {"nodes": int(nodes.stdout.strip().splitlines()[-1]), "ray_s": round(wall, 2),
               "local_s": round(local_s, 2), "speedup": round(local_s / wall, 2)}
        out.update(named(rep, known(folder)))
        return out
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, cwd=ROOT)


_FLOOR = r"""
import json, sys, time
import msgspec, numpy as np
from gpuscope.readers.kineto import parse
from gpuscope.readers.kineto.decode import read_bytes

class Args(msgspec.Struct):
    stream: int | None = msgspec.field(name="stream", default=None)
    correlation: int | None = None

class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float | None = None
    dur: float = 0.0
    tid: int | str = 0
    args: Args | None = None

class Trace(msgspec.Struct):
    traceEvents: list[Event]

def floor(path):
    blob = read_bytes(path)
    ev = msgspec.json.decode(blob, type=Trace).traceEvents
    del blob
    names, cats = {}, {}
    x = [e for e in ev if e.ph == "X" and e.ts is not None]
    del ev
    cols = (np.array([names.setdefault(e.name, len(names)) for e in x], np.int32),
            np.array([cats.setdefault(e.cat, len(cats)) for e in x], np.int32),
            np.array([e.ts for e in x]), np.array([e.dur for e in x]),
            np.array([e.args.stream if e.args and e.args.stream is not None else -1 for e in x]),
            np.array([e.args.correlation if e.args and e.args.correlation is not None else -1
                      for e in x]),
            np.array([e.tid if type(e.tid) is int else -1 for e in x]))
    return cols

path = sys.argv[1]
parse.forks = lambda: False  # one core each
out = {}
for name, fn in (("floor", floor), ("gpuscope", lambda p: parse.parse_file(p))):
    times = []
    for _ in range(3):
        t = time.perf_counter(); fn(path); times.append(time.perf_counter() - t)
    out[name + "_s"] = min(times)
from gpuscope.readers import read_path
t = time.perf_counter(); read_path(path); out["gpuscope_read_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def floor_row(folder: str) -> dict:
    """One core each: a typed msgspec decode of the file into the same columns (names and
    categories interned, ts, dur, stream, correlation, thread), against gpuscope's parse of it
    into its columns (parse_file) and its whole read of the file (read_path: steps, views)."""
    path = next(p for p in glob.glob(os.path.join(folder, "*")) if "trace" in p)
    out = subprocess.run([sys.executable, "-c", _FLOOR, path], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    size = os.path.getsize(path)
    return {"file_mb": round(size / 1e6, 1), **{k: round(v, 3) for k, v in got.items()},
            "parse_over_floor": round(got["gpuscope_s"] / got["floor_s"], 2),
            "read_over_floor": round(got["gpuscope_read_s"] / got["floor_s"], 2),
            "floor_mb_per_s": round(size / 1e6 / got["floor_s"], 1)}


def start_row(repeat: int = 7) -> dict:
    """The command's start: `import gpuscope.cli` (what runs before the readers' processes are
    forked, prefetch.py) against a bare interpreter, and the whole command on the smallest trace."""
    def t(code):
        return statistics.median(end_to_end([sys.executable, "-c", code]) for _ in range(repeat))
    bare = t("pass")
    cli = t("import gpuscope.cli")
    small = os.path.join(SHARED, "hta", "trace_filter")
    analyze = statistics.median(end_to_end([sys.executable, "-m", "gpuscope", "analyze", small,
                                            "-q"]) for _ in range(repeat))
    return {"python_s": round(bare, 3), "import_cli_s": round(cli - bare, 3),
            "analyze_small_trace_s": round(analyze - bare, 3)}


def fleet_row(ranks: int, work: str, roots: dict[str, str], repeat: int = 1) -> dict:
    """`gpuscope analyze DIR -q --json F` on `ranks` small traces, by each checkout of `roots`
    ({label: its root}), alternating: wall time (unsampled runs, their median) and the process
    tree's peak PSS (one more, sampled run); whether the known ranks are named."""
    folder = generated(work, ranks, 0.3)
    k = known(folder)
    row = {"input": f"generated {ranks} x {raw_size(folder) / ranks / 1e6:.1f} MB",
           "ranks": ranks, "raw_json_mb": round(raw_size(folder) / 1e6, 1),
           "generate_s": k.get("generate_s"),
           "known": {x: k[x] for x in ("straggler", "stall_rank")}}
    walls: dict[str, list] = {label: [] for label in roots}
    for _ in range(repeat):
        for label, root in roots.items():
            env = dict(os.environ, PYTHONPATH=root)
            t = time.perf_counter()
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "report.json")
                subprocess.run([sys.executable, "-m", "gpuscope", "analyze", folder, "-q",
                                "--json", out], check=True, capture_output=True, cwd=root,
                               env=env)
                walls[label].append(time.perf_counter() - t)
                with open(out) as fh:
                    rep = json.load(fh)
            row[label] = {"commit": commit(root), **named(rep, k)}
    for label, root in roots.items():
        row[label]["command_s"] = round(statistics.median(walls[label]), 1)
        proc = subprocess.Popen([sys.executable, "-m", "gpuscope", "analyze", folder, "-q"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root,
                                env=dict(os.environ, PYTHONPATH=root))
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_pss(proc.pid))
            time.sleep(0.01)
        row[label]["command_peak_mb"] = round(peak / 1e6, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,8,32,128")
    ap.add_argument("--mb", type=float, default=150.0)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gpuscope-big"))
    ap.add_argument("--hta-max-ranks", type=int, default=8)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the generated runs")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "big_traces.json"))
    ap.add_argument("--fleet", type=int, default=0, help="ranks of small traces (0: none)")
    ap.add_argument("--base-root", help="another checkout run beside this one on the fleet")
    ap.add_argument("--fleet-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.fleet:
        roots = {"this": ROOT, **({"base": os.path.abspath(args.base_root)}
                                  if args.base_root else {})}
        row = fleet_row(args.fleet, args.work, roots, args.repeat)
        print(json.dumps(row), flush=True)
        if args.fleet_only:
            with open(args.out) as fh:
                result = json.load(fh)
            result["fleet"] = row
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)
            return
    hta = hta_python()
    result = {"commit": commit(), "cores": CORES, "mb_per_rank": args.mb, "generated": [],
              "public": []}
    result["start"] = start_row()
    print("start", result["start"], flush=True)
    for name in PUBLIC:
        folder = os.path.join(SHARED, name)
        if os.path.isdir(folder):
            row = row_for(folder, name, hta)
            result["public"].append(row)
            print(json.dumps(row), flush=True)
    sizes = [int(x) for x in args.ranks.split(",") if x]
    for ranks in sizes:
        folder = generated(args.work, ranks, args.mb)
        k = known(folder)
        row = row_for(folder, f"generated {ranks} x {int(args.mb)} MB",
                      hta if ranks <= args.hta_max_ranks else None)
        row.update({"ranks": ranks, "generate_s": k.get("generate_s"),
                    "known": {x: k[x] for x in ("straggler", "stall_rank", "stall_ms")}})
        if ranks > args.hta_max_ranks:
            seen = [r["hta_peak_over_imports_mb"] / r["raw_json_mb"]
                    for r in result["generated"] if "hta_peak_over_imports_mb" in r]
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
            row["hta"] = ("not run: " + (f"HTA's load held {max(seen):.1f}x the JSON over its "
                                         "imports at the sizes above, " if seen else "")
                          + f"{row['raw_json_mb'] / 1e3:.1f} GB of JSON would need more than "
                          f"this machine's {ram:.0f} GiB")
        if ranks == 1:
            row["floor"] = floor_row(folder)
        if ranks == max(sizes) and not args.no_ray:
            row["ray"] = ray_row(folder, row["command_s"])
        result["generated"].append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
        if not args.keep and ranks != 1:
            shutil.rmtree(folder, ignore_errors=True)
            os.remove(folder + ".known.json")
    if args.fleet:
        result["fleet"] = row
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
