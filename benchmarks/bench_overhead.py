"""Recording overhead: the same 2-rank DDP run with and without gpuscope, side by side.

Runs are interleaved (without, with, without, with, ..., the order rotated every round) so that
machine drift and a slot's position in the round hit all variants alike;
the figure is the ratio of median step times over all steps of all runs (warm-up steps dropped),
with each round's own ratio beside it.
A second, noise-free figure: the recorder's own cost per step (data wrapper + hooks + step()),
timed in a tight loop in one process, against the median step time.

    python benchmarks/bench_overhead.py [--scenario compute] [--runs 5] [--steps 60]
    python benchmarks/bench_overhead.py --device cuda --nproc 1   # on a GPU (NCCL), CUDA events on

With --live-every N (default 10) a third run of each pair records with live diagnosis on
(record(live_every=N)); and the exchange's own cost is timed on 2 ranks in a tight loop: the
rec.step() that starts an exchange (flush + all_gather launch) and the flush that polls it,
against the plain step()s in between.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from measured import commit  # noqa: E402  (benchmarks/measured.py)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gpuscope.demo.launch import run_training  # noqa: E402


def step_times(paths, record: bool, warmup: int, live: int = 0) -> list[float]:
    """Step times (s) of the runs in the timings file(s) `paths` that recorded or not (and with
    live diagnosis every `live` steps), warm-up steps dropped."""
    out = []
    for path in [paths] if isinstance(paths, str) else paths:
        with open(path) as fh:
            for line in fh:
                d = json.loads(line)
                if d["record"] == record and d.get("live_every", 0) == live:
                    out += d["step_s"][warmup:]
    return out


_LIVE_COST = r"""
import json, os, sys, time
import torch.distributed as dist
import gpuscope
dist.init_process_group("gloo")
rank, every, n = dist.get_rank(), int(sys.argv[1]), 2000
d = sys.argv[2]
def loop(rec):
    times = []
    for _ in rec.data(range(n)):
        time.sleep(0.0005)  # the step's own work, outside the timed call
        t = time.perf_counter_ns()
        rec.step()
        times.append(time.perf_counter_ns() - t)
    return times
with gpuscope.record(os.path.join(d, "plain"), telemetry=False, flush_rows=every,
                     flush_s=3600) as rec:
    plain = loop(rec)
dist.barrier()
with gpuscope.record(os.path.join(d, "live"), telemetry=False, live_every=every, live_log=False,
                     flush_rows=every, flush_s=3600) as rec:
    live = loop(rec)
    got = len(rec.live_summaries)
