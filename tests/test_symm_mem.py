"""Symmetric-memory collectives (torch.ops.symm_mem) in a recording. No kernel for them ships
for CPU, so these tests register one (it blocks 4 ms, as a collective that waits would); on a
GPU they run on the stream, which a test stands in for by making the input count as a GPU's."""

import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory  # noqa: E402,F401  (loads the fused ops)

import gpuscope  # noqa: E402
from gpuscope.record import collectives  # noqa: E402
from gpuscope.record.collectives import (CollectiveTimer, SymmMemOp, symm_mem_kinds,  # noqa: E402
                                         untimed_on_stream)

BLOCK_S = 0.004


@pytest.fixture
def one_rank_with_a_cpu_kernel(tmp_path, monkeypatch):
    """A 1-rank gloo group and a CPU kernel for symm_mem::one_shot_all_reduce."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GPUSCOPE_DISABLE"):
        monkeypatch.delenv(var, raising=False)

    def blocking_all_reduce(x, reduce_op, group_name):
        time.sleep(BLOCK_S)
        return x.clone()

    lib = torch.library.Library("symm_mem", "IMPL")
    lib.impl("one_shot_all_reduce", blocking_all_reduce, "CPU")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()
        lib._destroy()


def _train(run_dir, group_name, steps=8):
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    packet = torch.ops.symm_mem.one_shot_all_reduce
    with gpuscope.record(run_dir, model=model, memory=False) as rec:
        wrapped = torch.ops.symm_mem.one_shot_all_reduce
        for x in rec.data(torch.randn(4, 16) for _ in range(steps)):
            out = model(x)
            wrapped(out.detach(), "sum", group_name)  # as a gradient's all-reduce would be
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            rec.step()
    return packet, wrapped


def test_a_host_symmetric_memory_all_reduce_is_timed_as_blocked_communication(
        tmp_path, one_rank_with_a_cpu_kernel):
    packet, wrapped = _train(tmp_path / "run", one_rank_with_a_cpu_kernel)
    # behind gpuscope's callable while recording, every attribute still the op's own; put back
    assert isinstance(wrapped, SymmMemOp) and wrapped.default is packet.default
    assert wrapped.overloads() == packet.overloads()
    assert torch.ops.symm_mem.one_shot_all_reduce is packet
    rep = gpuscope.analyze(str(tmp_path / "run"))
    frame = rep.table.frame
    # each step blocked 4 ms or more in it (a sleep lasts at least that long), all exposed
    assert (frame["comm_ns"] >= BLOCK_S * 1e9).all(), frame["comm_ns"].tolist()
    assert (frame["comm_exposed_ns"] == frame["comm_ns"]).all()
    (r,) = rep.ranks
    assert set(r.comm_by_kind) == {"all_reduce"} and r.comm_by_kind["all_reduce"] >= 4.0
    assert not any("symmetric-memory" in w for w in rep.warnings)


def test_on_a_gpu_stream_they_are_counted_and_the_report_says_their_time_is_not_seen(
        tmp_path, one_rank_with_a_cpu_kernel, monkeypatch):
    monkeypatch.setattr(collectives, "on_gpu", lambda x: True)  # stands in for a CUDA tensor
    _train(tmp_path / "run", one_rank_with_a_cpu_kernel, steps=8)
    rep = gpuscope.analyze(str(tmp_path / "run"))
    assert (rep.table.frame["comm_ns"] == 0).all()  # a launch is not a transfer: no time made up
    (note,) = [w for w in rep.warnings if "symmetric-memory" in w]
    assert "all_reduce:default x8" in note and "8 step(s)" in note


def test_the_group_collectives_among_the_ops_are_found_by_name_and_group_argument():
    names = ["symm_mem::one_shot_all_reduce", "symm_mem::nvshmem_put", "symm_mem::_rendezvous",
             "symm_mem::fused_matmul_reduce_scatter", "aten::all_gather", "symm_mem::tile_reduce",
             "symm_mem::_low_contention_all_gather", "symm_mem::all_to_all_vdev"]
    groups = {"one_shot_all_reduce": 2, "_rendezvous": 1, "fused_matmul_reduce_scatter": 4,
              "tile_reduce": 3, "_low_contention_all_gather": 1, "all_to_all_vdev": 4}
    found = symm_mem_kinds(names, lambda n: groups.get(n, -1))
    assert found == {"one_shot_all_reduce": ("all_reduce", 2),
                     "fused_matmul_reduce_scatter": ("reduce_scatter", 4),
                     "tile_reduce": ("reduce", 3), "_low_contention_all_gather": ("all_gather", 1),
                     "all_to_all_vdev": ("all_to_all", 4)}
    # this torch's own ops: every all-reduce flavour, and no op without a group
    ns = torch.ops.symm_mem
    real = symm_mem_kinds(torch._C._dispatch_get_all_op_names(), lambda n: [
        a.name for a in getattr(ns, n).default._schema.arguments].index("group_name")
        if "group_name" in [a.name for a in getattr(ns, n).default._schema.arguments] else -1)
    assert {"one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_"} <= set(real)
    assert "nvshmem_put" not in real and "_rendezvous" not in real


def test_a_call_the_wrapper_cannot_read_is_still_made():
    calls = []

    def packet(*args, **kwargs):
        calls.append(args)
        return "out"

    timer = CollectiveTimer(lambda *a: calls.append(("sink",) + a), lambda *a: None,
                            now=iter(range(0, 10**6, 10)).__next__)
    assert timer.attach()
    try:
        op = SymmMemOp(packet, "all_reduce", 2)
        assert op() == "out" and op(object(), "sum", 7) == "out"  # no group name: "?"
    finally:
        timer.detach()
    assert calls[0] == () and calls[-1][1] == "all_reduce:?"
    assert untimed_on_stream({"all_reduce:3": 5, "all_gather:3": 9}, 4).startswith(
        "symmetric-memory collectives ran on the GPU's stream in 4 step(s) (all_gather:3 x9, "
        "all_reduce:3 x5)")
