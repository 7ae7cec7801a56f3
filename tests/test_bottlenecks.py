"""Each bottleneck's module alone (analyze/bottlenecks/), on a hand-built typical step: its
suggestions and their estimates worked out by hand, without the rest of the analysis."""

from dataclasses import replace

import pytest

from gpuscope.analyze.bottlenecks import comm, data, host, imbalance
from gpuscope.analyze.findings import TypicalStep, gain
from gpuscope.results import Jitter, Straggler
from gpuscope.thresholds import Thresholds

MS = 1_000_000
TH = Thresholds()


def step(**kw) -> TypicalStep:
    base = dict(step=40 * MS, data=0.0, transfer=0.0, wait=0.0, compute=30 * MS, data_cpu=None,
                sync_interval=1)
    base.update(kw)
    return TypicalStep(**base)


def test_gain_is_throughput_not_time():
    assert gain(40, 20) == 100.0 and round(gain(40, 30, 1.5), 6) == 100.0


def test_data_workers_hide_the_wait_of_io_like_loading():
    # 20 ms of a 40 ms step waiting for a batch that takes 20 ms to load and barely uses the CPU
    # (a 20 ms load against 20 ms of other work: one worker hides it; with 4 cores the rank has
    # two to spare beside it, so the training thread takes a ready batch in 0.1 ms; the range's
    # upper end is what a worker costs the loop on 2 cores, 0.5 ms a batch)
    t = step(data=20 * MS, data_cpu=0.5 * MS)
    out, why = data.suggest_data(t, {"num_workers": 0, "dataloader": True,
                                     "cpus_available": 4}, TH)
    assert why == "" and [s.knob for s in out] == ["num_workers"]
    (top,) = out
    assert (top.current, top.proposed) == (0, 1) and top.addresses == "data-bound"
    assert top.estimated_step_ms == 20.1 and top.estimated_step_ms_range == (20.1, 20.5)
    assert round(top.gain_pct, 1) == round(gain(40, 20.1), 1)
    # on 2 cores the worker shares the training's: 0.5 ms a batch, the point and the range
    out, _ = data.suggest_data(t, {"num_workers": 0, "dataloader": True, "cpus_available": 2}, TH)
    assert out[0].estimated_step_ms == 20.5 and out[0].estimated_step_ms_range == (20.5, 20.5)


def test_data_no_workers_for_loading_that_is_not_a_dataloader():
    t = step(data=20 * MS, data_cpu=0.5 * MS)
    out, why = data.suggest_data(t, {"dataloader": False, "loader": "generator"}, TH)
    assert out == [] and "not a torch DataLoader" in why


def test_comm_sync_less_often_from_the_measured_transfer():
    # 12 ms of exposed transfer per 40 ms step, syncing every step
    t = step(transfer=12 * MS, compute=28 * MS)
    out = comm.suggest_comm(t, {"ddp": True, "sync_interval": 1}, TH)
    by = {s.knob: s for s in out}
    assert set(by) == {"sync_frequency", "grad_compression"}
    # syncing every k steps spreads the transfer over k of them; the smallest k that brings it
    # under 5% of the step is 9 (12/9 ms of 29.3), 8 leaves 5.1%; proposed: the ladder's next
    # rung, 12 (whatif.SYNC_MULTIPLES)
    s = by["sync_frequency"]
    assert s.proposed == "every 12 steps" and s.addresses == "comm-bound"
    assert abs(s.estimated_step_ms - (28 + 12 / 12)) < 1e-9
    # bf16 gradients halve the bytes: half the transfer goes
    assert by["grad_compression"].estimated_step_ms == 34.0


