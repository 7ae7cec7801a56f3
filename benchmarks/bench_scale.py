"""Analysis at scale: record run dirs of R ranks x S steps, analysed end to end (`gpuscope.analyze`:
read every rank file, waits, labels, stragglers, suggestions), in a fresh process each, with
its time (after imports) and peak memory (the main process's peak RSS over its post-import
baseline: the shared memory the forked reader hands its columns back through is counted there,
the child's own working memory is not), and the command a user types
(`gpuscope analyze DIR -q`, start-up included); the budget (DESIGN.md) is 1,024 ranks x 1,000
steps in under 3 s with memory linear in ranks x steps.

The run dirs are synthetic but written by the recorder's own RecordWriter (header, knob
records, rows with the per-collective "_comm" object DDP runs have in batches of 16 as the
recorder flushes them, end record, and the column side files): a DDP job whose rank 17 computes
15% longer every step, with per-step noise. They are made once under --work; each size is also
measured as "JSON only", a copy without the side files (recordings made before them, or with
them lost), where every record file's JSON is decoded.

    python benchmarks/bench_scale.py [--sizes 128x1000,256x1000,512x1000,1024x1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from measured import commit, process_tree  # noqa: E402  (benchmarks/measured.py)
from gpuscope.record.writer import RecordWriter  # noqa: E402
from gpuscope.run_format import CHUNK_MAGIC, COLUMNS_SUFFIX, SCHEMA, STEP_COLUMNS  # noqa: E402

FLUSH_ROWS = 16  # the recorder's batch

_MEASURE = r"""
import json, resource, sys, time
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
t_start = time.perf_counter()
import gpuscope, gpuscope.analyze.run, gpuscope.readers.rundir  # imports before the clock
base = rss()
t0 = time.perf_counter()
report = gpuscope.analyze(sys.argv[1])
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "total_s": time.perf_counter() - t_start,
                  "peak_mb": peak / 2**20, "peak_over_base_mb": (peak - base) / 2**20,
                  "verdict": report.verdict.label,
                  "stragglers": [s.rank for s in report.stragglers], "steps": len(report.steps),
                  "spilled": any("are kept in files under" in w for w in report.warnings)}))
