"""The comm hook wrapper on a real DDP model (gloo, one process): timing, and users' own hooks."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gpuscope  # noqa: E402


@pytest.fixture
def pg(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(model, rec, steps=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in rec.data([torch.randn(8, 32) for _ in range(steps)]):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        rec.step()


def _rows(run_dir):
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "rank-00000.gpuscope.jsonl"))]
    cols = lines[0]["columns"]
    return lines[0], [dict(zip(cols, r)) for r in lines if isinstance(r, list)]


def _model():
    return DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))


def test_buckets_are_timed_and_phases_found(pg, tmp_path):
    model = _model()
    with gpuscope.record(tmp_path, model=model) as rec:
        _train(model, rec)
    header, rows = _rows(tmp_path)
    assert "ddp_comm_hook" in header["comm_timing"].split("+")
    assert header["knobs"]["bucket_cap_bytes"] == model.bucket_bytes_cap
    assert header["knobs"]["params"] == sum(p.numel() for p in model.parameters())
    for r in rows:
        assert r["n_comm"] >= 1 and r["comm_ns"] > 0
        assert r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] > 0


def test_user_hook_registered_later_is_wrapped_not_replaced(pg, tmp_path):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls = []

    def my_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    model = _model()
    with gpuscope.record(tmp_path, model=model) as rec:
        model.register_comm_hook(None, my_hook)  # DDP alone would refuse a second hook
        _train(model, rec, steps=3)
    assert len(calls) >= 3  # the user's hook ran every step
    _, rows = _rows(tmp_path)
    assert all(r["n_comm"] >= 1 for r in rows)  # and gpuscope still timed it


def test_hook_registered_before_record_falls_back_to_ddp_logging(pg, tmp_path):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = _model()
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    with gpuscope.record(tmp_path, model=model) as rec:
        _train(model, rec)
    header, rows = _rows(tmp_path)
    assert "ddp_logging" in header["comm_timing"].split("+")
    assert len(rows) == 4
    end = json.loads(open(tmp_path / "rank-00000.gpuscope.jsonl").read().splitlines()[-1])["end"]
    assert "ddp_logging" in end and any("comm hook" in w for w in end["warnings"])


def test_after_stop_the_comm_hook_only_forwards_and_holds_nothing(pg, tmp_path):
    """DDP cannot unregister a comm hook: after the recording the dispatcher stays, forwards to
    the same all-reduce, takes no timings and no longer keeps the recorder alive."""
    import gc
    import weakref

    model = _model()
    rec = gpuscope.record(tmp_path, model=model)
    with rec:
        _train(model, rec, steps=3)
    timer = model._comm_hooks[0][1] if hasattr(model, "_comm_hooks") and model._comm_hooks \
        else None
    size = os.path.getsize(tmp_path / "rank-00000.gpuscope.jsonl")
    ref = weakref.ref(rec)
    del rec
    gc.collect()
    assert ref() is None  # the hook no longer holds the recorder
    reference = _model()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(8, 32)
    for m in (model, reference):
        m.zero_grad()
        m(x).sum().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a.grad, b.grad)  # the same reduction as DDP's own
    assert os.path.getsize(tmp_path / "rank-00000.gpuscope.jsonl") == size
    if timer is not None:
        assert timer.sink is None and not timer.active