if rank == 0:
    exch = sorted(live[every - 1::every])
    print(json.dumps({"plain_total_us": sum(plain) / 1e3, "live_total_us": sum(live) / 1e3,
                      "steps": n, "every": every, "exchange_step_us_median": exch[len(exch) // 2] / 1e3,
                      "diagnoses": got}))
dist.destroy_process_group()
"""


def live_cost(every: int) -> dict:
    """The live exchange's cost per step on 2 real ranks: time in rec.step() with it on, minus
    without; both flush their rows every `every` steps, so the difference is the exchange
    (launch and polls). Each step sleeps 0.5 ms outside the timed rec.step()."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "live_cost.py")
        with open(script, "w") as fh:
            fh.write(_LIVE_COST)
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node", "2", script, str(every), d],
                             capture_output=True, text=True, check=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads([x for x in out.stdout.splitlines() if x.startswith("{")][-1])


def recorder_cost_per_step(n: int = 20000) -> float:
    """Seconds per step that the recorder itself adds: data wrapper, a phase, step()."""
    import gpuscope

    with tempfile.TemporaryDirectory() as d:
        data = list(range(n))
        t = time.perf_counter()
        for _ in data:
            pass
        base = time.perf_counter() - t
        with gpuscope.record(d) as rec:
            t = time.perf_counter()
            for _ in rec.data(data):
                rec.step()
            spent = time.perf_counter() - t
    return (spent - base) / n


def side_file_cost_per_row(n: int = 2000) -> float:
    """Seconds per DDP step row spent on the column side file (batches of 16 rows with their
    collectives): made on the training thread at each flush, with the rows' JSON (writer.py)."""
    from gpuscope.record.columns import Chunk

    row = [5, 1_790_000_000_080_064_112, 80_711_471, 2_273_923, 62_355_406, 15_062_845,
           15_585_151, 496_991, 19_209_455, 41_030_794, 2_115_157, 1, 227_392, 1, 0,
           {"_comm": {"all_reduce:ddp": [15_062_845, 15_585_151, 4]}}]
    rows = [list(row) for _ in range(16)]
    data = ("\n".join(json.dumps(r, separators=(",", ":")) for r in rows) + "\n").encode()
    chunk = Chunk(0)
    t = time.perf_counter()
    for _ in range(n):
        if chunk.full:
            chunk.to_bytes()
            chunk = Chunk(chunk.offset + chunk.length)
        chunk.add_rows(rows, data)
    return (time.perf_counter() - t) / (n * len(rows))


_DDP_COST = r"""
import json, os, statistics, sys, tempfile, time
import torch, torch.distributed as dist
from torch import nn
import gpuscope
torch.set_num_threads(1)
device, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = tempfile.mkdtemp()
dist.init_process_group("nccl" if device == "cuda" else "gloo",
                        init_method=f"file://{d}/store", rank=0, world_size=1)
torch.manual_seed(0)
def make():
    m = nn.Linear(8, 8).to(device)
    ddp = nn.parallel.DistributedDataParallel(m, device_ids=[0] if device == "cuda" else None)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)
plain, plain_opt = make()   # never seen by gpuscope
recm, rec_opt = make()      # recorded
x = torch.randn(4, 8, device=device)
data = [x] * n
def loop(model, opt, it, rec=None):
    if device == "cuda": torch.cuda.synchronize()
    t = time.perf_counter()
    for b in it:
        opt.zero_grad(); model(b).sum().backward(); opt.step()
        if rec is not None: rec.step()
    if device == "cuda": torch.cuda.synchronize()
    return (time.perf_counter() - t) / n
warm = [x] * 20
with_, without = [], []
for i in range(rounds):  # interleaved, the order swapped every round
    for which in ((1, 0) if i % 2 else (0, 1)):
        if which:  # a recording of its own each round: the plain rounds run with none open
            with gpuscope.record(os.path.join(d, f"run{i}"), model=recm) as rec:
                loop(recm, rec_opt, rec.data(warm), rec)
                with_.append(loop(recm, rec_opt, rec.data(data), rec))
        else:
            loop(plain, plain_opt, warm)
            without.append(loop(plain, plain_opt, data))
diff = [a - b for a, b in zip(with_, without)]
print(json.dumps({"with_us": statistics.median(with_) * 1e6,
                  "without_us": statistics.median(without) * 1e6,
                  "cost_us": statistics.median(diff) * 1e6,
                  "round_costs_us": [round(c * 1e6, 1) for c in diff]}))
os._exit(0)
"""


def recorder_cost_ddp(device: str = "cpu", rounds: int = 201, steps: int = 400) -> dict:
    """Per-step cost of the whole recorder on a tiny one-rank DDP model (forward, backward and
    optimizer hooks, the DDP tail timer, NVML, the data wrapper, step(), the flushes): the tiny
    model makes the fixed per-step cost visible. One process holds a recorded model and a plain
    one, timed in interleaved short rounds (a slow spell of this VM moves both of a pair); each
    recorded round opens a recording of its own and the plain rounds run with none open (the
    process-wide hooks, backward and optimizer, are not installed then); 20 untimed steps
    before each. The figure is the median of the rounds' differences."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _DDP_COST, device, str(rounds), str(steps)],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])




_COLL_COST = r"""
import json, os, statistics, sys, tempfile, time, warnings
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import gpuscope
warnings.simplefilter("ignore")
torch.set_num_threads(1)
device, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = tempfile.mkdtemp()
dist.init_process_group("nccl" if device == "cuda" else "gloo",
                        init_method=f"file://{d}/store", rank=0, world_size=1)
x = torch.zeros(256, device=device)
out = torch.zeros(256, device=device)
def blocking():
    dist.all_reduce(x)
def async_wait():  # FSDP's shape: launched async, waited on later
    dist.all_gather_into_tensor(out, x, async_op=True).wait()
def functional():  # DTensor's: a functional collective and its wait
    funcol.all_reduce(x, "sum", dist.group.WORLD).wait()
def loop(fn, rec=None):
    if device == "cuda": torch.cuda.synchronize()
    t = time.perf_counter_ns()
    for i in range(n):
        fn()
        if rec is not None and i % 16 == 15: rec.step()  # rows stay bounded; ~0.3 us a call
    if device == "cuda": torch.cuda.synchronize()
    return (time.perf_counter_ns() - t) / n / 1e3
res = {}
for name, fn in (("blocking", blocking), ("async_wait", async_wait), ("functional", functional)):
    loop(fn)
    with_, without = [], []
    for i in range(rounds):  # interleaved, the order swapped every round
        for which in ((1, 0) if i % 2 else (0, 1)):
            if which:
                with gpuscope.record(os.path.join(d, f"{name}{i}"), memory=False,
                                     telemetry=False) as rec:
                    with_.append(loop(fn, rec))
            else:
                without.append(loop(fn))
    diff = [a - b for a, b in zip(with_, without)]
    res[name] = {"without_us": round(statistics.median(without), 2),
                 "with_us": round(statistics.median(with_), 2),
                 "cost_us": round(statistics.median(diff), 2),
                 "round_costs_us": [round(c, 2) for c in diff]}
print(json.dumps(res))
os._exit(0)
"""


def recorder_cost_per_collective(device: str = "cpu", rounds: int = 15, n: int = 3000) -> dict:
    """What timing one collective adds to the call, per path: a blocking one, an async one
    waited on (FSDP's), a functional one and its wait (DTensor's); one rank, in one process,
    interleaved rounds with and without a recording, the median of the rounds' differences."""
    out = subprocess.run([sys.executable, "-c", _COLL_COST, device, str(rounds), str(n)],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="compute")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per local rank)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--backend", default=None, help="gloo / nccl (default: by device)")
    ap.add_argument("--live-every", type=int, default=10,
                    help="also runs with live diagnosis every N steps (0: not)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "overhead.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rounds = [os.path.join(tmp, f"timings-{i}.jsonl") for i in range(args.runs)]
        for i, timings in enumerate(rounds):
            variants = [(False, 0), (True, 0)] + ([(True, args.live_every)]
                                                  if args.live_every else [])
            shift = i % len(variants)  # each variant in each position of the round in turn
            variants = variants[shift:] + variants[:shift]
            for record, live in variants:
                extra = ("--timings", timings, "--device", args.device) + \
                    (("--backend", args.backend) if args.backend else ()) + \
                    (() if record else ("--no-record",)) + \
                    (("--live-every", str(live)) if live else ())
                try:
                    run_training(args.scenario, os.path.join(tmp, f"run{i}"), args.steps,
                                 args.nproc, extra=extra)
                except subprocess.CalledProcessError as exc:
                    sys.exit(f"training failed (exit {exc.returncode}):\n{exc.stderr[-3000:]}")
                what = ("with gpuscope" + (f", live every {live}" if live else "")
                        if record else "without gpuscope")
                print(f"run {i + 1}/{args.runs} {what}", flush=True)
        without = step_times(rounds, False, args.warmup)
        with_ = step_times(rounds, True, args.warmup)
        with_live = step_times(rounds, True, args.warmup, args.live_every) \
            if args.live_every else []
        # each round's own ratio (its runs ran minutes apart at most): how far the pooled
        # ratio is from noise
        med = statistics.median
        ratios = [med(step_times(r, True, args.warmup)) / med(step_times(r, False, args.warmup))
                  for r in rounds]
        ratios_live = [med(step_times(r, True, args.warmup, args.live_every))
                       / med(step_times(r, False, args.warmup))
                       for r in rounds] if args.live_every else []
    med_without, med_with = statistics.median(without), statistics.median(with_)
    per_step = recorder_cost_per_step()
    ddp = recorder_cost_ddp(args.device)
    ddp_cost = ddp["cost_us"] / 1e6
    result = {
        "scenario": args.scenario, "runs_each": args.runs, "steps_per_run": args.steps,
        "ranks": args.nproc, "device": args.device,
        "median_step_ms_without": round(med_without * 1e3, 3),
        "median_step_ms_with": round(med_with * 1e3, 3),
        "ratio_with_over_without": round(med_with / med_without, 4),
        "overhead_pct": round((med_with / med_without - 1) * 100, 2),
        "round_ratios": [round(r, 4) for r in ratios],
        "recorder_cost_us_per_step": round(per_step * 1e6, 2),
        "recorder_cost_pct_of_step": round(per_step / med_without * 100, 3),
        "ddp_tiny_step_us_without": round(ddp["without_us"], 1),
        "ddp_tiny_step_us_with": round(ddp["with_us"], 1),
        "recorder_cost_ddp_us_per_step": round(ddp_cost * 1e6, 1),
        "recorder_cost_ddp_round_costs_us": ddp["round_costs_us"],
        "recorder_cost_ddp_pct_of_step": round(ddp_cost / med_without * 100, 3),
        "side_file_us_per_row": round(side_file_cost_per_row() * 1e6, 2),
        "recorder_cost_per_collective_us": recorder_cost_per_collective(args.device),
        "cpu_count": os.cpu_count(),
        "commit": commit(),
    }
    if with_live:
        med_live = statistics.median(with_live)
        lc = live_cost(args.live_every)
        per_step_live = (lc["live_total_us"] - lc["plain_total_us"]) / lc["steps"] / 1e6
        result.update({
            "live_every": args.live_every,
            "median_step_ms_with_live": round(med_live * 1e3, 3),
            "ratio_with_live_over_without": round(med_live / med_without, 4),
            "round_ratios_live": [round(r, 4) for r in ratios_live],
            "overhead_live_pct": round((med_live / med_without - 1) * 100, 2),
            "live_exchange_step_us_median": round(lc["exchange_step_us_median"], 1),
            "live_cost_us_per_step": round(per_step_live * 1e6, 2),
            "live_cost_pct_of_step": round(per_step_live / med_without * 100, 3),
            "live_diagnoses_in_cost_run": lc["diagnoses"],
        })
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