def test_comm_fsdp_all_gathers_kept_or_prefetched():
    # 12 ms exposed, three quarters of it FSDP all-gathers: keeping the gathered parameters saves
    # about half of those (9 ms -> 4.5), all of them at best, a quarter at worst
    t = step(transfer=12 * MS, compute=28 * MS)
    out = comm.suggest_comm(t, {"fsdp": True, "sync_interval": 1}, TH,
                            {"all_gather": 6.0, "reduce_scatter": 2.0})
    s = {s.knob: s for s in out}["reshard_after_forward"]
    assert (s.current, s.proposed) == (True, False)
    assert s.estimated_step_ms == 40 - 4.5 and s.estimated_step_ms_range == (31.0, 37.75)
    assert "set_modules_to_forward_prefetch" in s.why and "backward_prefetch" in s.why


def test_host_fewer_launches_bound_by_the_idle_time():
    t = step(host=10 * MS, compute=25 * MS)
    (s,), why = host.suggest_host(t)
    # the estimate promises half of the idle gaps closed (what the evidence supports), all of
    # them the range's other end (the H100 tutorial trace got +651% with its range from +67%)
    assert s.addresses == "host-bound" and s.estimated_step_ms == 35.0
    assert s.estimated_step_ms_range == (30.0, 35.0)
    assert why == "" and host.suggest_host(step()) == ([], "")


def test_a_step_with_no_kernel_gets_no_launch_advice_and_says_why():
    """Issue 70: maths on CPU tensors, the GPU idle the whole step and no kernel in it: no
    CUDA-graph / torch.compile suggestion with a range from a 0 ms step; the reason instead,
    and the fix that follows the cause (the tensors on the GPU), measured by a trial."""
    t = step(host=25 * MS, compute=0.0, step=25 * MS)
    assert t.transfer == t.wait == 0
    got, why = host.suggest_host(t)
    assert got == [] and "no GPU kernel" in why and ".to('cuda')" in why
    assert "CUDA graphs" not in why and "gpuscope try" in why
    # device-to-host copies are GPU work (a sync per element): launch advice stays
    got, why = host.suggest_host(step(host=23 * MS, compute=0.0, step=25 * MS))
    assert len(got) == 1 and why == ""


def test_a_step_that_syncs_gets_the_syncs_removed_first_and_no_graph_advice():
    """Issue 70: a loop that blocks on the GPU thousands of times a step (a .cpu() per
    element): remove or batch the syncs, with an estimate bounded by what they cost (the host's
    time blocked in them) and never below the GPU's own busy time; no CUDA-graph advice, which
    cannot capture a sync, and why."""
    t = step(step=30 * MS, compute=5 * MS, host=20 * MS, sync=8 * MS, syncs=4096,
             sync_idle=18 * MS)
    (s,), why = host.suggest_host(t)
    assert (s.knob, s.addresses) == ("host_syncs", "host-bound")
    # the host's 8 ms blocked go; its other work stays: 22 ms; all of it gone: the GPU's 10
    assert s.estimated_step_ms == 22.0 and s.estimated_step_ms_range == (10.0, 22.0)
    assert "4,096" in s.current and "non_blocking=True" in s.why
    assert "CUDA graphs" not in s.proposed and "cannot capture a sync" in why
    # the GPU idle after the syncs less than the host's time in them: no more than that idle
    (s,), _ = host.suggest_host(step(step=30 * MS, compute=5 * MS, host=20 * MS, sync=8 * MS,
                                     syncs=50, sync_idle=6 * MS))
    assert s.knob == "host_syncs" and s.estimated_step_ms == 24.0
    # the GPU busier than the host's work without its syncs: the step stays at the GPU's time
    (s,), _ = host.suggest_host(step(step=30 * MS, compute=25 * MS, host=5 * MS, sync=8 * MS,
                                     syncs=10, sync_idle=5 * MS))
    assert s.estimated_step_ms == 25.0 and s.estimated_step_ms_range[0] >= 25.0
    # a host that waits long on a busy GPU, then launches at once (the idle is elsewhere), a
    # sync before a long stretch of host work (Triton compiling: its removal saves nothing),
    # or one .item() a step: the launches are the cause, as before
    for t in (step(step=40 * MS, compute=25 * MS, host=10 * MS, sync=20 * MS, syncs=15,
                   sync_idle=1 * MS),
              step(step=40 * MS, compute=5 * MS, host=30 * MS, sync=0.01 * MS, syncs=1,
                   sync_idle=30 * MS),
              step(step=40 * MS, compute=25 * MS, host=10 * MS, sync=0.5 * MS, syncs=1,
                   sync_idle=0.5 * MS)):
        (s,), why = host.suggest_host(t)
        assert "CUDA graphs" in s.proposed and why == ""


