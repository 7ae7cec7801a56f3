"""Issue 51's cases on a real GPU, each beside its truth (the loop's own perf_counter between
torch.cuda.synchronize() calls, or what was injected), in one short run:

  straggler  2 ranks sharing GPU 0 over gloo, DDP on a 3-layer MLP; rank 1 also runs 15 fp32
             4096x4096 matmuls in its forward, queued on the GPU; recorded and profiled in one
             run. Truth: those matmuls' time, by perf_counter between synchronizes.
  mfu        1 rank (NCCL), DDP on nn.TransformerEncoder (8 layers, d 1024) under bf16 and fp16
             autocast, fp32 with TF32 allowed, and plain fp32; count_flops=True. Truth: 6NT +
             attention over the step's perf_counter time, over the dtype's dense peak.
  overhead   the launch-bound 3-layer MLP (1 rank, NCCL, batch 64), plain and recorded (every
             default on) in interleaved blocks of 300 steps: the cost per step in steps 10-63
             and 64-299; the same with device_timing=False; a ~20 ms GPU-bound step likewise;
             and what single CUDA calls cost (Event.record with and without a stream, query,
             elapsed_time, the allocator's statistics).
  oom        1 rank (NCCL), set_per_process_memory_fraction(0.04), 512 MiB kept per step until
             torch.OutOfMemoryError inside the recording. Truth: the step it died in.
  data       1 rank (NCCL), a Dataset sleeping 2 ms an item (batch 16, repeated 16x on the GPU,
             6 x Linear(2048)), num_workers=0, pin_memory=True: gpuscope's num_workers proposal
             and estimate, then the loop re-run with it. Truth: the re-run's mean step.

Prints one JSON line per check ({"check", "ok", figures}) and writes them to OUT/truths.jsonl,
each run dir under OUT. `--device cpu` runs the same plumbing without a GPU (figures then say
nothing of a GPU). Exit 1 when a check fails.

    python scripts/gpu_truths.py --out DIR [--only straggler,mfu,...] [--device cuda]
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
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CASES = ("straggler", "mfu", "overhead", "oom", "data")


# ----------------------------------------------------------------- helpers run in workers
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _init_single(device: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        d = tempfile.mkdtemp()
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                init_method=f"file://{d}/store", rank=0, world_size=1)


def _mlp(device: str, width: int = 512, layers: int = 3):
    from torch import nn

    mods = []
    for i in range(layers - 1):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 10))
    return nn.Sequential(*mods).to(device)


# ----------------------------------------------------------------- straggler (worker)
def worker_straggler(out: str, device: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    import gpuscope

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if device.startswith("cuda"):
        torch.cuda.set_device(0)
    torch.manual_seed(rank)
    n = 4096 if device.startswith("cuda") else 512
    big = torch.randn(n, n, device=device)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _mlp(device)

        def forward(self, x):
            if rank == 1:  # queued on the GPU: nothing on the host waits for them here
                y = big
                for _ in range(15):
                    y = y @ big
                    y = y / y.norm()
                self.sink = y
            return self.net(x)

    model = DDP(Model().to(device), device_ids=None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device=device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    prof = profile(activities=acts, schedule=schedule(wait=5, warmup=2, active=12),
                   on_trace_ready=tensorboard_trace_handler(os.path.join(out, "kineto")))
    _sync(device)
    with gpuscope.record(os.path.join(out, "record"), model=model) as rec, prof:
        for _ in rec.data(range(steps)):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            rec.step()
            prof.step()
    _sync(device)
    extra = []
    if rank == 1:  # the truth: the extra work's own time, between synchronizes
        for _ in range(8):
            _sync(device)
            t0 = time.perf_counter()
            y = big
            for _ in range(15):
                y = y @ big
                y = y / y.norm()
            _sync(device)
            extra.append(time.perf_counter() - t0)
        with open(os.path.join(out, "truth.json"), "w") as fh:
            json.dump({"extra_ms": 1e3 * statistics.median(extra[2:])}, fh)
    dist.barrier()
    dist.destroy_process_group()


def case_straggler(out: str, device: str, check) -> None:
    import gpuscope

    out = os.path.join(out, "straggler")
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", __file__, "--worker", "straggler",
                           "--out", out, "--device", device], capture_output=True, text=True,
                          timeout=240, env=env)
    if proc.returncode:
        raise RuntimeError(f"straggler run rc {proc.returncode}: {proc.stderr[-2500:]}")
    with open(os.path.join(out, "truth.json")) as fh:
        truth = json.load(fh)["extra_ms"]
    rec = gpuscope.analyze(os.path.join(out, "record"))
    kin = gpuscope.analyze(os.path.join(out, "kineto"))
    ex = {name: (r.stragglers[0].excess_ns / 1e6 if r.stragglers else None)
          for name, r in (("record", rec), ("kineto", kin))}
    knobs = [s.knob for s in rec.suggestions]
    check("straggler/record names rank 1", rec.straggler_ranks == [1]
          and rec.verdict.label == "imbalanced", verdict=rec.verdict.label,
          confidence=rec.verdict.confidence, stragglers=rec.straggler_ranks,
          excess_ms=ex["record"], truth_ms=truth,
          cause=rec.stragglers[0].part if rec.stragglers else None, suggestions=knobs)
    check("straggler/record excess within 15% of the truth",
          ex["record"] is not None and abs(ex["record"] - truth) <= 0.15 * truth,
          excess_ms=ex["record"], truth_ms=truth)
    check("straggler/no batch or sync advice from the waiting",
          not {"batch_size", "sync_frequency", "grad_compression"} & set(knobs), suggestions=knobs)
    check("straggler/traces name rank 1", kin.straggler_ranks == [1], verdict=kin.verdict.label,
          stragglers=kin.straggler_ranks, excess_ms=ex["kineto"])
    both = ex["record"] is not None and ex["kineto"] is not None
    check("straggler/record and traces agree within 15%",
          both and abs(ex["record"] - ex["kineto"]) <= 0.15 * max(ex["record"], ex["kineto"]),
          record_ms=ex["record"], kineto_ms=ex["kineto"])


# ----------------------------------------------------------------- MFU
def case_mfu(out: str, device: str, check) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gpuscope
    from gpuscope.analyze.throughput import PEAKS

    _init_single(device)
    cuda = device.startswith("cuda")
    d_model, layers, heads, ff = (1024, 8, 16, 4096) if cuda else (128, 2, 4, 256)
    batch, seq = (8, 512) if cuda else (2, 64)
    peaks = next(p for pat, label, p in PEAKS if label == "H200")
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    for how in ("bf16", "fp16", "tf32", "fp32"):
        steps = 30 if how in ("bf16", "fp16") else 16
        torch.manual_seed(0)
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(
            d_model, heads, ff, batch_first=True, dropout=0.0), layers).to(device)
        model = DDP(enc)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(batch, seq, d_model, device=device)
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if how == "tf32" else "highest")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(how)
        times = []
        try:
            with gpuscope.record(os.path.join(out, "mfu", how), model=model,
                                 count_flops=True) as rec:
                for i in rec.data(range(steps)):
                    _sync(device)
                    t0 = time.perf_counter()
                    if dtype is not None:
                        with torch.autocast(device.split(":")[0], dtype=dtype):
                            y = model(x)
                    else:
                        y = model(x)
                    y.float().pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    rec.step()
                    _sync(device)
                    times.append(time.perf_counter() - t0)
        finally:
            torch.set_float32_matmul_precision(before)
        n_params = sum(p.numel() for p in enc.parameters())
        tokens = batch * seq
        # 6NT for the weights' matmuls, and attention's QK^T and AV: 12 x layers x seq x d per
        # token (forward 4, backward 8), as nanoGPT's estimate_mfu counts it
        flops = 6 * n_params * tokens + 12 * layers * seq * d_model * tokens
        t = statistics.mean(times[5:]) if len(times) > 6 else None
        rep = gpuscope.analyze(os.path.join(out, "mfu", how))
        th = rep.throughput.to_dict() if rep.throughput else {}  # as the JSON has it
        key = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp32": "fp32"}[how]
        truth = 100 * flops / t / (peaks[key] * 1e12) if t and cuda else None
        got = th.get("mfu_pct")
        check(f"mfu/{how}: against the {key} peak, within 10% of 6NT + attention",
              (got is not None and truth is not None and abs(got - truth) <= 0.1 * truth
               and f"dense {key} " in th.get("peak_source", "")) if cuda else got is None,
              mfu_pct=got, truth_pct=None if truth is None else round(truth, 2),
              peak=th.get("peak_source"), flops_counted=th.get("flops_per_step"),
              flops_by_hand=flops, step_ms=None if t is None else round(1e3 * t, 3),
              device=name, knobs={k: rep.knobs.get(k) for k in (
                  "autocast_dtype", "float32_matmul_precision", "flops_by_dtype")})
        del model, enc, opt
        if cuda:
            torch.cuda.empty_cache()


# ----------------------------------------------------------------- overhead
def _loop_blocks(make, device, blocks, steps, record_kw, out, tag):
    """Interleaved plain / recorded blocks; per block, perf_counter per step (no sync per
    step: a launch-bound loop's host is its step)."""
    import gpuscope

    model, opt, x = make()
    res = {"plain": [], "recorded": []}

    def one(recorded: bool, k: int):
        times = []
        _sync(device)
        ctx = gpuscope.record(os.path.join(out, f"{tag}-{k}"), model=model, **record_kw) \
            if recorded else None
        if ctx is not None:
            ctx.start()
        t_prev = time.perf_counter()
        it = ctx.data(range(steps)) if ctx is not None else range(steps)
        for _ in it:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if ctx is not None:
                ctx.step()
            t = time.perf_counter()
            times.append(t - t_prev)
            t_prev = t
        _sync(device)
        if ctx is not None:
            ctx.stop()
        return times

    one(False, -1)  # warm-up: kernels, allocator, NCCL
    for k in range(blocks):
        for recorded in ((False, True) if k % 2 == 0 else (True, False)):
            res["recorded" if recorded else "plain"].append(one(recorded, k))
    return res


def _costs(res, lo, hi):
    """Per round, the recorded block's mean step minus the plain's, us (steps lo..hi-1)."""
    out = []
    for p, r in zip(res["plain"], res["recorded"]):
        out.append(1e6 * (statistics.mean(r[lo:hi]) - statistics.mean(p[lo:hi])))
    return [round(c, 1) for c in out]


def case_overhead(out: str, device: str, check) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    _init_single(device)
    cuda = device.startswith("cuda")

    def small():
        torch.manual_seed(0)
        m = DDP(_mlp(device))
        return m, torch.optim.SGD(m.parameters(), lr=1e-3), torch.randn(64, 512, device=device)

    def big():
        torch.manual_seed(0)
        w = 4096 if cuda else 256
        m = DDP(_mlp(device, w, 8))
        return m, torch.optim.SGD(m.parameters(), lr=1e-3), \
            torch.randn(1024 if cuda else 64, w, device=device)

    res = _loop_blocks(small, device, 6, 300, {}, os.path.join(out, "overhead"), "small")
    plain = 1e3 * statistics.median(s for b in res["plain"] for s in b[64:])
    young, steady = _costs(res, 10, 64), _costs(res, 64, 300)
    check("overhead/launch-bound: <= 50 us a step, steps 10-63 and 64-299",
          statistics.median(young) <= 50 and statistics.median(steady) <= 50,
          plain_step_ms=round(plain, 4), young_us=young, steady_us=steady,
          young_median_us=statistics.median(young), steady_median_us=statistics.median(steady))
    res = _loop_blocks(small, device, 4, 300, {"device_timing": False},
                       os.path.join(out, "overhead"), "nodev")
    check("overhead/launch-bound, device_timing=False (for comparison)", True,
          young_us=_costs(res, 10, 64), steady_us=_costs(res, 64, 300))
    res = _loop_blocks(big, device, 4, 40 if cuda else 30, {}, os.path.join(out, "overhead"),
                       "big")
    plain_big = 1e3 * statistics.median(s for b in res["plain"] for s in b[5:])
    costs = _costs(res, 5, 40 if cuda else 30)
    check("overhead/GPU-bound step: under 0.2% of it", statistics.median(costs) <=
          0.002 * plain_big * 1e3, plain_step_ms=round(plain_big, 3), cost_us=costs)
    if cuda:
        check("overhead/CUDA calls, us each", True, **call_costs())


def call_costs(n: int = 5000) -> dict:
    import torch

    evs = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    s = torch.cuda.current_stream()
    out = {}

    def timed(name, fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out[name] = round(1e6 * (time.perf_counter() - t0) / n, 3)

    timed("Event.record()", lambda: [e.record() for e in evs])
    timed("Event.record(stream)", lambda: [e.record(s) for e in evs])
    torch.cuda.synchronize()
    timed("Event.query", lambda: [e.query() for e in evs])
    timed("Event.elapsed_time", lambda: [evs[i].elapsed_time(evs[i + 1])
                                         for i in range(n - 1)] + [None])
    timed("torch.cuda.current_stream", lambda: [torch.cuda.current_stream() for _ in evs])
    m = max(n // 10, 1)
    for name, fn in (("torch.cuda.memory_stats", lambda: torch.cuda.memory_stats(0)),
                     ("torch._C._cuda_memoryStats", lambda: torch._C._cuda_memoryStats(0)),
                     ("reset_peak_memory_stats", lambda: torch.cuda.reset_peak_memory_stats(0))):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(m):
            fn()
        out[name] = round(1e6 * (time.perf_counter() - t0) / m, 3)
    return out


# ----------------------------------------------------------------- OOM
def case_oom(out: str, device: str, check) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gpuscope

    if not device.startswith("cuda"):
        check("oom: needs a GPU", True, skipped=True)
        return
    _init_single(device)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.04, 0)
    allowed = 0.04 * torch.cuda.get_device_properties(0).total_memory
    model = DDP(_mlp(device))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device=device)
    kept, done, died_in = [], 0, None
    run_dir = os.path.join(out, "oom")
    try:
        with gpuscope.record(run_dir, model=model) as rec:
            for i in rec.data(range(100)):
                kept.append(torch.empty(512 << 20, dtype=torch.uint8, device=device))
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                rec.step()
                done += 1
    except torch.OutOfMemoryError:
        died_in = done
    finally:
        kept.clear()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    rep = gpuscope.analyze(run_dir)
    from gpuscope.render.terminal import render

    lines = render(rep, width=200).splitlines()
    first = lines[1] if len(lines) > 1 else ""
    d = rep.died[0].to_dict() if rep.died else {}
    text = " ".join(lines)
    check("oom: told first, in the step it died in, against what it could use",
          died_in is not None and d.get("step") == died_in and "THE RUN DIED" in first
          and d.get("cause") == "out_of_memory" and "fills" not in text,
          died_in=died_in, said_step=d.get("step"), allowed_gib=round(allowed / 2**30, 2),
          first_line=first[:300], capacity=[f.get("capacity_bytes") for f in
                                            (rep.memory.findings if rep.memory else [])])


# ----------------------------------------------------------------- data what-if
class Slow:
    """A Dataset of 2048 floats an item that takes `ms` to load (sleeping, as I/O does; or
    spinning, a CPU-bound decoder)."""

    def __init__(self, n: int, ms: float, spin: bool = False):
        self.n, self.ms, self.spin = n, ms, spin

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if self.spin:
            end = time.perf_counter() + self.ms / 1e3
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.ms / 1e3)
        return torch.full((2048,), float(i % 7))


