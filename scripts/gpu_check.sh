#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU (not run in CI, which has none):
#   1. gpuscope doctor (real NVML, CUDA, NCCL smoke test);
#   2. the GPU-path tests with the real backends;
#   3. the demo on CUDA: 1 rank with NCCL, and 2 ranks on the one GPU with gloo;
#   4. the recording-overhead benchmark on the GPU;
# copying what they produce to $OUT (or ./gpu_results) for sample_traces/ and the README.
set -uo pipefail
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/nvidia-smi.txt"
$PY -m gpuscope doctor --json "$OUT/doctor.json" 2>&1 | tee "$OUT/doctor.txt"
$PY -m pytest -q tests/test_gpu_seams.py tests/test_doctor.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
for scen in data imbalanced; do
  rm -rf "runs/gpu_$scen"
  $PY -m torch.distributed.run --standalone --nproc_per_node 1 -m gpuscope.demo.train \
      --scenario "$scen" --device cuda --steps 40 --run-dir "runs/gpu_$scen/record" \
      --profile "runs/gpu_$scen/kineto" 2>&1 | tail -3
  $PY -m gpuscope analyze "runs/gpu_$scen/record" --json "$OUT/gpu_${scen}_record.json" \
      | tee "$OUT/gpu_${scen}_record.txt"
  $PY -m gpuscope analyze "runs/gpu_$scen/kineto" --json "$OUT/gpu_${scen}_kineto.json" -q
done
rm -rf runs/gpu_2rank
$PY -m torch.distributed.run --standalone --nproc_per_node 2 -m gpuscope.demo.train \
    --scenario imbalanced --device cuda --backend gloo --steps 40 \
    --run-dir runs/gpu_2rank/record 2>&1 | tail -3
$PY -m gpuscope analyze runs/gpu_2rank/record --json "$OUT/gpu_2rank.json" | tee "$OUT/gpu_2rank.txt"
tar czf "$OUT/gpu_runs.tgz" runs/gpu_data runs/gpu_imbalanced runs/gpu_2rank 2>/dev/null
