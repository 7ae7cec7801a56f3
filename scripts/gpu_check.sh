#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU (not run in CI, which has none).
# Each check has its own time limit and its own log; one failing does not stop the others.
#   truths     scripts/gpu_truths.py, issue 51's cases beside their truths (first: the round's
#              own): a straggler whose extra work is queued on the device (record and traces),
#              MFU by the dtype the maths ran in, the recorder's cost on a launch-bound and a
#              GPU-bound step (with what single CUDA calls cost), a capped OOM told first, the
#              data what-if re-run (truths.jsonl);
#   workers    benchmarks/bench_workers.py on this machine's cores (what a DataLoader worker
#              costs the loop here: the data what-if's constants);
#   doctor     gpuscope doctor: real NVML, CUDA, NCCL smoke test;
#   cases      tests/workloads/cases.py on CUDA (torch.set_default_device, as some loops do): nanoGPT
#              shape, the loop's own all_reduce (NCCL), FSDP2 (+ CUDA Kineto trace), autocast bf16,
#              no_sync, LBFGS closure, the DDP tutorial, 1 rank with NCCL; nanoGPT again on 2 ranks
#              sharing the GPU (gloo) with live diagnosis; scripts/gpu_cases.py compares each with
#              the loop's own perf_counter timing (cases.jsonl);
#   trainers   transformers' Trainer and Lightning on CUDA with gpuscope's callbacks;
#   cuda_data, cuda_imbalanced_gloo
#              the demo on CUDA: 1 rank with NCCL (CUDA events, NVML), and 2 ranks on one GPU
#              with gloo and live diagnosis every 10 steps, each recorded and profiled;
#   tests      the quick test suite on a machine where CUDA is available;
#   overhead_cases  benchmarks/bench_overhead_cases.py on CUDA: the recording overhead on the
#              loops above, each timed by itself, with and without gpuscope;
#   overhead, overhead_big  bench_overhead.py on CUDA, and a 4096-wide MLP side by side;
#   fsdp, dp   FSDP2 (NCCL) and nn.DataParallel on the GPU (scripts/gpu_parallel.py);
#   ops        scripts/gpu_ops.py: 2 ranks on GPU 0 (gloo), rank 1 runs an extra svd a step;
#              profiled with and without it, and recorded with modules=True (CUDA events): the
#              straggler named with the op, compare finds it, the module times;
#   host_causes  scripts/gpu_host_causes.py: one CUDA loop per cause of host-bound time (.item()
#              or .cpu() per element, CPU maths, tiny kernels, a first call's start-up), each
#              profiled and read: gpuscope names the cause injected (written without a GPU);
#   symm_mem   symmetric memory on one rank (NCCL): a recorded loop of one-shot all-reduces on a
#              symmetric buffer; the report should say they ran on the GPU's stream, 8 of them
#              (written without a GPU: first run on one checks the check itself).
# Everything lands in $OUT (default gpu_results): summary.txt, log.txt, gpu_runs.tgz.
# ONLY="tests cuda_data" runs just the checks named (default: all); CASES="nanogpt fsdp2" and
# TRAINERS=hf pick within those two checks. Then
#   tar xzf gpu_runs.tgz -C DIR && python scripts/gpu_samples.py DIR --summary summary.txt
# copies the CUDA runs into sample_traces/cuda/.
# Python packages gpuscope needs that the machine lacks can come as wheels in .whl/ (see the
# device notes); they are installed into /tmp/site first.
set -uo pipefail
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
W=$(mktemp -d)
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
: > "$OUT/summary.txt"