def data_run(run_dir: str, device: str, workers: int, steps: int, spin: bool = False) -> dict:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    import gpuscope

    _init_single(device)
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(2048, 2048), nn.GELU()]
    model = DDP(nn.Sequential(*layers).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = DataLoader(Slow(100_000, 2.0, spin), batch_size=16, num_workers=workers,
                        pin_memory=device.startswith("cuda"),
                        persistent_workers=workers > 0)
    times, busy, cpu = [], [], []
    with gpuscope.record(run_dir, model=model) as rec:
        _sync(device)
        t_prev = time.perf_counter()
        for i, b in enumerate(rec.data(loader)):
            w0, c0 = time.perf_counter(), time.thread_time()
            b = b.to(device, non_blocking=True).repeat(16, 1)
            model(b).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            busy.append(time.perf_counter() - w0)
            cpu.append(time.thread_time() - c0)
            rec.step()
            if i + 1 >= steps:
                break
            t = time.perf_counter()
            times.append(t - t_prev)
            t_prev = t
        _sync(device)
    return {"mean_ms": 1e3 * statistics.mean(times[10:]),
            "median_ms": 1e3 * statistics.median(times[10:]),
            # the loop's own work after the batch came: its wall time, and the training
            # thread's CPU time in it (below the wall time: the thread waited for a core or
            # the GIL; equal: it ran, at whatever speed the core gave it)
            "work_ms": round(1e3 * statistics.median(busy[10:]), 3),
            "work_cpu_ms": round(1e3 * statistics.median(cpu[10:]), 3)}


def case_data(out: str, device: str, check) -> None:
    import gpuscope

    base = data_run(os.path.join(out, "data", "workers0"), device, 0, 60)
    rep = gpuscope.analyze(os.path.join(out, "data", "workers0"))
    s = next((x for x in rep.suggestions if x.knob == "num_workers"), None)
    if s is None:
        check("data: a num_workers proposal", False, verdict=rep.verdict.label)
        return
    again = data_run(os.path.join(out, "data", f"workers{s.proposed}"), device, int(s.proposed),
                     150)
    lo, hi = s.estimated_step_ms_range
    err = (s.estimated_step_ms - again["mean_ms"]) / again["mean_ms"]
    check("data: the estimate within 15% of the re-run, which its range holds",
          abs(err) <= 0.15 and lo <= again["mean_ms"] <= hi,
          before_ms=round(base["mean_ms"], 3), proposed=s.proposed,
          estimate_ms=round(s.estimated_step_ms, 3), range_ms=[round(lo, 3), round(hi, 3)],
          rerun_mean_ms=round(again["mean_ms"], 3), rerun_median_ms=round(again["median_ms"], 3),
          error_pct=round(100 * err, 1), why=s.why[:600])
    # what the host's own work costs when the loop's thread sleeps through the load (time.sleep
    # in the Dataset) against when it spins through it: the CPU's idle states
    spin = data_run(os.path.join(out, "data", "workers0-spin"), device, 0, 40, spin=True)
    f = {}
    for name in ("workers0", "workers0-spin", f"workers{s.proposed}"):
        t = gpuscope.analyze(os.path.join(out, "data", name)).table.frame
        f[name] = round(float(((t["step_ns"] - t["data_ns"]) / 1e6).median()), 3)
    check("data: the rest of the step (ms, median) after sleeping, after spinning, with workers",
          True, busy_ms=f, spin_mean_ms=round(spin["mean_ms"], 3),
          loop_work_ms={"workers0": base["work_ms"], "workers0-spin": spin["work_ms"],
                        f"workers{s.proposed}": again["work_ms"]},
          loop_work_cpu_ms={"workers0": base["work_cpu_ms"], "workers0-spin": spin["work_cpu_ms"],
                            f"workers{s.proposed}": again["work_cpu_ms"]})


# ----------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "straggler":
        worker_straggler(args.out, args.device, 40)
        return 0
    os.makedirs(args.out, exist_ok=True)
    results = open(os.path.join(args.out, "truths.jsonl"), "a")
    failed = []

    def check(name: str, ok: bool, **figures) -> None:
        line = json.dumps({"check": name, "ok": bool(ok), **figures}, default=str)
        print(line, flush=True)
        results.write(line + "\n")
        results.flush()
        if not ok:
            failed.append(name)

    for case in args.only.split(","):
        t0 = time.time()
        try:
            globals()[f"case_{case}"](args.out, args.device, check)
        except Exception as exc:
            check(f"{case}: ran", False, error=repr(exc)[:1500],
                  trace=traceback.format_exc()[-1500:])
        print(f"# {case}: {time.time() - t0:.1f} s", flush=True)
    print(json.dumps({"failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