def test_syncs_held_by_one_rank_are_said_to_be_its():
    """The mean step averages the ranks' syncs (310 a step where rank 1 spins on
    cudaDeviceSynchronize ~600 times and rank 0 syncs 7): the suggestion says whose they are;
    syncs spread over the ranks name none."""
    import pandas as pd

    frame = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [1, 2, 1, 2], "syncs": [7, 7, 600, 624],
                          "sync_idle_ns": [1e6, 1e6, 20e6, 22e6]})
    where = host.whose_syncs(frame)
    assert where == "mostly on rank 1 (612 a step; the others 7)"
    t = step(step=30 * MS, compute=5 * MS, host=20 * MS, sync=8 * MS, syncs=310,
             sync_idle=18 * MS)
    (s,), _ = host.suggest_host(t, where)
    assert s.current == "310 syncs per step, mostly on rank 1 (612 a step; the others 7), " \
                        "the GPU idle 18.0 ms after them"
    assert host.whose_syncs(frame.assign(sync_idle_ns=[10e6, 10e6, 12e6, 12e6])) == ""
    assert host.whose_syncs(frame[frame["rank"] == 1]) == ""


def test_imbalance_names_the_straggler_and_recovers_at_most_the_wait():
    t = step(wait=15 * MS)
    late = Straggler(1, 0.9, 15 * MS, "compute", "forward", 15 * MS, host="h1")
    (s,) = imbalance.suggest_imbalance(t, [late], {})
    assert s.current == "rank 1 on host h1" and s.estimated_step_ms == 25.0
    assert "forward" in s.why and s.estimated_step_ms_range[0] >= 25.0


def test_a_stragglers_fix_on_shared_cores_may_slow_the_others_down():
    """2 ranks of 1 thread on a 2-core host with other work (load 4.7): while rank 1 waits the
    other computes on its core, and beside it may run up to 2x slower: the range reaches that
    (to no gain at all), said; the point stays; quiet (load 0.5), with a core each, or on a GPU,
    the range stays the model's."""
    t = step(wait=15 * MS)
    late = Straggler(1, 0.9, 15 * MS, "compute", "forward", 15 * MS, host="h1")
    cpu = {"device": "cpu", "cpus_available": 2, "local_world_size": 2, "torch_threads": 1}
    (plain,) = imbalance.suggest_imbalance(t, [late], {})
    (busy,) = imbalance.suggest_imbalance(t, [late], {**cpu, "load_avg": 4.7})
    assert busy.estimated_step_ms == plain.estimated_step_ms == 25.0
    assert busy.estimated_step_ms_range == (plain.estimated_step_ms_range[0], t.step / MS)
    assert "up to 2.0x slower beside it" in busy.why and "load 4.7" in busy.why
    for knobs in ({**cpu, "load_avg": 0.5}, {**cpu, "cpus_available": 4, "load_avg": 1.0},
                  {**cpu, "device": "cuda:0", "load_avg": 4.7}):
        (same,) = imbalance.suggest_imbalance(t, [late], knobs)
        assert same.estimated_step_ms_range == plain.estimated_step_ms_range, knobs
        assert "slower beside it" not in same.why
    # 4 ranks of 1 thread on 2 cores: oversubscribed by their own threads, one straggler
    (own,) = imbalance.suggest_imbalance(t, [late], {**cpu, "local_world_size": 4})
    assert "up to 1.3x slower" in own.why and "load" not in own.why


def test_jitter_gets_its_own_fix_and_estimate():
    # a fifth of the time lost waiting that moves between ranks: all of it back at best
    t = step(wait=8 * MS)
    (s,) = imbalance.suggest_jitter(t, Jitter(steps_share=0.6, wait_share=0.2))
    assert s.addresses == "jitter-bound" and s.estimated_step_ms == 32.0
    assert s.estimated_step_ms_range == (32.0, 40.0)


