"""Kineto per-step numbers pinned on small hand-built traces, worked out by hand (times in µs in
the trace, ns in the table). Each test fails if one rule of readers/kineto/steps.py is dropped:
the overlap subtraction in exposed communication, "data only while the GPU is idle", GPU steps
measured in device windows (a step starts on the GPU when its host range has begun and the GPU has
finished the previous step's work; nothing of a step is counted outside its window), and on CPU
traces "exposed = collectives while the training thread is not working"."""

import json
import os

import pytest

import gpuscope
from gpuscope.readers import read_path
from helpers import X, kernel, launch

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")

US = 1000




LOAD = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

# host step 1 [0, 1000): data 0-200 (GPU idle); compute K1 300-600; NCCL C1 500-800 (100 under
#   K1); K2 launched at 950 (step 1) runs 1050-1150, after the host has begun step 2
# host step 2 [1000, 2000): data 1000-1200, of which 1050-1150 the GPU runs K2;
#   compute K3 1300-1700; NCCL C2 1600-1900 (100 under K3)
# step 3: a short last step (dropped, as HTA drops the last one)
# Device windows: step 1 [0, 1150) (it ends when the GPU finishes K2, step 1's last work),
#   step 2 [1150, 2000): the GPU idles 1000-1050 and 1150-1200 while the host loads step 2's
#   batch: 50 of data stall in each window
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
    assert one.start_ns == 0 and two.start_ns == 1150 * US
    assert one.step_ns == 1150 * US and two.step_ns == 850 * US
    # K2 runs in step 1's window: 300 + 100 of compute there, 400 in step 2
    assert one.compute_ns == 400 * US and two.compute_ns == 400 * US
    # 300 of NCCL each, 100 of it under a compute kernel: 200 exposed
    assert one.comm_ns == 300 * US and one.comm_exposed_ns == 200 * US
    assert two.comm_ns == 300 * US and two.comm_exposed_ns == 200 * US
    # data: the GPU idles while the host waits: 0-200 and 1000-1050 in step 1, 1150-1200 in 2
    assert one.data_ns == 250 * US and two.data_ns == 50 * US
    # the GPU idles with nothing queued, outside data waits: 200-300 (K1 launched at 210),
    # 800-1000 (K2 at 950), 1200-1300 (K3 at 1210) and 1900-2000 (nothing more launched)
    assert one.host_ns == 300 * US and two.host_ns == 200 * US
    assert one.other_ns == (1150 - 250 - 400 - 200) * US
    assert two.other_ns == (850 - 50 - 400 - 200) * US


def test_gpu_step_waits_for_work_the_host_queued_ahead(tmp_path):
    # the host runs 30 ms ahead of the GPU (a GPU-bound run): host steps of 10, device work of
    # 20 per step, launched at the start of each host step. Host windows would give each step
    # kernels that run long after it ended; device windows hold each step's 20 of work. Work
    # queued before the profiler started runs first, with no launch in the trace (as Kineto
    # records it): the first step starts on the GPU when that ends.
    events = [kernel("gemm_queued_before", 0, 30, 999)]
    corr = 0
    for n in range(4):
        events.append(X(f"ProfilerStep#{n}", n * 10, 10))
        corr += 1
        events += [launch(n * 10 + 1, corr), kernel("gemm", 30 + n * 20, 15, corr)]
        corr += 1
        events += [launch(n * 10 + 2, corr),
                   kernel("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
                          45 + n * 20, 5, corr)]
    rows = _rows(_write(tmp_path, events))
    assert sorted(rows) == [0, 1, 2]  # the last dropped
    for r in rows.values():
        assert r.step_ns == 20 * US  # the device's pace, not the host's 10
        assert r.compute_ns == 15 * US and r.comm_ns == 5 * US and r.comm_exposed_ns == 5 * US
        assert r.other_ns == 0


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


def test_gpu_idle_with_work_queued_is_not_the_host(tmp_path):
    # K2 is launched at 50, while K1 runs, but starts 100 after K1 ends (it waits on an event):
    # that idle is not the host's; the idle before K1 (launched at 200, the step began at 0) is
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              launch(200, 1), kernel("gemm_K1", 300, 300, 1),
              launch(250, 2), kernel("gemm_K2", 700, 300, 2)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.step_ns == 1000 * US and one.compute_ns == 600 * US
    assert one.host_ns == 300 * US  # 0-300 before K1; 600-700 had K2 queued
    assert one.other_ns == 400 * US


def test_a_blocking_collective_call_with_no_child_is_waiting_not_work(tmp_path):
    # gloo's queue is full: c10d::allreduce_ blocks the training thread 300-800 while the
    # all-reduce runs on gloo's thread; the call has no op inside it
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              X("aten::mm", 0, 300), X("c10d::allreduce_", 300, 500),
              X("gloo:all_reduce", 300, 500, tid=2)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.comm_exposed_ns == 500 * US and one.compute_ns == 300 * US


