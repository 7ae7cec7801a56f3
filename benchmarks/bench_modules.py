"""The cost of record(modules=...): the same nanoGPT-style training (tests/workloads/cases.py's
GPT, one process, CPU, one thread) recorded with modules off, with modules=True (the model's
direct children) and with twelve submodules named (the most record() times),
side by side: the variants interleaved within each round, the order rotated every round.

The figures are each variant's median step time over all rounds and the time added per step
against modules off; a step of tens of ms varies by more than the hooks cost, so the cost per
timed forward call is measured apart, in a tight loop: an nn.Identity called 200,000 times with
and without the two hooks (host clock), interleaved over the rounds (a GPU records two CUDA
events per call instead of reading the clock twice).

    python benchmarks/bench_modules.py [--rounds 7] [--steps 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from measured import commit  # noqa: E402  (benchmarks/measured.py)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "workloads"))


def _per_call_ns(rounds: int, n: int = 200_000) -> float:
    """What the two hooks add to one forward call (ns): an nn.Identity with and without them,
    n calls a loop, the loops interleaved; the median over rounds of the difference."""
    import torch

    from gpuscope.record.modules import ModuleTimer

    x = torch.zeros(1)
    plain, hooked = torch.nn.Identity(), torch.nn.Identity()
    timer = ModuleTimer(["m"], [hooked], time.perf_counter_ns)
    timer.install()

    def loop(m) -> float:
        t = time.perf_counter_ns()
        for _ in range(n):
            m(x)
        return (time.perf_counter_ns() - t) / n

    diffs = []
    for r in range(rounds):
        a, b = (loop(plain), loop(hooked)) if r % 2 == 0 else reversed((loop(hooked),
                                                                         loop(plain)))
        diffs.append(b - a)
        timer.step_end(r)
    timer.remove()
    return statistics.median(diffs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "modules.json"))
    args = ap.parse_args()
    import torch

    import gpuscope
    from cases import GPT
    from gpuscope.readers import read_path

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(layers=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    every = [n for n, m in model.named_modules() if n and not isinstance(m, torch.nn.ModuleList)]
    variants = {"off": None, "children": True, "twelve": every[:12]}
    x = torch.randint(0, 512, (8, 64))

    def run(which) -> tuple[list[float], int]:
        times = []
        with tempfile.TemporaryDirectory() as d:
            kw = {"modules": which} if which is not None else {}
            with gpuscope.record(d, model=model, telemetry=False, memory=False, **kw) as rec:
                for _ in range(args.steps):
                    t = time.perf_counter()
                    _, loss = model(x, x)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    rec.step()
                    times.append(time.perf_counter() - t)
            ops = read_path(d).ops  # the timed forwards, as the record file holds them
            calls = int(ops["count"].sum()) / args.steps if ops is not None else 0
        return times[2:], calls  # the first steps warm up

    names = list(variants)
    steps: dict = {n: [] for n in names}
    calls: dict = {}  # timed forward calls per step, as recorded
    run(None)  # imports, first allocations
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            got, calls[n] = run(variants[n])
            steps[n] += got
    med = {n: statistics.median(v) for n, v in steps.items()}
    per_call = _per_call_ns(args.rounds)
    timed = {"off": 0, "children": len(list(model.children())), "twelve": 12}
    result = {"commit": commit(), "python": sys.version.split()[0], "torch": torch.__version__,
              "rounds": args.rounds, "steps_per_round": args.steps,
              "model": "tests/workloads/cases.py GPT(layers=4), batch 8 x 64, AdamW, CPU 1 thread",
              "variants": {}}
    for n in names:
        added = med[n] - med["off"]
        result["variants"][n] = {
            "modules_timed": timed[n], "forward_calls_per_step": calls[n],
            "median_step_ms": round(med[n] * 1e3, 3),
            "step_minus_off_us": round(added * 1e6, 1),
            "added_us_per_step_from_calls": round(calls[n] * per_call / 1e3, 2)}
    result["hook_ns_per_call"] = round(per_call, 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result["variants"], indent=1))


if __name__ == "__main__":
    main()