def test_each_bottleneck_holds_its_own_evidence_on_a_hand_built_step_table():
    import numpy as np
    import pandas as pd

    from gpuscope.analyze.bottlenecks import pipeline
    from gpuscope.analyze.consistency import Roles

    steps = pd.DataFrame({"step": [1, 2, 3, 4], "data_share": [0.25, 0.1, 0.0, 0.0],
                          "comm_share": [0.0, 0.2, 0.1, 0.0], "host_share": [0.0, 0.0, 0.3, 0.0],
                          "bubble_share": [0.0, 0.0, 0.0, 0.2],
                          "wait_share": [0.0, 0.12, 0.0, 0.3]})
    assert data.SPEC.held(steps, TH).tolist() == [0.25, -1, -1, -1]   # >= 20%
    assert comm.SPEC.held(steps, TH).tolist() == [-1, 0.2, -1, -1]    # >= 15%
    assert host.SPEC.held(steps, TH).tolist() == [-1, -1, 0.3, -1]    # >= 15%
    assert pipeline.SPEC.held(steps, TH).tolist() == [-1, -1, -1, 0.2]
    # waiting >= 10% in steps 2 and 4: imbalance while roles are undecided ...
    waits, jitter = imbalance.waiting_steps(steps, TH, None)
    assert waits.tolist() == [False, True, False, True] and not jitter.any()
    # ... jitter when the roles are decided and no persistent rank explains it
    roles = Roles(n_steps=4, steps=np.array([1, 2, 3, 4]), ranks=np.array([0, 1]),
                  slow=np.zeros((4, 2), dtype=bool))
    waits, jitter = imbalance.waiting_steps(steps, TH, roles)
    assert not waits.any() and jitter.tolist() == [False, True, False, True]
    marked = steps.assign(waiting=waits, jitter=jitter)  # as classify marks them
    imb, jit = imbalance.SPEC.held(marked, TH), imbalance.JITTER_SPEC.held(marked, TH)
    assert imb.tolist() == [-1] * 4 and jit.tolist() == [-1, 0.12, -1, 0.3]


def test_jitter_never_recovers_more_than_the_waiting_there_is():
    # seen in a busy-core suite run (nanoGPT-style loop): the jitter share (each rank's wait
    # over its own, shorter step) times the mean step came to more than the mean longest wait,
    # and the report's bound had to clip the estimate with a warning
    t = step(wait=6 * MS)
    (s,) = imbalance.suggest_jitter(t, Jitter(steps_share=0.6, wait_share=0.2))  # 8 ms > 6
    assert s.estimated_step_ms == 34.0