def test_a_collective_kernel_of_no_length_reads(tmp_path):
    # a damaged trace (the fuzz found it): an NCCL kernel with dur 0 raised IndexError
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              launch(10, 1), kernel("gemm", 100, 300, 1),
              launch(20, 2), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 500, 0, 2)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.compute_ns == 300 * US and one.comm_ns == 0


def test_time_blocked_in_a_collective_call_before_its_range_starts_is_exposed(tmp_path):
    # the training thread blocks in c10d::allreduce_ 300-900; gloo's own range for it runs
    # 500-900 only (the bucket before it held gloo's thread): all 600 are communication the
    # step waited on, none of it compute; the wait split's table holds them too
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              X("aten::mm", 0, 300), X("c10d::allreduce_", 300, 600),
              X("gloo:all_reduce", 500, 400, tid=2)]
    path = _write(tmp_path, events)
    one = _rows(path)[1]
    assert one.comm_exposed_ns == 600 * US and one.compute_ns == 300 * US
    comm = read_path(path).comm
    assert comm.loc[comm["step"] == 1, "exposed_ns"].tolist() == [600 * US]


def test_idle_until_an_issued_collective_ends_is_exposed(tmp_path):
    # DDP on gloo, as a busy core made it: the training thread issues the all-reduce
    # (c10d::allreduce_ 290-300, a call with no child: waiting), computes until 400, then waits
    # in the reducer, in no op of its own, until gloo's range (starting late, 550-900) ends; it
    # runs again at 905. All of 400-905 is the step waiting on communication, none of it
    # "other"; the wait split's table gets it too. An idle stretch that ends long after any
    # collective (950-1000) stays other.
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              X("aten::mm", 0, 290), X("c10d::allreduce_", 290, 10), X("aten::mm", 300, 100),
              X("gloo:all_reduce", 550, 350, tid=2), X("aten::copy_", 905, 45)]
    path = _write(tmp_path, events)
    one = _rows(path)[1]
    assert one.comm_exposed_ns == 515 * US
    assert one.compute_ns == 435 * US and one.other_ns == 50 * US
    comm = read_path(path).comm
    # all of it, the 10 us blocked in the call that issued it included: the row's exposed
    assert comm.loc[comm["step"] == 1, "exposed_ns"].tolist() == [515 * US]
    # without the collective call before the idle stretch, nothing says the thread waited
    # for it (the thread idles, a collective issued elsewhere happens to end)
    events[3] = X("aten::add", 290, 10)
    one = _rows(_write(tmp_path, events, "rank-0b.pt.trace.json"))[1]
    assert one.comm_exposed_ns == 350 * US and one.other_ns == 155 * US + 50 * US


def test_a_call_blocked_before_its_collective_starts_is_that_collective_s_wait(tmp_path):
    # DDP on gloo (a busy-core run): rank 0 computes to 300, then blocks in c10d::allreduce_
    # (300-500, no child) while its peer is still computing; gloo's range starts only after the
    # call returns (510-600), and the thread idles until it ends. The 200 us blocked are
    # exposed communication of that all-reduce (300 us with the idle wait after them), in the
    # step's row and in the per-collective table the wait split compares across ranks.
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              X("aten::mm", 0, 300), X("c10d::allreduce_", 300, 200),
              X("gloo:all_reduce", 510, 90, tid=2), X("aten::mm", 600, 400)]
    path = _write(tmp_path, events)
    one = _rows(path)[1]
    assert one.comm_exposed_ns == 300 * US
    comm = read_path(path).comm
    assert comm.loc[comm["step"] == 1, "exposed_ns"].tolist() == [300 * US]


