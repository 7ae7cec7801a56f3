"""Kineto per-step numbers pinned on small hand-built traces, worked out by hand (times in µs in
the trace, ns in the table). Each test fails if one rule of readers/kineto/steps.py is dropped:
the overlap subtraction in exposed communication, "data only while the GPU is idle", GPU work
assigned to the step whose host range launched it (not where the kernel started), and on CPU
traces "exposed = collectives while the training thread is not working"."""

import json

import gpuscope
from gpuscope.readers import read_path

US = 1000


def X(name, ts, dur, cat="cpu_op", tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def launch(ts, corr):
    return X("cudaLaunchKernel", ts, 5, cat="cuda_runtime", correlation=corr)


def kernel(name, ts, dur, corr):
    return X(name, ts, dur, cat="kernel", tid=7, correlation=corr, stream=7)


LOAD = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

# step 1 [0, 1000): data 0-200 (GPU idle); compute K1 300-600; NCCL C1 500-800 (100 under K1);
#   K2 launched at 950 (step 1) runs 1050-1150, inside step 2's window
# step 2 [1000, 2000): data 1000-1200, of which 1050-1150 the GPU runs K2: 100 idle;
#   compute K3 1300-1700; NCCL C2 1600-1900 (100 under K3)
# step 3: a short last step (dropped, as HTA drops the last one)
GPU_TRACE = [
    X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 1000), X("ProfilerStep#3", 2000, 100),
    X(LOAD, 0, 200), X(LOAD, 1000, 200),
    launch(210, 1), kernel("gemm_K1", 300, 300, 1),
    launch(220, 2), kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 500, 300, 2),
    launch(950, 3), kernel("gemm_K2", 1050, 100, 3),
    launch(1210, 4), kernel("gemm_K3", 1300, 400, 4),
    launch(1220, 5), kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1600, 300, 5),
]

# CPU trace, step [0, 1000): data 0-100; the training thread's op 100-500; gloo on another
# thread 400-800: exposed = 500-800 (300), compute = 100-500 (400), comm = 400
CPU_TRACE = [
    X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
    X(LOAD, 0, 100), X("aten::mm", 100, 400), X("gloo:all_reduce", 400, 400, tid=2),
]


def _write(tmp_path, events, name="rank-0.pt.trace.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0,
                                                                       "world_size": 1}}))
    return p


def _rows(path):
    f = read_path(path).frame
    return {int(r.step): r for r in f.itertuples()}


def test_gpu_steps_by_hand(tmp_path):
    rows = _rows(_write(tmp_path, GPU_TRACE))
    assert sorted(rows) == [1, 2]
    one, two = rows[1], rows[2]
    assert one.step_ns == 1000 * US and two.step_ns == 1000 * US
    # K2 belongs to step 1, which launched it: 300 + 100 of compute there, 400 in step 2
    assert one.compute_ns == 400 * US and two.compute_ns == 400 * US
    # 300 of NCCL each, 100 of it under a compute kernel: 200 exposed
    assert one.comm_ns == 300 * US and one.comm_exposed_ns == 200 * US
    assert two.comm_ns == 300 * US and two.comm_exposed_ns == 200 * US
    # data: step 1 waits 200 with the GPU idle; step 2 waits 200, 100 of them while K2 runs
    assert one.data_ns == 200 * US and two.data_ns == 100 * US
    assert one.other_ns == (1000 - 200 - 400 - 200) * US


def test_gpu_shares_in_the_report(tmp_path):
    d = gpuscope.analyze(_write(tmp_path, GPU_TRACE), skip=0).to_dict()
    r = d["ranks"][0]
    assert r["comm_exposed_pct"] == 20.0  # 200 of 1000 in both steps
    assert r["data_pct"] == 15.0  # (200 + 100) of 2000


def test_cpu_steps_by_hand(tmp_path):
    rows = _rows(_write(tmp_path, CPU_TRACE))
    one = rows[1]
    assert one.data_ns == 100 * US
    assert one.comm_ns == 400 * US and one.comm_exposed_ns == 300 * US
    assert one.compute_ns == 400 * US
    assert one.other_ns == (1000 - 100 - 400 - 300) * US