def test_dataparallel_estimate_from_the_devices_totals_on_a_hand_built_table():
    """bottlenecks/dataparallel.py alone, on the recorder's DataParallel totals written by hand:
    10 steps of a 40 ms step; device 0's forward 6 ms a step against 2 on device 1, 3.5 ms of
    scatter / replicate / gather. DDP removes the host work and device 0's excess (backward taken
    as twice the forward): 40 - 3.5 - 3 x 4 = 24.5 ms, at least 30% of the step."""
    from gpuscope.analyze.bottlenecks.dataparallel import dataparallel
    from helpers import table_from_rows

    t = table_from_rows([{"rank": 0, "step": s, "compute": 40} for s in range(10)],
                        knobs={"parallel": "DataParallel", "device": "cuda:0"})
    GiB = 1 << 30
    t.ranks[0].meta["dataparallel"] = {
        "devices": ["0", "1"], "steps": 10, "forward_n": {"0": 10, "1": 10},
        "forward_ns": {"0": 60_000_000, "1": 20_000_000},
        "host_ns": {"scatter": 10_000_000, "replicate": 20_000_000, "gather": 5_000_000},
        "peak_bytes": {"0": 6 * GiB, "1": 4 * GiB}}
    section, (s,), warnings = dataparallel(t, lambda: 40_000_000, "imbalanced")
    assert warnings == []
    assert section.forward_ms == {"0": 6.0, "1": 2.0}
    assert (section.scatter_ms, section.replicate_ms, section.gather_ms) == (1, 2, 0.5)
    assert section.device0_forward_excess_pct == 200.0
    assert section.device0_memory_excess_pct == 50.0
    assert s.knob == "parallel" and s.addresses == "imbalanced"
    assert s.estimated_step_ms == pytest.approx(24.5)
    assert s.estimated_step_ms_range == pytest.approx((24.5, 24.5 * 1.3))
    assert s.gain_pct == pytest.approx((40 / 24.5 - 1) * 100)
    # a step mostly made of device 0's excess: the estimate keeps 30% of the step
    _, (floor,), _ = dataparallel(t, lambda: 12_000_000, "imbalanced")
    assert floor.estimated_step_ms == pytest.approx(3.6)
    # nothing timed per device (DataParallel on CPU runs the module itself): why it is slow,
    # no estimate
    t.ranks[0].meta["dataparallel"] = {"devices": [], "steps": 10}
    t.ranks[0].knobs["device"] = "cpu"
    section, made, (why,) = dataparallel(t, lambda: 40_000_000, "compute-bound")
    assert made == [] and "on CPU" in why and "DistributedDataParallel" in why
    # not DataParallel at all: nothing
    t.ranks[0].knobs["parallel"] = "DDP"
    assert dataparallel(t, lambda: 40_000_000, "compute-bound") == (None, [], [])


@pytest.mark.parametrize("load_ms, proposed", [(81, 8), (84, 8), (85, 12), (62, 6), (64, 8)])
def test_data_workers_proposed_hide_the_wait_to_within_five_percent(load_ms, proposed):
    """8.1 workers' worth of loading (81 ms a batch against 10 ms of other work): 8 leave
    0.125 ms a step waiting, 1.25% of it, so 8, not 12; past 5% (8.5 workers' worth) the next
    count. The record and the trace of one run read 7.9 and 8.1 and proposed 8 and 12 before."""
    t = step(step=(10 + load_ms) * MS, data=load_ms * MS, compute=10 * MS, data_cpu=0.1 * MS)
    assert t.busy == 10 * MS
    out, why = data.suggest_data(t, {"num_workers": 0, "dataloader": True,
                                     "cpus_available": 64}, TH)
    top = out[0]
    assert (top.knob, top.proposed) == ("num_workers", proposed), why
    # the estimate stays the step those workers give: the load over them where it is longer
    # (64 cores: a ready batch costs the training thread 0.1 ms)
    assert top.estimated_step_ms == pytest.approx(max(10, load_ms / proposed) + 0.1, abs=0.01)
    assert ("to within 5% of the step" in top.why) == (proposed < load_ms / 10)


def test_data_workers_for_a_loop_that_loads_in_its_own_thread_start_warm():
    """A loop that loads in its own thread leaves its work for the load every step, and the work
    then starts cold: with workers on spare cores it runs as the fastest tenth of today's steps
    (the H200's launch-bound loop: 4.85 ms of work on average after a 34.5 ms load in the thread,
    4.23 in its fastest tenth, 3.56 with 8 workers). Worked out by hand: 8 workers (34.5 / 4.85
    = 7.1 workers' worth); point max(4.23 + 0.1, 34.5 / 8 + 0.1) = 4.4125; range from 4.23 less
    (4.85 - 4.23) again, + 0.1 = 3.71, to the work as it is plus the 2-core hand-over, 5.35."""
    t = step(step=39.35 * MS, data=34.5 * MS, compute=4.0 * MS, data_cpu=1.4 * MS,
             busy_fast=4.23 * MS)
    knobs = {"num_workers": 0, "dataloader": True, "cpus_available": 16,
             "persistent_workers": True}
    (top, *_), why = data.suggest_data(t, knobs, TH)
    assert (top.knob, top.proposed) == ("num_workers", 8), why
    assert top.estimated_step_ms == pytest.approx(4.4125, abs=1e-6)
    lo, hi = top.estimated_step_ms_range
    assert lo == pytest.approx(3.71, abs=1e-6) and hi == pytest.approx(5.35, abs=1e-6)
    assert "fastest tenth" in top.why
    # without spare cores (2 a rank) its core is shared with the workers: nothing warms up
    (top, *_), _ = data.suggest_data(t, {**knobs, "cpus_available": 2}, TH)
    assert top.estimated_step_ms == pytest.approx(max(4.85, 34.5 / 8) + 0.5, abs=1e-6)
    # nor where the load is shorter than the work (the thread is not away most of the step)
    t2 = step(step=8 * MS, data=3 * MS, compute=4.0 * MS, busy_fast=3 * MS)
    (top, *_), _ = data.suggest_data(t2, knobs, TH)
    assert top.estimated_step_ms == pytest.approx(5.1, abs=1e-6)