def test_idle_long_after_the_collective_ended_is_exposed_only_up_to_resume(tmp_path):
    # the training thread issues the all-reduce (290-300), computes to 400, and idles until
    # 3,500; gloo's range ends at 500. Up to RESUME_NS past that end (400-2,500) it waited for
    # the collective; the 1,000 us after, for a core: other
    events = [X("ProfilerStep#1", 0, 4000), X("ProfilerStep#2", 4000, 100),
              X("aten::mm", 0, 290), X("c10d::allreduce_", 290, 10), X("aten::mm", 300, 100),
              X("gloo:all_reduce", 300, 200, tid=2), X("aten::copy_", 3500, 500)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.comm_exposed_ns == 10 * US + 2100 * US
    assert one.other_ns == 1000 * US


def test_ddp_writing_a_synced_bucket_back_is_the_synchronization_s(tmp_path):
    # DDP on gloo, a busy core: the training thread issues the all-reduce (290-300), computes to
    # 400, idles until gloo's range ends (300-500), then DDP's reducer copies the synced bucket
    # into the gradients (500-2,000: 30 us of copy stretched by a core taken away), and the
    # optimizer runs. Only a synchronizing step does that copy, and the recorder's DDP tail
    # (to backward's return) holds it: exposed communication of that all-reduce (10 + 100 + 1,500
    # us), in the row and in the per-collective table the wait split compares; not compute
    events = [X("ProfilerStep#1", 0, 3000), X("ProfilerStep#2", 3000, 100),
              X("aten::mm", 0, 290), X("c10d::allreduce_", 290, 10), X("aten::mm", 300, 100),
              X("gloo:all_reduce", 300, 200, tid=2),
              X("torch.distributed.ddp.reducer::copy_bucket_to_grad", 500, 1500),
              X("aten::copy_", 500, 1500), X("aten::add_", 2000, 1000)]
    path = _write(tmp_path, events)
    one = _rows(path)[1]
    assert one.comm_exposed_ns == 1610 * US
    assert one.compute_ns == 1390 * US and one.other_ns == 0
    comm = read_path(path).comm
    assert comm.loc[comm["step"] == 1, "exposed_ns"].tolist() == [1610 * US]


ACC = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
WRITE_BACK = "torch.distributed.ddp.reducer::copy_bucket_to_grad"


def test_ddp_s_launches_before_its_last_are_backward_as_the_record_counts_them(tmp_path):
    # DDP on gloo, a busy core (times in ms): the reducer launches bucket 1 inside a gradient's
    # accumulation (c10d::allreduce_ 100-600: the core taken away for most of it), the backward
    # goes on, bucket 2's launch (1,000-1,010) is the step's last; the thread idles until gloo's
    # second range ends (1,500) and long after (back at 1,520: past RESUME_NS), takes the
    # reducer's views (as_strided, 10 us), writes both buckets back (60 us) and runs the
    # optimizer. The recorder's DDP tail starts at the last launch and ends at backward's
    # return: the first launch is backward's host work, everything from the last launch to the
    # write-back's end the synchronization's; the same steps give the same exposed time from
    # both sources
    ms = 1000
    back = 1520 * ms  # the thread runs again
    events = [X("ProfilerStep#1", 0, 2000 * ms), X("ProfilerStep#2", 2000 * ms, 100),
              X("aten::mm", 0, 100 * ms),
              X(ACC, 100 * ms, 500 * ms), X("c10d::allreduce_", 100 * ms, 500 * ms),
              X("gloo:all_reduce", 600 * ms, 300 * ms, tid=2),
              X("aten::mm", 600 * ms, 400 * ms),
              X(ACC, 1000 * ms, 10 * ms), X("c10d::allreduce_", 1000 * ms, 10 * ms),
              X("gloo:all_reduce", 1010 * ms, 490 * ms, tid=3),
              X("aten::as_strided", back, 10),
              X(WRITE_BACK, back + 10, 30), X("aten::copy_", back + 10, 30),
              X(WRITE_BACK, back + 40, 30), X("aten::copy_", back + 40, 30),
              X("aten::add_", back + 70, 2000 * ms - back - 70)]
    path = _write(tmp_path, events)
    one = _rows(path)[1]
    # 10 ms in the last launch, 510 ms idle until the reducer resumed, 60 us writing back
    assert one.comm_exposed_ns == (520 * ms + 60) * US
    assert one.compute_ns == (2000 * ms - 520 * ms - 60) * US and one.other_ns == 0
    run = read_path(path)
    comm = run.comm
    assert comm.loc[comm["step"] == 1, "exposed_ns"].sum() == (520 * ms + 60) * US
    # the synchronization is in flight from the first launch (100 ms), as the record times it
    # from its first bucket's launch: the 900 ms to the last launch are communication behind
    # backward's compute, not exposed, and the analysis reads them as that window
    assert one.comm_ns == (1420 * ms + 60) * US
    assert run.ranks[0].knobs["hidden_comm"] == "in_flight"
    # without DDP's write-back (no reducer in the trace), each c10d call is the collective's
    # whole, and an idle stretch past RESUME_NS is the thread waiting for a core: other
    plain = [e for e in events if e["name"] != WRITE_BACK]
    plain_path = _write(tmp_path, plain, "rank-0b.pt.trace.json")
    one = _rows(plain_path)[1]
    assert "hidden_comm" not in read_path(plain_path).ranks[0].knobs
    assert one.comm_exposed_ns == (500 + 10 + 490 + 2) * ms * US
    assert one.other_ns == 18 * ms * US  # 1,502-1,520


def test_a_c10d_call_is_the_collective_s_whole_its_own_copy_included(tmp_path):
    # FSDP2's reduce-scatter on gloo, a core busy: the blocking c10d call (1,000-7,000) spends
    # 5,900 us in gloo's copy of its input (descheduled), then the reduce runs on gloo's thread
    # (7,000-7,500) while the training thread waits. The recorder times the call whole, so the
    # trace counts it whole: 6,000 in the call and 500 waiting after it, not the copy as compute
    events = [X("ProfilerStep#1", 0, 10000), X("ProfilerStep#2", 10000, 100),
              X("aten::mm", 0, 1000), X("c10d::_reduce_scatter_base_", 1000, 6000),
              X("aten::clone", 1000, 5900), X("aten::copy_", 1010, 5880),
              X("gloo:all_reduce", 7000, 500, tid=2), X("aten::mm", 7500, 2500)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.comm_exposed_ns == 6500 * US and one.comm_ns == 6500 * US
    assert one.compute_ns == 3500 * US and one.other_ns == 0


def test_fsdp_waits_inside_its_ranges_only_while_a_collective_is_pending(tmp_path):
    # FSDP::post_backward_reduce 0-15,000: it issues the reduce-scatter (a c10d call 100-200,
    # gloo's range 200-1,000) and then runs no op until a copy at 14,000. Waiting: from the
    # call to RESUME_NS (2,000) past the collective's end, 100-3,000; the rest of the range is
    # FSDP's own work (Python, a thread waiting for a core), as the recorder counts it inside
    # backward, not 14 ms of communication
    events = [X("ProfilerStep#1", 0, 20000), X("ProfilerStep#2", 20000, 100),
              X("FSDP::post_backward_reduce", 0, 15000),
              X("c10d::_reduce_scatter_base_", 100, 100), X("gloo:all_reduce", 200, 800, tid=2),
              X("aten::copy_", 14000, 500), X("aten::mm", 15000, 5000)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.comm_ns == 2900 * US and one.comm_exposed_ns == 2900 * US
    assert one.compute_ns == (20000 - 2900) * US
    # a collective queued behind another is pending from the call that issued it: FSDP's
    # all-gather waits 300-5,000 while gloo's thread is still busy elsewhere (its range starts
    # at 4,000)
    events = [X("ProfilerStep#1", 0, 8000), X("ProfilerStep#2", 8000, 100),
              X("FSDP::all_gather", 0, 5000), X("c10d::_allgather_base_", 200, 100),
              X("gloo:all_gather", 4000, 900, tid=2), X("aten::mm", 5000, 3000)]
    one = _rows(_write(tmp_path, events, "rank-0b.pt.trace.json"))[1]
    assert one.comm_exposed_ns == 4800 * US  # 200-5,000: the call, then pending


def test_a_functional_collective_s_launch_is_host_work_and_its_wait_is_waiting(tmp_path):
    # DTensor's all-gather: the functional op (1,000-4,000) calls c10d (1,100-3,900), inside
    # which a view op runs (1,200-3,800) and the thread is descheduled around it (a busy
    # core). The recorder counts a functional collective's launch call as host work and its
    # wait_tensor as waiting, so the trace does too: the c10d call inside the launch is part of
    # it, not a collective call of its own (counted whole)
    events = [X("ProfilerStep#1", 0, 5000), X("ProfilerStep#2", 5000, 100),
              X("aten::mm", 0, 1000), X("_c10d_functional::all_gather_into_tensor", 1000, 3000),
              X("c10d::_allgather_base_", 1100, 2800), X("aten::narrow", 1200, 2600),
              X("gloo:all_gather", 3900, 150, tid=2),
              X("_c10d_functional::wait_tensor", 4000, 100), X("aten::mm", 4100, 900)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.comm_exposed_ns == 100 * US
    assert one.compute_ns == (1000 + 3000 + 900) * US
    assert one.comm_ns == 200 * US  # gloo's range (3,900-4,050) and the wait (to 4,100)


def test_a_functional_collective_s_helper_op_is_work_not_waiting(tmp_path):
    # _c10d_functional::_wrap_tensor_autograd wraps a result for autograd: no collective
    events = [X("ProfilerStep#1", 0, 3000), X("ProfilerStep#2", 3000, 100),
              X("aten::mm", 0, 1000), X("_c10d_functional::_wrap_tensor_autograd", 1000, 1000),
              X("aten::mm", 2000, 1000)]
    one = _rows(_write(tmp_path, events))[1]
    assert one.comm_exposed_ns == 0 and one.compute_ns == 3000 * US


def test_collectives_of_one_kind_that_overlap_are_counted_once(tmp_path):
    """gloo runs two buckets' all-reduces at once on two threads (400-800 and 500-900): the
    kind's time in the step is their union, 500, never their sum (900), and never longer than
    the step's communication (a public trace: all_reduce 250 ms per step in a 223 ms step)."""
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              X("aten::mm", 0, 400), X("gloo:all_reduce", 400, 400, tid=2),
              X("gloo:all_reduce", 500, 400, tid=3)]
    path = _write(tmp_path, events)
    one = _rows(path)[1]
    assert one.comm_ns == 500 * US
    comm = read_path(path).comm
    assert comm.loc[comm["step"] == 1, "comm_ns"].sum() == 500 * US
    assert comm.loc[comm["step"] == 1, "count"].sum() == 2
    rep = gpuscope.analyze(str(path), skip=0)
    assert rep.ranks[0].comm_by_kind["all_reduce"] <= rep.ranks[0].comm_ns + 1


def test_collectives_issued_between_backward_and_the_optimizer_are_gradient_sync(tmp_path):
    """DDP's bucket all-reduce is issued inside backward (a CPU trace: on the training thread,
    between autograd's functions); the loop's own all-reduce of its metrics after the optimizer
    step. Both on the default group: only the first is gradient synchronization, the part of
    the exposed time that syncing less often saves."""
    events = [X("ProfilerStep#1", 0, 3000), X("ProfilerStep#2", 3000, 100),
              X("aten::mm", 0, 500),
              X("autograd::engine::evaluate_function: MmBackward0", 500, 400),
              X("c10d::allreduce_", 900, 300), X("gloo:all_reduce", 900, 300, tid=2),
              X("Optimizer.step#SGD.step", 1200, 300),
              X("c10d::allreduce_", 1500, 1000), X("gloo:all_reduce", 1500, 1000, tid=2)]
    path = _write(tmp_path, events)
    comm = read_path(path).comm
    one = comm[comm["step"] == 1]
    assert one["exposed_ns"].sum() == 1300 * US
    assert one["grads_exposed_ns"].sum() == 300 * US


def test_a_one_off_library_load_is_startup_not_launch_overhead(tmp_path):
    """A trace without step markers whose first convolution loads its library inside its one
    cudaLaunchKernel (1,337 ms of a 1.8 s trace, as a public A100 trace): that is startup, left
    out of the trace's one step and said, never per-step launch overhead (it read host-bound,
    CUDA graphs +1848%); the GPU's real gaps between launches are still host wait."""
    us = 1000
    events = [X("aten::cudnn_convolution", 0, 1_340 * us),
              X("cudaLaunchKernel", 1_000, 1_337 * us, cat="cuda_runtime", correlation=1),
              kernel("cudnn_conv_kernel", 1_340 * us, 100 * us, 1)]
    t = 1_500 * us
    for i in range(2, 40):  # small kernels, each launched 8 ms after the last one ended
        events += [X("aten::add", t, 10, cat="cpu_op"),
                   X("cudaLaunchKernel", t + 1, 5, cat="cuda_runtime", correlation=i),
                   kernel("add_kernel", t + 10, 2 * us, i)]
        t += 10 * us
    path = _write(tmp_path, events)
    table = read_path(path)
    (row,) = table.frame.itertuples()
    assert 500e6 < row.step_ns < 600e6  # 1,880 ms of trace less the 1,337 ms stall
    assert row.host_ns < row.step_ns
    assert any("one-off host work" in w and "startup" in w for w in table.warnings)
    rep = gpuscope.analyze(str(path))
    for s in rep.suggestions:
        assert s.gain_pct <= 100.0 + 1e-6, s  # no gain beyond what the evidence supports


def test_a_librarys_load_between_its_one_off_calls_is_startup_too(tmp_path):
    """GPUPuzzlers' small-kernels trace: the first aten::mm spends 9.08 s in cudaMalloc and two
    cudaFree calls and, between them, 0.8 s of the library's loading in no runtime call; the
    loop after it is milliseconds. The op's host work around its one-off calls (up to its
    other calls) is startup: the step was 794 ms of that tail. Work outside the op stays."""
    ms = 1_000  # µs
    events = [X("aten::mm", 0, 3_000 * ms),
              X("cudaMalloc", 1 * ms, 300 * ms, cat="cuda_runtime"),
              X("cudaFree", 400 * ms, 1_500 * ms, cat="cuda_runtime"),  # 100 ms gap before
              X("cudaFree", 2_600 * ms, 390 * ms, cat="cuda_runtime"),  # 700 ms gap before
              X("cudaLaunchKernel", 2_995 * ms, 10, cat="cuda_runtime", correlation=1),
              kernel("sgemm", 2_995 * ms + 20, 100, 1)]
    t = 3_000 * ms
    for i in range(2, 12):  # the loop: a kernel launched every 100 µs
        events += [X("aten::mm", t, 20, cat="cpu_op"),
                   X("cudaLaunchKernel", t + 1, 5, cat="cuda_runtime", correlation=i),
                   kernel("sgemm", t + 10, 50, i)]
        t += 100
    path = _write(tmp_path, events)
    (row,) = read_path(path).frame.itertuples()
    assert row.step_ns < 10e6, row.step_ns  # the loop's ~1 ms and the first launch's 5 ms
    assert row.step_ns >= 1e6  # the loop itself is kept
    assert row.launches == 11  # the first sgemm and the loop's ten


def test_launches_without_kernel_events_are_not_compute(tmp_path):
    """236 cudaLaunchKernel calls and no kernel event (the GPU's activity was not recorded):
    the host's ops are not the GPU's compute; the report says what to pass to the profiler and
    never reads 'compute 100%'."""
    events = [X("ProfilerStep#1", 0, 10_000), X("ProfilerStep#2", 10_000, 100)]
    for i in range(236):
        events += [X("aten::mm", i * 40, 30),
                   X("cudaLaunchKernel", i * 40 + 5, 10, cat="cuda_runtime", correlation=i + 1)]
    path = _write(tmp_path, events)
    rep = gpuscope.analyze(str(path))
    assert rep.ranks[0].compute_pct == 0
    assert any("GPU's activity was not recorded" in w and "ProfilerActivity.CUDA" in w
               for w in rep.warnings)
    assert rep.verdict.label != "compute-bound"


def test_expert_parallel_kernels_in_another_namespace_are_communication_and_named(tmp_path):
    """An expert-parallel training whose dispatch / combine / notify kernels live in another
    namespace than DeepEP's public source (deep_ep::): communication (an all-to-all), named in a
    warning as kernels no family claims, never 0 ms of communication."""
    events = [X("ProfilerStep#1", 0, 1000), X("ProfilerStep#2", 1000, 100),
              launch(10, 1), kernel("void ep_kernels::notify_dispatch<8>(int const*)", 100, 50, 1),
              launch(20, 2), kernel("void ep_kernels::intranode::dispatch<8, 768>(int4*)", 150,
                                    200, 2),
              launch(30, 3), kernel("gemm_expert", 350, 300, 3),
              launch(40, 4), kernel("void ep_kernels::intranode::combine<bf16>(void*)", 650, 200,
                                    4)]
    path = _write(tmp_path, events)
    rep = gpuscope.analyze(str(path), skip=0)
    r = rep.ranks[0]
    assert r.comm_ns == 450 * US and "all_to_all" in r.comm_by_kind
    assert any("ep_kernels::intranode::dispatch" in w for w in rep.warnings)


def test_maths_on_cpu_tensors_in_a_gpu_trace_gets_no_launch_advice(tmp_path):
    """Issue 70's second trace: a loop summing a tensor's elements on CPU tensors, profiled
    with CUDA activity: one copy to the GPU before the loop, then steps of aten::select and
    aten::add_ with no kernel. The GPU idles the whole step: host-bound, but no CUDA-graph /
    torch.compile suggestion ("~25.0 (0.0-25.0) ms/step" before); the report says why and
    what follows the cause."""
    from gpuscope.analyze.run import analyze_table
    from gpuscope.thresholds import Thresholds

    events = [X("cudaMemcpyAsync", 0, 20, cat="cuda_runtime", correlation=1),
              X("Memcpy HtoD (Pageable -> Device)", 10, 50, cat="gpu_memcpy", tid=7,
                correlation=1, stream=7)]
    t = 100
    for s in range(8):
        events.append(X(f"ProfilerStep#{s}", t, 25_000))
        for i in range(400):  # an op every 60 us, all on the host
            events.append(X("aten::select", t + 60 * i, 20))
            events.append(X("aten::add_", t + 60 * i + 25, 30))
        t += 25_000
    rep = analyze_table(read_path(_write(tmp_path, events)), Thresholds(), own=True)
    assert rep.verdict.label == "host-bound", rep.verdict
    assert not any("CUDA graphs" in s.proposed for s in rep.suggestions)
    said = " ".join(rep.warnings)
    assert "no GPU kernel" in said and ".to('cuda')" in said, rep.warnings
    from gpuscope.render import terminal

    text = " ".join(terminal.render(rep, width=200).split())
    assert "the GPU had no kernel to run in 100%" in text and "waiting for the host" not in text


def test_syncs_are_counted_per_step_and_removed_before_launches_are_fused(tmp_path):
    """Issue 70's first trace, by hand: each step copies 200 elements to the host one by one
    (.cpu(): a cudaMemcpyAsync of a device-to-host copy, then a cudaStreamSynchronize that
    waits for it), with a small kernel between. The syncs are counted per step with the
    host's time blocked in them; the fix is to remove them (no CUDA graphs), its estimate
    no further than that time and never below the GPU's busy time."""
    from gpuscope.analyze.run import analyze_table
    from gpuscope.thresholds import Thresholds

    events, t, corr = [], 0, 1
    for s in range(6):
        events.append(X(f"ProfilerStep#{s}", t, 200 * 60))
        for i in range(200):  # every 60 us: an op, a kernel, a copy and a sync of 20 us
            at = t + 60 * i
            events += [X("loop.py(7): step", at, 55, cat="python_function"),
                       X("aten::add", at, 10),
                       X("cudaLaunchKernel", at + 1, 5, cat="cuda_runtime", correlation=corr),
                       kernel("add_kernel", at + 8, 2, corr),
                       X("<built-in method cpu of Tensor object at 0x7f01>", at + 11, 42,
                         cat="python_function"),
                       X("aten::to", at + 12, 40),
                       X("cudaMemcpyAsync", at + 13, 15, cat="cuda_runtime",
                         correlation=corr + 1),
                       X("Memcpy DtoH (Device -> Pageable)", at + 20, 2, cat="gpu_memcpy",
                         tid=7, correlation=corr + 1, stream=7),
                       X("cudaStreamSynchronize", at + 30, 5, cat="cuda_runtime")]
            corr += 2
        t += 200 * 60
    table = read_path(_write(tmp_path, events))
    f = table.frame
    assert (f["syncs"] == 200).all()
    assert (f["sync_ns"] == 200 * 20 * 1000).all()  # 15 + 5 us blocked per element
    # from each sync's return (at +35 us) to the next element's kernel (+68 us): 33 us idle
    # (the last one's runs to the step's end, as the device window closes at its last work)
    assert ((f["sync_idle_ns"] >= 199 * 33_000) & (f["sync_idle_ns"] <= 200 * 33_000)).all()
    rep = analyze_table(table, Thresholds(), own=True)
    assert rep.verdict.label == "host-bound", rep.verdict
    top = rep.suggestions[0]
    assert top.knob == "host_syncs" and "200 syncs" in top.current
    # where they come from: the Python call, the op it made and the code's own frame
    assert "from Tensor.cpu() (aten::to) in loop.py(7): step," in top.current, top.current
    # the GPU's idle after the syncs: a part of its wait on the host, in the table and the JSON
    r = rep.ranks[0]
    want = 100 * f["sync_idle_ns"].sum() / f["step_ns"].sum()
    assert r.sync_idle_pct == pytest.approx(want) and 0 < r.sync_idle_pct <= r.host_pct
    assert rep.to_dict()["ranks"][0]["sync_idle_pct"] == pytest.approx(want, abs=1e-3)
    from gpuscope.render import terminal

    text = " ".join(terminal.render(rep, width=200).split())
    # what the host did meanwhile, another view of the same wait: Python outside the ops in
    # 10 of every 60 us (10-12 between add and to, 52-60 after to), the GPU idle in all of it
    assert ((f["python_ns"] >= 199 * 10_000) & (f["python_ns"] <= 200 * 10_000)).all(), \
        f["python_ns"].tolist()
    assert (f"(in {want:.0f}%, after the host's syncs returned; in {r.python_pct:.0f}%, while "
            "it ran no torch op (its Python, or work not in the trace))") in text
    assert not any("CUDA graphs" in s.proposed for s in rep.suggestions)
    step_ms = rep.ranks[0].step_ns / 1e6
    lo, hi = top.estimated_step_ms_range
    assert abs(top.estimated_step_ms - (step_ms - 4.0)) < 0.05 and hi == top.estimated_step_ms
    assert lo >= 0.8 - 1e-9  # the GPU's own busy time: 4 us of kernel and copy per element


def test_the_d2h_puzzler_is_told_to_remove_its_syncs():
    """GPUPuzzlers' d2h_sync trace (sample_traces/external): 4,097 syncs, 60.8 ms of its
    183.5 ms blocked in them and their copies; the answer the authors give is the syncs."""
    rep = gpuscope.analyze(os.path.join(SAMPLES, "external", "gpupuzzlers_d2h_first_sum"))
    f = rep.table.frame
    assert int(f["syncs"].sum()) == 4097 and abs(f["sync_ns"].sum() / 1e6 - 60.757) < 0.01
    assert f["sync_idle_ns"].sum() > 0.8 * f["host_ns"].sum()  # the idle follows the syncs
    (top,) = [s for s in rep.suggestions if s.addresses == "host-bound"]
    assert top.knob == "host_syncs" and abs(top.estimated_step_ms - 122.7) < 0.1
    assert "from Tensor.cpu() (aten::to) in first_sum.py(4): first_sum (9" in top.current  # 4,096 of 4,097
    assert top.estimated_step_ms_range[0] > 11.0  # the GPU's copies: never a range from 0
    small = gpuscope.analyze(os.path.join(SAMPLES, "external", "gpupuzzlers_small_kernels"))
    assert any("CUDA graphs" in s.proposed for s in small.suggestions)  # 2 syncs, 0.5 ms
    # ResNet-50 with 4 workers (a TensorBoard tutorial): 2 syncs a step, the host waiting
    # 14.7 ms on a busy GPU and launching at once after: not the cause of its idle time
    shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces",
                          "external", "tb_resnet50_nw4")
    if os.path.isdir(shared):
        rep = gpuscope.analyze(shared)
        assert not any(s.knob == "host_syncs" for s in rep.suggestions)


def test_a_sync_that_returns_while_the_gpu_is_busy_leaves_no_idle_after_it(tmp_path):
    """A sync on one stream that returns while another stream's kernel still runs: the GPU was
    not left idle by it, so none of the step's later idle (the host late with its next launch)
    is counted after it."""
    events = [X("ProfilerStep#1", 0, 2000), X("ProfilerStep#2", 2000, 100),
              launch(10, 1), kernel("long_kernel", 20, 980, 1, stream=7),
              X("cudaStreamSynchronize", 100, 50, cat="cuda_runtime"),  # returns at 150 us
              launch(1490, 2), kernel("next_kernel", 1500, 400, 2, stream=8)]
    f = read_path(_write(tmp_path, events)).frame
    (row,) = f[f["step"] == 1].itertuples()
    assert row.syncs == 1 and row.sync_ns == 50_000
    assert row.sync_idle_ns == 0 and row.host_ns > 0


def test_maths_on_cpu_tensors_is_its_own_cause_of_the_gpus_idle(tmp_path):
    """Issue 70: each step runs a kernel, then 500 us of maths on CPU tensors (an aten::add_
    that launches nothing) and a 300 us view (aten::select: no maths), then launches the next
    kernel. The GPU's idle in the maths is counted apart, views aside; the fix is to move those
    tensors to the GPU (no CUDA graphs for it), its estimate bounded by that idle."""
    from gpuscope.analyze.run import analyze_table
    from gpuscope.render import terminal
    from gpuscope.thresholds import Thresholds

    events, t, corr = [], 0, 1
    for s in range(8):
        events += [X(f"ProfilerStep#{s}", t, 1_000),
                   X("aten::mm", t, 20),
                   X("cudaLaunchKernel", t + 2, 5, cat="cuda_runtime", correlation=corr),
                   kernel("sgemm", t + 10, 100, corr),
                   X("aten::add_", t + 150, 500),   # CPU maths: no runtime call inside
                   X("aten::select", t + 660, 300),  # a view: framework work, not maths
                   X("aten::mm", t + 970, 20),
                   X("cudaLaunchKernel", t + 972, 5, cat="cuda_runtime", correlation=corr + 1),
                   kernel("sgemm", t + 980, 15, corr + 1)]
        corr += 2
        t += 1_000
    table = read_path(_write(tmp_path, events))
    f = table.frame
    assert (f["cpu_math_ns"] == 500_000).all(), f["cpu_math_ns"].tolist()
    assert (f["cpu_math_ns"] <= f["host_ns"]).all()
    rep = analyze_table(table, Thresholds(), own=True)
    (maths,) = [s for s in rep.suggestions if s.knob == "cpu_maths"]
    step = rep.ranks[0].step_ns / 1e6
    assert maths.estimated_step_ms == pytest.approx(step - 0.25, abs=0.01)  # half of 0.5 ms
    assert maths.estimated_step_ms_range[0] == pytest.approx(step - 0.5, abs=0.01)
    launch = next(s for s in rep.suggestions if s.knob == "host_overhead")
    host = rep.ranks[0].host_pct * step / 100
    assert launch.estimated_step_ms == pytest.approx(step - 0.5 * (host - 0.5), abs=0.01)
    r = rep.ranks[0]
    assert r.cpu_math_pct == pytest.approx(100 * 0.5 / step, abs=0.01)
    text = " ".join(terminal.render(rep, width=200).split())
    assert f"in {r.cpu_math_pct:.0f}%, while it computed on CPU tensors" in text


def test_the_hosts_python_between_ops_is_named_apart(tmp_path):
    """Issue 70: each step runs a kernel, then the training thread runs 640 us of Python with no
    torch op in it (a loop over a list, logging), then a 200 us view op, then launches the next
    kernel. The GPU's idle while no op ran is counted apart (python_ns, ranks[].python_pct) from
    its idle inside ops (dispatch and launch); the launch advice names both, and what removes
    the Python (capturing the step, moving the work out of the loop), not fusing kernels."""
    from gpuscope.analyze.run import analyze_table
    from gpuscope.render import terminal
    from gpuscope.thresholds import Thresholds

    events, t, corr = [], 0, 1
    for s in range(8):
        events += [X(f"ProfilerStep#{s}", t, 1_000),
                   X("aten::mm", t, 20),
                   X("cudaLaunchKernel", t + 2, 5, cat="cuda_runtime", correlation=corr),
                   kernel("sgemm", t + 10, 100, corr),  # the GPU busy until t + 110
                   X("aten::select", t + 750, 200),     # Python from t + 20 to t + 750
                   X("aten::mm", t + 960, 20),
                   X("cudaLaunchKernel", t + 962, 5, cat="cuda_runtime", correlation=corr + 1),
                   kernel("sgemm", t + 970, 20, corr + 1)]
        corr += 2
        t += 1_000
    table = read_path(_write(tmp_path, events))
    f = table.frame
    inner = f.iloc[1:-1]  # a step's idle: 990 .. 1,010 of the step before, then 110 .. 970
    # outside ops: 990 .. 1,000 (the step before's end), 110 .. 750, 950 .. 960
    assert (inner["python_ns"] == 660_000).all(), f["python_ns"].tolist()
    assert (inner["host_ns"] == 880_000).all(), f["host_ns"].tolist()  # 20 + 860
    assert (f["cpu_math_ns"] == 0).all()  # a view is not maths
    rep = analyze_table(table, Thresholds(), own=True)
    r = rep.ranks[0]
    assert 0 < r.python_pct <= r.host_pct
    assert rep.to_dict()["ranks"][0]["python_pct"] == pytest.approx(r.python_pct, abs=1e-3)
    (launch,) = [s for s in rep.suggestions if s.knob == "host_overhead"]
    assert "ms while the host ran no torch op (its Python, or work the trace does not hold)" \
        in launch.current
    assert "fusing kernels does not shorten it" in launch.why and "fuse kernels" not in launch.why
    text = " ".join(terminal.render(rep, width=200).split())
    assert f"in {r.python_pct:.0f}%, while it ran no torch op (its Python, or work not in the " \
        "trace)" in text