"""


def make_run(path: str, ranks: int, steps: int, seed: int = 0, only=None, jobs: int = 1) -> int:
    """Write a synthetic DDP run dir with the recorder's writer; returns the record files' size
    in bytes (the side files not counted). `only`: rewrite these ranks' files alone (the same
    rows: every rank's numbers are drawn, in order). `jobs`: that many processes write the
    ranks (every jobs-th each; the same files as one process writes)."""
    if jobs > 1 and only is None:
        return _make_in_parallel(path, ranks, steps, seed, jobs)
    if only is None:
        shutil.rmtree(path, ignore_errors=True)
    # the files already there, by rank, listed once (not a listing of a growing dir per rank)
    there: dict = {}
    for folder in (path, path + "-json") if only is not None else ():
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            there.setdefault(name.split(".", 1)[0], []).append(os.path.join(folder, name))
    rng = np.random.default_rng(seed)
    t0 = 1_790_000_000_000_000_000
    base_step = 80_000_000  # 80 ms
    total = 0
    for rank in range(ranks):
        slow = 1.15 if rank == 17 else 1.0
        data = rng.integers(1_000_000, 3_000_000, steps)
        fwd = (rng.normal(20e6, 1e6, steps) * slow).astype(np.int64)
        bwd = (rng.normal(40e6, 2e6, steps) * slow).astype(np.int64)
        opt = rng.integers(2_000_000, 2_500_000, steps)
        compute = fwd + bwd + opt
        comm = rng.integers(15_000_000, 18_000_000, steps)
        other = rng.integers(300_000, 900_000, steps)
        # a synchronous step: every rank leaves the all-reduce together, so the fast ones wait
        step = np.full(steps, base_step) + rng.integers(0, 2_000_000, steps)
        exposed = np.maximum(step - data - compute - other, 500_000)
        step = data + compute + exposed + other
        comm = np.maximum(comm, exposed)  # the exposed part lies inside the communication
        start = t0 + np.concatenate([[0], np.cumsum(step)[:-1]])
        if only is not None and rank not in only:
            continue
        head = {"schema": SCHEMA, "rank": rank, "local_rank": rank % 8, "world_size": ranks,
                "host": f"node{rank // 8:04d}", "pid": 1000 + rank, "placement_source": "env",
                "run_id": "bench", "recording": 1, "start_unix_ns": t0, "clock": "perf_counter_ns",
                "columns": list(STEP_COLUMNS), "comm_timing": "ddp_comm_hook+collectives",
                "knobs": {"world_size": ranks, "backend": "nccl", "device": "cuda",
                          "model": "DistributedDataParallel", "param_dtype": "bfloat16",
                          "params": 124_000_000}}
        if only is not None:  # the file is made again: the old one (and its link) go first
            for old in there.get(f"rank-{rank:05d}", ()):
                os.remove(old)
        writer = RecordWriter(path, rank)
        # a training loop's writer drops batches past MAX_PENDING rather than wait for a slow
        # disk (the recorder then says so); this one writes a whole file at once: it waits
        writer.MAX_PENDING = steps // FLUSH_ROWS + 8
        writer.write_header(head)
        writer.add_meta({"knobs": {"loader": "DataLoader", "num_workers": 4, "batch_size": 16},
                         "at_step": 0})
        cols = np.column_stack([np.arange(steps), start, step, data, compute, comm, exposed,
                                other, fwd, bwd, opt, np.ones(steps, np.int64), data // 10,
                                np.ones(steps, np.int64), np.zeros(steps, np.int64)]).tolist()
        rows = [row + [{"_comm": {"all_reduce:ddp": [c, e, 4]}}]
                for row, c, e in zip(cols, comm.tolist(), exposed.tolist())]
        for i in range(0, steps, FLUSH_ROWS):
            writer.add_rows(rows[i:i + FLUSH_ROWS])
        writer.close({"steps": steps, "crashed": False,
                      "end_unix_ns": int(start[-1] + step[-1])})
        assert writer.error is None, writer.error
        assert writer.dropped == 0, f"rank {rank}: {writer.dropped} lines dropped"
        total += os.path.getsize(writer.path)
        if only is not None and os.path.isdir(path + "-json"):
            os.link(writer.path, os.path.join(path + "-json", os.path.basename(writer.path)))
    if only is not None:
        return total
    json_only = path + "-json"  # the same record files, without their side files
    shutil.rmtree(json_only, ignore_errors=True)
    os.makedirs(json_only)
    for name in os.listdir(path):
        if not name.endswith(COLUMNS_SUFFIX):
            os.link(os.path.join(path, name), os.path.join(json_only, name))
    if len(glob.glob(os.path.join(path, "*" + COLUMNS_SUFFIX))) != ranks:
        raise SystemExit(f"{path}: the writer did not leave a side file per rank")
    return total


def _make_in_parallel(path: str, ranks: int, steps: int, seed: int, jobs: int) -> int:
    """make_run's files written by `jobs` processes, then its JSON-only copy (links)."""
    import multiprocessing

    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(path + "-json", ignore_errors=True)
    os.makedirs(path)
    os.makedirs(path + "-json")  # each process links its files here as it writes them
    parts = [(path, ranks, steps, seed, set(range(k, ranks, jobs))) for k in range(jobs)]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        total = sum(pool.starmap(make_run, parts))
    if len(glob.glob(os.path.join(path, "*" + COLUMNS_SUFFIX))) != ranks:
        raise SystemExit(f"{path}: the writer did not leave a side file per rank")
    return total


