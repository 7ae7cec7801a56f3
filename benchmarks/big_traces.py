"""Generated torch.profiler runs of any size: every rank's Kineto trace of a transformer's
training steps, as torch.profiler writes them on NCCL GPUs (record_shapes off), with a known
straggler and a known data stall, for reading at the sizes users give up on.

Per step and rank: ProfilerStep#N; the DataLoader's __next__; per layer the forward's ops
(linear, layer norm, attention, GELU) and the backward's (autograd::engine::evaluate_function),
each with its cudaLaunchKernel, its kernel on the compute stream and the launch->kernel flow
events; DDP's gradient buckets as nccl:all_reduce ranges with their NCCL kernel on the
communication stream, carrying the args NCCL writes (collective name, message sizes, group size,
dtype, process group); the fused AdamW step; distributedInfo and deviceProperties in the header.

The ranks share one simulated clock: each bucket's all-reduce ends when the last rank to reach it
has reached it and the transfer is done, so the others' NCCL kernels wait for the late one. The
straggler's compute kernels run `slow` times longer (1.25); the data-stalled rank waits
`stall_ms` for its batch every other step (default: 60% of a step's compute), and the others
then wait for it at the first bucket.

    python benchmarks/big_traces.py OUT_DIR --ranks 8 --mb 150 [--gz] [--jobs 2]
        (what was made and is known: OUT_DIR.known.json)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

import numpy as np

GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "segment_k_off_kernel__5x_cublas")
NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, "
        "float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, "
        "float*, float*, c10::BFloat16*)")
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
         "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> "
         ">, true, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_"
             "traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_"
             "traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, false, false>"
             "(pytorch_flash::Flash_bwd_params)")
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::"
        "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()"
        "#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::"
        "native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}"
        "::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, "
        "std::array<char*, 2ul>)")
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
        "<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, "
        "double, double, bool, double*, double*>(at::native::(anonymous namespace)::Tensor"
        "ListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, "
        "4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, "
        "bool, double*, double*)")
LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
#: (op, kernel, kernel us) of one layer's forward and backward
FORWARD = (("aten::layer_norm", NORM, 18.0), ("aten::linear", GEMM, 95.0),
           ("aten::_scaled_dot_product_flash_attention", FLASH, 140.0),
           ("aten::linear", GEMM, 60.0), ("aten::layer_norm", NORM, 18.0),
           ("aten::linear", GEMM, 120.0), ("aten::gelu", GELU, 30.0), ("aten::linear", GEMM, 120.0))
BACKWARD = (("autograd::engine::evaluate_function: AddmmBackward0", GEMM, 240.0),
            ("autograd::engine::evaluate_function: GeluBackward0", GELU, 45.0),
            ("autograd::engine::evaluate_function: AddmmBackward0", GEMM, 240.0),
            ("autograd::engine::evaluate_function: NativeLayerNormBackward0", NORM, 40.0),
            ("autograd::engine::evaluate_function: AddmmBackward0", GEMM, 120.0),
            ("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0",
             FLASH_BWD, 330.0),
            ("autograd::engine::evaluate_function: AddmmBackward0", GEMM, 190.0),
            ("autograd::engine::evaluate_function: NativeLayerNormBackward0", NORM, 40.0))
#: bytes a layer's events take in the file (measured on this generator), for sizing
LAYER_BYTES = 18_400
BUCKET_LAYERS = 4  # layers per DDP gradient bucket
LAUNCH_US, OP_US, DATA_US = 6.0, 14.0, 300.0
#: from the end of a rank's batch to its first kernel's start: the host's step (10) and the
#: launch (4 + LAUNCH_US)
FIRST_KERNEL_US = 10.0 + 4.0 + LAUNCH_US


class Run:
    """The simulated job: who is slow, and every step's common timeline."""

    def __init__(self, world: int, layers: int, steps: int, straggler: int | None = None,
                 slow: float = 1.25, stall_rank: int | None = None,
                 stall_ms: float | None = None, seed: int = 0):
        self.world, self.layers, self.steps = world, layers, steps
        self.straggler, self.slow = straggler, slow
        compute_ms = layers * sum(k for _, _, k in FORWARD + BACKWARD) / 1000.0
        # the stall: 60% of a step's compute (the straggler's excess is 25% of it), so that
        # the stalled rank is the late one in its steps whatever the model's size
        self.stall_ms = round(0.6 * compute_ms, 1) if stall_ms is None else stall_ms
        self.stall_rank = stall_rank
        self.seed = seed
        self.buckets = max(1, layers // BUCKET_LAYERS)
        self.nelems = 25_000_000 // self.buckets
        self._timeline()

    def factor(self, rank: int) -> float:
        return self.slow if rank == self.straggler else 1.0

    def data_us(self, rank: int, step: int) -> float:
        stalled = rank == self.stall_rank and step % 2 == 1
        return DATA_US + (1000.0 * self.stall_ms if stalled else 0.0)

    def kernels_us(self, rank: int, step: int) -> np.ndarray:
        """Each kernel's duration (us) of a rank's step, in launch order (forward's layers, then
        backward's): the one source of both the common timeline and the rank's events."""
        rng = np.random.default_rng((self.seed, rank, step))
        base = np.array([us for _, _, us in FORWARD] * self.layers
                        + [us for _, _, us in BACKWARD] * self.layers)
        return base * self.factor(rank) * rng.normal(1.0, 0.02, size=base.size)

    def _timeline(self) -> None:
        """Each step's start (us, common to all ranks) and each bucket's all-reduce end: a
        rank's gradients of bucket b are ready when its compute stream has run the kernels up
        to the bucket's last backward op (kernels run back to back from its first launch, the
        host running ahead), the all-reduce ends when the last rank's are and the one before
        is done, plus the transfer."""
        transfer = 2.0 * self.nelems * 2 / 200e3  # bytes over ~200 GB/s, in us (ring: 2x)
        self.start = np.zeros(self.steps + 1)
        self.bucket_end = np.zeros((self.steps, self.buckets))
        n_fwd = len(FORWARD) * self.layers
        last = np.array([n_fwd + len(BACKWARD) * BUCKET_LAYERS * (b + 1) - 1
                         for b in range(self.buckets)])
        t = 1.7e12  # us since the epoch
        for s in range(self.steps):
            self.start[s] = t
            ready = np.array([t + self.data_us(r, s) + FIRST_KERNEL_US
                              + np.cumsum(self.kernels_us(r, s))[last]
                              for r in range(self.world)])
            end = 0.0
            for b in range(self.buckets):
                end = max(end, ready[:, b].max()) + transfer
                self.bucket_end[s, b] = end
            t = end + 400.0  # the optimizer, after the last bucket
        self.start[self.steps] = t


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def rank_events(run: Run, rank: int, out) -> None:
    """Write rank `rank`'s trace events (comma-separated JSON objects) to `out`."""
    pid, tid, dev_pid = 1000 + rank, 1000 + rank, 0
    corr = ext = 1
    w = out.write
    first = True

    def ev(s: str) -> None:
        nonlocal first
        if not first:
            w(",\n")
        first = False
        w(s)

    for s in range(run.steps):
        t0 = run.start[s]
        step_end = run.bucket_end[s, -1] + 400.0
        ev('{"ph":"X","cat":"user_annotation","name":"ProfilerStep#%d","pid":%d,"tid":%d,'
           '"ts":%s,"dur":%s,"args":{"External id":%d,"Record function id":0}}'
           % (s, pid, tid, _fmt(t0), _fmt(step_end - t0 - 1.0), ext))
        ext += 1
        data = run.data_us(rank, s)
        ev('{"ph":"X","cat":"user_annotation","name":"%s","pid":%d,"tid":%d,"ts":%s,"dur":%s,'
           '"args":{"External id":%d,"Record function id":0}}'
           % (LOADER, pid, tid, _fmt(t0 + 2.0), _fmt(data), ext))
        ext += 1
        host = t0 + data + 10.0
        gpu = nccl_free = host
        durations = run.kernels_us(rank, s).tolist()
        j = 0
        for phase in (FORWARD, BACKWARD):
            for layer in range(run.layers):
                for i, (op, kernel, us) in enumerate(phase):
                    k_us = durations[j]
                    j += 1
                    ev('{"ph":"X","cat":"cpu_op","name":"%s","pid":%d,"tid":%d,"ts":%s,"dur":%s,'
                       '"args":{"External id":%d,"Record function id":0,"Sequence number":%d,'
                       '"Fwd thread id":0,"Ev Idx":%d}}'
                       % (op, pid, tid, _fmt(host), _fmt(OP_US), ext, layer, ext))
                    ev('{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":%d,"tid":%d,'
                       '"ts":%s,"dur":%s,"args":{"External id":%d,"cbid":211,"correlation":%d}}'
                       % (pid, tid, _fmt(host + 4.0), _fmt(LAUNCH_US), ext, corr))
                    ev('{"ph":"s","id":%d,"pid":%d,"tid":%d,"ts":%s,"cat":"ac2g","name":"ac2g"}'
                       % (corr, pid, tid, _fmt(host + 4.0)))
                    start = max(gpu, host + 4.0 + LAUNCH_US)
                    ev('{"ph":"X","cat":"kernel","name":"%s","pid":%d,"tid":7,"ts":%s,"dur":%s,'
                       '"args":{"External id":%d,"queued":0,"device":0,"context":1,"stream":7,'
                       '"correlation":%d,"registers per thread":128,"shared memory":49152,'
                       '"blocks per SM":1.0,"warps per SM":4.0,"grid":[132,1,1],'
                       '"block":[256,1,1],"est. achieved occupancy %%":12}}'
                       % (kernel, dev_pid, _fmt(start), _fmt(k_us), ext, corr))
                    ev('{"ph":"f","id":%d,"pid":%d,"tid":7,"ts":%s,"cat":"ac2g","name":"ac2g",'
                       '"bp":"e"}' % (corr, dev_pid, _fmt(start)))
                    gpu = start + k_us
                    host += OP_US + 2.0
                    ext += 1
                    corr += 1
                    if phase is BACKWARD and (layer + 1) % BUCKET_LAYERS == 0 \
                            and i == len(BACKWARD) - 1:
                        b = min((layer + 1) // BUCKET_LAYERS, run.buckets) - 1
                        end = run.bucket_end[s, b]
                        launch = max(host, gpu - 20.0)
                        ev('{"ph":"X","cat":"user_annotation","name":"nccl:all_reduce","pid":%d,'
                           '"tid":%d,"ts":%s,"dur":%s,"args":{"External id":%d,'
                           '"Record function id":0}}' % (pid, tid, _fmt(launch), _fmt(12.0), ext))
                        ev('{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernelExC",'
                           '"pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":{"External id":%d,'
                           '"cbid":430,"correlation":%d}}'
                           % (pid, tid, _fmt(launch + 3.0), _fmt(LAUNCH_US), ext, corr))
                        k0 = max(gpu, launch + 3.0 + LAUNCH_US, nccl_free)
                        ev('{"ph":"X","cat":"kernel","name":"%s","pid":%d,"tid":20,"ts":%s,'
                           '"dur":%s,"args":{"External id":%d,"queued":0,"device":0,'
                           '"context":1,"stream":20,"correlation":%d,"registers per thread":96,'
                           '"shared memory":87568,"grid":[32,1,1],"block":[544,1,1],'
                           '"Collective name":"allreduce","In msg nelems":%d,'
                           '"Out msg nelems":%d,"Group size":%d,"dtype":"BFloat16",'
                           '"In split size":"[]","Out split size":"[]","Process Group Name":'
                           '"0","Process Group Description":"default_pg",'
                           '"Process Group Ranks":"[0, ..., %d]"}}'
                           % (NCCL, dev_pid, _fmt(k0), _fmt(max(end - k0, 5.0)), ext, corr,
                              run.nelems, run.nelems, run.world, run.world - 1))
                        nccl_free = max(end, k0 + 5.0)
                        ext += 1
                        corr += 1
        opt0 = run.bucket_end[s, -1] + 20.0
        ev('{"ph":"X","cat":"cpu_op","name":"Optimizer.step#AdamW.step","pid":%d,"tid":%d,'
           '"ts":%s,"dur":%s,"args":{"External id":%d,"Record function id":0}}'
           % (pid, tid, _fmt(max(host, opt0 - 40.0)), _fmt(300.0), ext))
        ev('{"ph":"X","cat":"kernel","name":"%s","pid":%d,"tid":7,"ts":%s,"dur":%s,'
           '"args":{"External id":%d,"queued":0,"device":0,"context":1,"stream":7,'
           '"correlation":%d}}' % (ADAM, dev_pid, _fmt(opt0), _fmt(300.0), ext, corr))
        ext += 1
        corr += 1


def header(run: Run, rank: int) -> str:
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
           "pg_size": run.world, "ranks": list(range(run.world))}]
    return json.dumps({
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem":
                              85_030_025_216, "computeMajor": 9, "computeMinor": 0,
                              "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": run.world,
                            "pg_count": 1, "pg_config": pg, "nccl_version": "2.21.5"},
        "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000})[:-1]


def layers_for(mb: float, steps: int) -> int:
    """The layer count that makes a rank's file about `mb` MB."""
    return max(BUCKET_LAYERS, int(round(mb * 1e6 / steps / LAYER_BYTES / BUCKET_LAYERS))
               * BUCKET_LAYERS)


def write_rank(run: Run, rank: int, folder: str, gz: bool = False) -> str:
    """One rank's trace file, named as tensorboard_trace_handler names them."""
    host = f"node{rank // 8:03d}"
    name = f"{host}_{20_000 + rank}.1700000000{rank:06d}.pt.trace.json" + (".gz" if gz else "")
    path = os.path.join(folder, name)
    opener = (lambda p: gzip.open(p, "wt", compresslevel=1)) if gz else \
        (lambda p: open(p, "w", buffering=1 << 20))
    with opener(path) as out:
        out.write(header(run, rank) + ', "traceEvents": [\n')
        rank_events(run, rank, out)
        out.write("\n]}\n")
    return path


def _one(args) -> str:
    run, rank, folder, gz = args
    return write_rank(run, rank, folder, gz)


def generate(folder: str, ranks: int, mb: float, steps: int = 20, gz: bool = False,
             straggler: int | None = None, stall_rank: int | None = None,
             jobs: int = 1) -> dict:
    """Write a run of `ranks` traces of ~`mb` MB each; returns what was made and is known."""
    os.makedirs(folder, exist_ok=True)
    if ranks > 1:
        straggler = ranks // 3 if straggler is None else straggler
        stall_rank = (2 * ranks) // 3 if stall_rank is None else stall_rank
    run = Run(ranks, layers_for(mb, steps), steps, straggler=straggler, stall_rank=stall_rank)
    work = [(run, r, folder, gz) for r in range(ranks)]
    if jobs > 1 and ranks > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(jobs) as pool:
            paths = pool.map(_one, work)
    else:
        paths = [_one(w) for w in work]
    return {"ranks": ranks, "steps": steps, "layers": run.layers, "straggler": run.straggler,
            "slow": run.slow, "stall_rank": run.stall_rank, "stall_ms": run.stall_ms,
            "files": [os.path.basename(p) for p in paths],
            "bytes": sum(os.path.getsize(p) for p in paths)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=float, default=150.0, help="JSON MB per rank (before gzip)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gz", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    made = generate(args.out, args.ranks, args.mb, args.steps, args.gz, jobs=args.jobs)
    # beside the folder, not in it: a tool that reads every JSON file there (HTA) would take
    # it for a trace
    with open(os.path.normpath(args.out) + ".known.json", "w") as fh:
        json.dump({k: v for k, v in made.items() if k != "files"}, fh, indent=1)
    print(json.dumps({k: v for k, v in made.items() if k != "files"}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