def test_a_worker_count_on_a_rungs_edge_says_the_other_rung_and_its_estimate():
    """7.9 and 8.5 workers' worth of one run's loading (its record and its traces) propose 8 and
    12: each report says the need sits near that edge and what the other count would give, so
    the two tell one story; 7.5 is far from either edge: nothing said."""
    def top(load_ms):
        t = step(step=(10 + load_ms) * MS, data=load_ms * MS, compute=10 * MS, data_cpu=0.1 * MS)
        out, _ = data.suggest_data(t, {"num_workers": 0, "dataloader": True,
                                       "cpus_available": 64}, TH)
        return out[0]

    a, b = top(79), top(85)
    assert (a.proposed, b.proposed) == (8, 12)
    assert "near the edge between 8 and 12 workers" in a.why and "propose 12" in a.why
    assert "near the edge between 8 and 12 workers" in b.why and "propose 8" in b.why
    assert "near the edge" not in top(75).why


def test_the_syncs_source_is_named_alone_where_it_holds_most_of_them():
    """One source of 98% of the syncs is named with its share; where none holds half, the two
    largest; none
    without a trace's stacks; ranks' counts add up."""
    from gpuscope.analyze.bottlenecks.host import from_where, sync_sources
    from gpuscope.runtable import RankInfo

    assert from_where({"Tensor.cpu() (aten::to) in a.py(4): f": 98, "aten::item": 2}) == \
        "from Tensor.cpu() (aten::to) in a.py(4): f (98%)"
    assert from_where({"aten::item": 5}) == "from aten::item"
    assert from_where({"aten::item": 35, "aten::to": 45, "aten::copy_": 20}) == \
        "from aten::to (45%) and aten::item (35%)"
    assert from_where({}) == ""
    ranks = [RankInfo(0, meta={"sync_sources": {"aten::item": 3}}), RankInfo(1),
             RankInfo(2, meta={"sync_sources": {"aten::item": 4, "aten::to": 1}})]
    assert sync_sources(ranks) == {"aten::item": 7, "aten::to": 1}


def test_launch_overhead_says_how_long_the_gpu_works_and_waits_per_launch():
    """The queue drained (GPUPuzzlers' answer: a launch takes longer to come than its kernel to
    run): per launch, the GPU's work against its idle before the next; nothing without a count."""
    from gpuscope.analyze.bottlenecks.host import launch_gaps, suggest_host

    t = TypicalStep(step=10 * MS, data=0.0, transfer=0.0, wait=0.0, compute=2 * MS,
                    data_cpu=None, sync_interval=1, host=8 * MS, launches=100)
    assert launch_gaps(t) == (", 100 launches a step: 20 us of GPU work each against 80 us "
                              "idle waiting for the next")
    (s,), _ = suggest_host(t)
    assert s.knob == "host_overhead" and s.current.endswith(launch_gaps(t))
    assert launch_gaps(replace(t, launches=0.0)) == ""
    assert launch_gaps(replace(t, launches=2.0)) == ""  # one long gap is no launch's delay