def measure(path: str, every: float = 0.0) -> dict:
    """One analysis in a fresh process; with `every` (seconds), its process tree's memory is
    also sampled that often from /proc: the peak of what the kernel cannot take back (anonymous
    and shared memory: Pss_Anon + Pss_Shmem) beside that of everything resident (Pss, which
    counts the pages of a table kept in a file, rowblock.memory_plan, that the kernel may
    write out and drop)."""
    proc = subprocess.Popen([sys.executable, "-c", _MEASURE, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    held = resident = 0
    while every and proc.poll() is None:
        mem = tree_memory(proc.pid)
        held = max(held, mem["Pss_Anon"] + mem["Pss_Shmem"])
        resident = max(resident, mem["Pss"])
        time.sleep(every)
    out, err = proc.communicate()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    res = json.loads(out.strip().splitlines()[-1])
    if every:
        res["tree_held_peak_mb"] = held / 2**20
        res["tree_resident_peak_mb"] = resident / 2**20
    return res


def tree_memory(pid: int) -> dict:
    """Pss, Pss_Anon and Pss_Shmem (bytes) summed over pid and its descendants."""
    out = {"Pss": 0, "Pss_Anon": 0, "Pss_Shmem": 0}
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                for line in fh:
                    key = line.split(":", 1)[0]
                    if key in out:
                        out[key] += int(line.split()[1]) * 1024
        except OSError:  # gone meanwhile
            pass
    return out


def end_to_end(path: str) -> float:
    """The command a user types, interpreter start-up and imports included."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuscope", "analyze", path, "-q"], check=True,
                   cwd=ROOT, capture_output=True)
    return time.perf_counter() - t


_JSON_LOADS = r"""
import glob, json, os, sys, time
names = sorted(glob.glob(os.path.join(sys.argv[1], "rank-*.gpuscope.jsonl")))
t = time.perf_counter()
for name in names:
    with open(name, "rb") as f:
        for line in f:
            json.loads(line)
print(time.perf_counter() - t)
"""


def json_loads_time(path: str) -> float:
    """Seconds for the standard library's json.loads of every line of every record file, in
    one fresh process: what decoding the JSON once costs at the least."""
    out = subprocess.run([sys.executable, "-c", _JSON_LOADS, path], capture_output=True,
                         text=True, check=True)
    return round(float(out.stdout), 3)


def memory_limits() -> dict:
    """The machine's memory (MemTotal) and, where this process's control group sets one, its
    limit (GB): what the analysis ran within."""
    out = {}
    try:
        with open("/proc/meminfo") as fh:
            out["machine"] = round(int(next(l for l in fh if l.startswith("MemTotal:")).split()[1])
                                   / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    from gpuscope.readers.rowblock import cgroup_room

    room = cgroup_room()
    if room is not None:
        out["cgroup_room_at_start"] = round(room / 2**30, 1)
    return out


def machine_speed() -> float:
    """Seconds of a fixed pure-Python loop (10 million additions), in a fresh process: this
    shared VM's speed drifts from minute to minute, and the figures are read against it."""
    out = subprocess.run([sys.executable, "-c", "import time\nt = time.perf_counter()\ns = 0\n"
                          "for i in range(10_000_000):\n    s += i\n"
                          "print(time.perf_counter() - t)"], capture_output=True, text=True,
                         check=True)
    return round(float(out.stdout), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128x1000,256x1000,512x1000,1024x1000",
                    help="RANKSxSTEPS, comma separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "scale"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "scale.json"))
    ap.add_argument("--skip-json", action="store_true",
                    help="only the run dirs with side files: no JSON-only runs, no json.loads "
                         "(sizes where decoding every line would take an hour), no CLI runs")
    ap.add_argument("--sample-every", type=float, default=0.0,
                    help="also sample the analysis's process tree's memory this often (s)")
    ap.add_argument("--append", action="store_true",
                    help="keep the other sizes' rows of --out (each row names its commit and "
                         "the memory it ran within: sizes may run in control groups of their own)")
    ap.add_argument("--make-jobs", type=int, default=os.cpu_count() or 1,
                    help="processes that write a run dir not yet made (before any timing)")
    args = ap.parse_args()
    rows = []
    for size in args.sizes.split(","):
        ranks, steps = (int(x) for x in size.lower().split("x"))
        path = os.path.join(args.work, f"{ranks}x{steps}")
        # made by the writer, side files too, in this layout of their chunks (a run dir of an
        # older layout is read as users' old run dirs are, so it is made again)
        marker = os.path.join(path, ".complete-cols-" + CHUNK_MAGIC.decode())
        if not os.path.exists(marker):
            t = time.perf_counter()
            nbytes = make_run(path, ranks, steps, jobs=args.make_jobs)
            with open(marker, "w") as f:
                f.write(str(nbytes))
            print(f"made {path} ({nbytes / 2**20:.0f} MB) in {time.perf_counter() - t:.1f} s",
                  flush=True)
        nbytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "rank-*.jsonl")))
        cols_mb = sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "*" + COLUMNS_SUFFIX)))
        loop = [machine_speed()]
        runs, cli, json_runs, json_cli = [], [], [], []
        if args.skip_json:
            runs = [measure(path, args.sample_every) for _ in range(args.repeat)]
            json_runs = []
        for _ in range(0 if args.skip_json else args.repeat):  # interleaved: a slow minute
            runs.append(measure(path, args.sample_every))   # hits both alike
            json_runs.append(measure(path + "-json"))
        for _ in range(0 if args.skip_json else args.repeat):
            cli.append(end_to_end(path))
            json_cli.append(end_to_end(path + "-json"))
        loads = None if args.skip_json else min(json_loads_time(path) for _ in range(args.repeat))
        loop.append(machine_speed())
        best = min(runs, key=lambda r: r["wall_s"])
        if {(r["verdict"], tuple(r["stragglers"])) for r in runs + json_runs} != \
                {(best["verdict"], tuple(best["stragglers"]))}:
            raise SystemExit("the side files and the JSON gave different verdicts")
        med = lambda rs, k: round(statistics.median(r[k] for r in rs), 3)  # noqa: E731
        row = {"ranks": ranks, "steps": steps, "rows": ranks * steps,
               "files_mb": round(nbytes / 2**20, 1), "side_files_mb": round(cols_mb / 2**20, 1),
               "analyze_s_median": med(runs, "wall_s"),
               "analyze_s_min": round(best["wall_s"], 3),
               "process_s_median": med(runs, "total_s"),
               "cli_s_median": round(statistics.median(cli), 3) if cli else None,
               "peak_mb": round(med(runs, "peak_mb"), 1),
               "peak_over_base_mb": round(med(runs, "peak_over_base_mb"), 1),
               # the step and collectives tables were kept in files (rowblock.memory_plan)
               "spilled": any(r.get("spilled") for r in runs),
               "json_only": None if not json_runs else {
                   "analyze_s_median": med(json_runs, "wall_s"),
                   "analyze_s_min": round(min(r["wall_s"] for r in json_runs), 3),
                   "cli_s_median": round(statistics.median(json_cli), 3),
                   "peak_over_base_mb": round(med(json_runs, "peak_over_base_mb"), 1),
                   # the whole analysis of the JSON-only run over json.loads of its lines
                   "json_loads_s": loads,
                   "over_json_loads": round(med(json_runs, "wall_s") / loads, 2)},
               "verdict": best["verdict"], "stragglers": best["stragglers"],
               "python_loop_s": loop,  # the machine's speed before and after
               "commit": commit(), "memory_gb": memory_limits()}
        if args.sample_every:
            row["tree_held_peak_mb"] = round(med(runs, "tree_held_peak_mb"), 1)
            row["tree_resident_peak_mb"] = round(med(runs, "tree_resident_peak_mb"), 1)
        row["bytes_per_row_peak"] = round(row["peak_over_base_mb"] * 2**20 / row["rows"], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            before = json.load(f)
        kept = [r for r in before["rows"]
                if (r["ranks"], r["steps"]) not in {(x["ranks"], x["steps"]) for x in rows}]
        for r in kept:  # a row of a file from before rows named these: the file's own
            r.setdefault("commit", before.get("commit"))
            r.setdefault("memory_gb", before.get("memory_gb"))
        rows = sorted(kept + rows, key=lambda r: r["rows"])
    result = {"commit": commit(), "cpu_count": os.cpu_count(), "repeat": args.repeat,
              "memory_gb": memory_limits(), "sample_every": args.sample_every or None,
              "skip_json": args.skip_json, "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
