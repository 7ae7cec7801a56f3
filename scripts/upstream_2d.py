"""pytorch/examples' 2D example, as its repository has it, recorded by gpuscope and profiled by
torch.profiler in the same run: distributed/tensor_parallelism/fsdp_tp_example.py (its Llama2
model, FSDP2 over `dp`, tensor + sequence parallel over `tp`) on 4 CPU ranks over gloo.

    python scripts/upstream_2d.py --examples PATH [--runs 1] [--iterations 10] [--keep DIR]

PATH is a checkout of https://github.com/pytorch/examples (BSD-3-Clause). Nothing of it is kept
in this repository: its tensor_parallelism folder is copied to a temporary directory and the
changes in CHANGES are applied to the copy, each a small text replacement, named below:
the CPU adaptations (the example exits without 4 GPUs and asks for the accelerator's device
type; DTensor has no sharding rule for the CPU flash-attention kernel, so the copy registers
one: heads sharded in and out) and the instrumentation (gpuscope.record around the loop, torch.profiler's schedule, the loop's
own perf_counter at each iteration's end).

Compares, over the steps the profiler captured, communication from the record with the traces'
(issue 26's bar: within 20%), lists the process groups each source attributes to `dp` and `tp`,
both verdicts, the dimension named as holding the step back, and gpuscope's step time against
the loop's own. Writes benchmarks/results/upstream_2d.json (docs/performance.md is generated
from it by scripts/make_performance_doc.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
EXAMPLE = os.path.join("distributed", "tensor_parallelism")
SCRIPT = "fsdp_tp_example.py"

# (why, the text in the example, what it becomes); each must occur exactly once
CHANGES = [
    ("CPU: the example exits when fewer than 4 GPUs are visible",
     "if not verify_min_gpu_count(min_gpus=_min_gpu_count):",
     "if False:"),
    ("CPU: the device type (the example asks the accelerator)",
     "device_type = torch.accelerator.current_accelerator().type",
     "device_type = 'cpu'"),
    ("CPU: DTensor has no sharding rule for the CPU flash-attention kernel (and the math "
     "kernel adds a plain causal mask to DTensor scores): one is registered, heads sharded in "
     "and out, as attention is independent per head; then recording and profiling start "
     "before the loop",
     "for i in range(num_iterations):",
     "import time as _time, gpuscope as _gs\n"
     "from torch.distributed.tensor.experimental import register_sharding as _reg\n"
     "_fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu\n"
     "_fab = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward\n"
     "@_reg(_fa.default)\n"
     "def _heads(q, k, v, *rest, **kw):\n"
     "    return [([Shard(1)] * 2, [Shard(1)] * 3 + [None] * len(rest)),\n"
     "            ([Replicate()] * 2, [Replicate()] * 3 + [None] * len(rest))]\n"
     "@_reg(_fab.default)\n"
     "def _heads_back(g, q, k, v, o, lse, *rest, **kw):\n"
     "    return [([Shard(1)] * 3, [Shard(1)] * 6 + [None] * len(rest)),\n"
     "            ([Replicate()] * 3, [Replicate()] * 6 + [None] * len(rest))]\n"
     "from torch.profiler import profile as _profile, schedule as _schedule, "
     "ProfilerActivity as _PA, tensorboard_trace_handler as _handler\n"
     "num_iterations = int(os.environ['UPSTREAM_ITERATIONS'])\n"
     "_OUT = os.environ['UPSTREAM_OUT']\n"
     "_prof = _profile(activities=[_PA.CPU], schedule=_schedule(wait=1, warmup=1, "
     "active=num_iterations - 3, repeat=1), on_trace_ready=_handler(os.path.join(_OUT, "
     "'kineto'), use_gzip=True))\n_prof.start()\n"
     "_rec = _gs.record(os.path.join(_OUT, 'record'), model=sharded_model).start()\n"
     "_marks = [_time.perf_counter()]\n"
     "for i in _rec.data(range(num_iterations)):"),
    ("each iteration closes a step of the recorder, the profiler and the loop's own clock",
     "    optimizer.step()\n",
     "    optimizer.step()\n    _rec.step()\n    _prof.step()\n"
     "    _marks.append(_time.perf_counter())\n"),
    ("both stop after the loop; the loop's own step times are written",
     'rank_log(_rank, logger, "2D training successfully completed!")',
     "_rec.stop()\n_prof.stop()\n"
     "import json as _json\n"
     "_json.dump([b - a for a, b in zip(_marks, _marks[1:])], "
     "open(os.path.join(_OUT, f'steps-rank{_rank}.json'), 'w'))\n"
     'rank_log(_rank, logger, "2D training successfully completed!")'),
]


def prepare(examples: str, into: str) -> str:
    """The example's folder copied into `into` with CHANGES applied; the script's path."""
    src = os.path.join(examples, EXAMPLE)
    if not os.path.exists(os.path.join(src, SCRIPT)):
        sys.exit(f"{os.path.join(src, SCRIPT)} not found: --examples is a pytorch/examples checkout")
    dst = os.path.join(into, "tensor_parallelism")
    shutil.copytree(src, dst)
    path = os.path.join(dst, SCRIPT)
    text = open(path).read()
    for why, old, new in CHANGES:
        if text.count(old) != 1:
            sys.exit(f"the example changed: {old!r} occurs {text.count(old)} times ({why})")
        text = text.replace(old, new)
    with open(path, "w") as fh:
        fh.write(text)
    return path


def one_run(script: str, out: str, iterations: int) -> dict:
    import gpuscope
    from gpuscope.readers import read_path

    env = dict(os.environ, OMP_NUM_THREADS="1", UPSTREAM_OUT=out,
               UPSTREAM_ITERATIONS=str(iterations))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "4", os.path.basename(script)],
                          cwd=os.path.dirname(script), env=env, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"the example failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    kin = read_path(os.path.join(out, "kineto")).frame
    rec = read_path(os.path.join(out, "record")).frame
    rec = rec[rec["step"].isin(set(kin["step"]))]
    ours, theirs = float(rec["comm_ns"].sum()) / 1e6, float(kin["comm_ns"].sum()) / 1e6
    r_rep = gpuscope.analyze(os.path.join(out, "record"))
    k_rep = gpuscope.analyze(os.path.join(out, "kineto"))
    loop = {r: json.load(open(os.path.join(out, f"steps-rank{r}.json"))) for r in range(4)}
    analysed = sorted({s.step for s in r_rep.steps})  # the loop's step i is the recorder's i
    step_pairs = []
    for r in r_rep.ranks:
        own = [loop[r.rank][s] for s in analysed if s < len(loop[r.rank])]
        step_pairs.append({"rank": r.rank, "gpuscope_ms": round(r.step_ns / 1e6, 2),
                           "loop_ms": round(1e3 * sum(own) / len(own), 2)})
    groups = [{k: getattr(g, k) for k in ("group", "dim", "ranks", "kinds", "comm_ms",
                                          "exposed_ms")} for g in r_rep.comm_by_group]
    return {"wall_s": round(wall, 1), "profiled_rows": [len(rec), len(kin)],
            "record_comm_ms": round(ours, 1), "trace_comm_ms": round(theirs, 1),
            "record_over_trace": round(ours / theirs, 4) if theirs else None,
            "groups": groups,
            "record": {"verdict": r_rep.verdict.label, "confidence": r_rep.verdict.confidence,
                       "stragglers": r_rep.straggler_ranks,
                       "holds_back": (r_rep.layout.get("mesh") or {}).get("holds_back"),
                       "suggestions": [s.knob for s in r_rep.suggestions]},
            "trace": {"verdict": k_rep.verdict.label, "confidence": k_rep.verdict.confidence,
                      "stragglers": k_rep.straggler_ranks,
                      "mesh_dims": sorted(set((k_rep.knobs.get("mesh_dims") or {}).values()))},
            "step_ms": step_pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", required=True, help="a checkout of pytorch/examples")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=10, help="the example's own: 10")
    ap.add_argument("--keep", help="keep each run's record and traces under this folder")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "upstream_2d.json"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", args.examples, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or None
    ours = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or None
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        script = prepare(args.examples, tmp)
        for i in range(args.runs):
            out = os.path.join(args.keep or tmp, f"run{i + 1}")
            os.makedirs(out, exist_ok=True)
            r = one_run(script, out, args.iterations)
            runs.append(r)
            print(f"run {i + 1}: comm record {r['record_comm_ms']} ms, trace "
                  f"{r['trace_comm_ms']} ms ({r['record_over_trace']}); record "
                  f"{r['record']['verdict']} ({r['record']['confidence']}), holds back "
                  f"{r['record']['holds_back']}; trace {r['trace']['verdict']}")
    import torch

    doc = {"example": f"pytorch/examples {EXAMPLE}/{SCRIPT}", "examples_commit": commit,
           "commit": ours, "torch": torch.__version__, "ranks": 4, "backend": "gloo",
           "cpu_count": os.cpu_count(), "iterations": args.iterations,
           "changes": [why for why, _, _ in CHANGES], "runs": runs}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