pack() {  # after every step, so that a run cut short still returns what it made
  cat "$W"/*.log > "$OUT/log.txt" 2>/dev/null
  tar czf "$OUT/gpu_runs.tgz" -C "$W" . 2>/dev/null
}

wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

step() {  # step NAME SECONDS command...
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  local t0=$SECONDS
  echo "=== $name: $*"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  tail -n 25 "$W/$name.log"
  pack
}

nvidia-smi -L | tee "$OUT/summary.txt"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name(0))" \
  | tee -a "$OUT/summary.txt"

step truths ${TRUTHS_LIMIT:-360} $PY scripts/gpu_truths.py --out "$W/truths" ${TRUTHS:+--only $TRUTHS}
cp "$W/truths/truths.jsonl" "$OUT/truths.jsonl" 2>/dev/null
step workers 60 $PY benchmarks/bench_workers.py --batches 100 --out "$OUT/workers_gpu.json"
step doctor 60 $PY -m gpuscope doctor --json "$W/doctor.json"
step ops 300 $PY scripts/gpu_ops.py --out "$W/ops"
step host_causes 150 $PY scripts/gpu_host_causes.py --out "$W/host_causes"

cases() {  # every case on CUDA, then each compared with its own timing
  local dirs=() c
  for c in ${CASES:-nanogpt allreduce fsdp2 autocast no_sync closure tutorial}; do
    local extra=(); [ $c = fsdp2 ] || [ $c = allreduce ] && extra=(--profile)
    [ $c = tutorial ] && extra=(--epochs 1)
    echo "--- $c (1 rank, NCCL)"
    timeout 90 $PY -m torch.distributed.run --standalone --nproc_per_node 1 \
        tests/workloads/cases.py --case $c --device cuda --out "$W/cases/$c" "${extra[@]}" \
        > "$W/cases-$c.log" 2>&1 || { echo "$c rc=$?"; tail -n 15 "$W/cases-$c.log"; }
    dirs+=("$W/cases/$c")
  done
  echo "--- nanogpt on 2 ranks sharing the GPU (gloo), live diagnosis every 4 steps"
  timeout 120 $PY -m torch.distributed.run --standalone --nproc_per_node 2 \
      tests/workloads/cases.py --case nanogpt --device cuda --live-every 4 \
      --out "$W/cases/nanogpt_gloo2" > "$W/cases-nanogpt_gloo2.log" 2>&1 \
      || { echo "nanogpt_gloo2 rc=$?"; tail -n 15 "$W/cases-nanogpt_gloo2.log"; }
  grep -h "gpuscope" "$W/cases-nanogpt_gloo2.log" | head -n 8
  dirs+=("$W/cases/nanogpt_gloo2")
  $PY scripts/gpu_cases.py "${dirs[@]}" | tee "$W/cases.jsonl"
  [ -d "$W/cases/fsdp2/kineto" ] && $PY -m gpuscope analyze "$W/cases/fsdp2/kineto" 2>&1 | head -n 16
  for c in fsdp2 allreduce; do  # NCCL's own arguments in a CUDA trace: sizes, dtype, group
    [ -d "$W/cases/$c/kineto" ] && $PY -c "import gpuscope, json, sys
o = gpuscope.analyze(sys.argv[1]).ops
print(sys.argv[2], 'collectives:', json.dumps(o.get('collectives', [])[:4], default=str)[:2500])
print(sys.argv[2], 'kernel types:', json.dumps((o.get('kernel_breakdown') or {}).get('ranks', [{}])[0].get('types_us')))" "$W/cases/$c/kineto" $c
  done
  [ "$(grep -c '"ranks"' "$W/cases.jsonl")" = "${#dirs[@]}" ]
}
trainers() {
  local t rc=0
  for t in ${TRAINERS:-hf lightning}; do
    echo "--- $t"
    timeout 120 $PY -m torch.distributed.run --standalone --nproc_per_node 1 \
        tests/workloads/trainers.py --trainer $t --device cuda --steps 40 --accum 2 \
        --out "$W/trainers/$t" > "$W/trainers-$t.log" 2>&1 \
        || { r=$?; rc=1; echo "$t rc=$r"; tail -n 20 "$W/trainers-$t.log"; }
  done
  $PY scripts/gpu_cases.py "$W"/trainers/* | tee "$W/trainers.jsonl"
  return $rc
}
export -f cases trainers
export W PY
step cases 420 bash -c cases
step trainers 240 bash -c trainers

demo() {  # demo NAME NPROC SCENARIO EXTRA...
  wanted "$1" || return 0
  mkdir -p "$W/$1"
  local name=$1 nproc=$2 scen=$3; shift 3
  step "$name" 90 $PY -m torch.distributed.run --standalone --nproc_per_node "$nproc" \
      -m gpuscope.demo.train --scenario "$scen" --device cuda --steps 40 \
      --run-dir "$W/$name/record" --profile "$W/$name/kineto" "$@"
  for src in record kineto; do
    $PY -m gpuscope analyze "$W/$name/$src" --json "$W/$name/$src.json" > "$W/$name/$src.txt" 2>&1
    echo "$name/$src analyze rc=$?" | tee -a "$OUT/summary.txt"
    head -n 12 "$W/$name/$src.txt"
  done
}
demo cuda_data 1 data
demo cuda_imbalanced_gloo 2 imbalanced --backend gloo --live-every 10
grep -h "gpuscope" "$W/cuda_imbalanced_gloo.log" 2>/dev/null | grep -i live | head -n 6

step overhead_cases 300 $PY benchmarks/bench_overhead_cases.py --device cuda --nproc 1 --longer 2 \
    --rounds 2 --only ${OVERHEAD_CASES:-nanogpt,tutorial,hf,lightning} --out "$W/overhead_cases_gpu.json"

# duckdb (the Parquet export's test reads it back) is not on the GPU image: carry its wheel, or
# that one module is left out and the summary says so
skip=(); $PY -c "import duckdb" 2>/dev/null || { skip=(--ignore tests/test_export_parquet.py)
  echo "tests: without tests/test_export_parquet.py (no duckdb)" | tee -a "$OUT/summary.txt"; }
step tests ${TESTS_LIMIT:-150} $PY -m pytest -q -p no:cacheprovider -m "not slow" "${skip[@]}" tests
step overhead 200 $PY benchmarks/bench_overhead.py --device cuda --nproc 1 --runs 4 --steps 100 \
    --out "$W/overhead_gpu.json"
cat "$W/overhead_gpu.json" 2>/dev/null

# the same side by side on a heavier step (a 4096-wide, 8-layer MLP, batch 64; ~20 ms on an H200)
overhead_big() {
  for i in 1 2 3; do
    $PY scripts/gpu_parallel.py --mode dp --no-profile --no-record --steps 80 --out "$W/big" || return 1
    $PY scripts/gpu_parallel.py --mode dp --no-profile --steps 80 --out "$W/big" || return 1
  done
  $PY - "$W/big/timings.json" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
med = {rec: statistics.median(s for r in runs if r["record"] == rec for s in r["step_s"][5:])
       for rec in (False, True)}
print(json.dumps({"median_step_ms_without": round(med[False] * 1e3, 3),
                  "median_step_ms_with": round(med[True] * 1e3, 3),
                  "ratio_with_over_without": round(med[True] / med[False], 4)}))
PYEOF
}
export -f overhead_big
export W PY
step overhead_big 120 bash -c overhead_big
for mode in fsdp dp; do
  wanted $mode || continue
  mkdir -p "$W/$mode"
  if [ $mode = fsdp ]; then
    step $mode 90 $PY -m torch.distributed.run --standalone --nproc_per_node 1 \
        scripts/gpu_parallel.py --mode fsdp --out "$W/$mode"
  else
    step $mode 90 $PY scripts/gpu_parallel.py --mode dp --out "$W/$mode"
  fi
  for src in record kineto; do
    $PY -m gpuscope analyze "$W/$mode/$src" --json "$W/$mode/$src.json" > "$W/$mode/$src.txt" 2>&1
    echo "$mode/$src analyze rc=$?" | tee -a "$OUT/summary.txt"
    head -n 14 "$W/$mode/$src.txt"
  done
done

symm_mem() {
  mkdir -p "$W/symm_mem"
  $PY - <<'PYEOF'
import os
import torch, torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import gpuscope
w = os.path.join(os.environ["W"], "symm_mem")
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"file://{w}/store", rank=0, world_size=1)
name = dist.group.WORLD.group_name
buf = symm_mem.empty(1 << 16, device="cuda")
symm_mem.rendezvous(buf, name)
with gpuscope.record(os.path.join(w, "record")) as rec:
    for _ in rec.data(range(8)):
        torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name)
        rec.step()
torch.cuda.synchronize()
rep = gpuscope.analyze(os.path.join(w, "record"))
said = [x for x in rep.warnings if "symmetric-memory" in x]
print("symm_mem note:", said)
assert said and "x8" in said[0], rep.warnings
dist.destroy_process_group()
PYEOF
}
export -f symm_mem
step symm_mem 120 bash -c symm_mem

pack
ls -la "$OUT"
