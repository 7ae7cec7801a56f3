"""Work queued on the GPU and waited for only at a collective, on modelled GPU timelines.

On several GPUs over NCCL, a rank whose kernels take longer (more tokens, a slower or throttled
GPU, a bigger expert) holds every other rank inside the all-reduce's kernel, on the device; on
every host the step looks alike (the host launches and runs ahead, then waits at loss.item()).
Only the device's clock (CUDA events, one clock per rank) tells the waiting ranks from the late
one. tests/gpu_model.py models that timeline (what is real, what is modelled: its docstring);
the H200's own record of the same shape, over gloo, is in test_gpu_records.py.
"""

import pytest

import gpuscope
from gpu_model import ddp_nccl_run
from gpuscope.vocab import COMM


def _report(tmp_path, **kw):
    ddp_nccl_run(str(tmp_path), **kw)
    return gpuscope.analyze(str(tmp_path))


@pytest.mark.parametrize("ranks,late", [(2, 1), (4, 2), (8, 5)])
def test_a_rank_whose_kernels_run_longer_is_named_from_the_device_clock(tmp_path, ranks, late):
    extra = 40.0
    rep = _report(tmp_path, ranks=ranks, extra_ms={late: extra})
    assert rep.verdict.label == "imbalanced", rep.verdict
    assert [s.rank for s in rep.stragglers] == [late]
    s = rep.stragglers[0]
    assert abs(s.excess_ns / 1e6 - extra) <= 0.15 * extra, s.excess_ns
    assert s.cause == "compute" and "GPU" in s.cause_detail
    # the others' time inside the all-reduce is waiting, not transfer: no comm-bound anywhere,
    # and no batch-size or sync advice drawn from that waiting
    assert COMM not in rep.verdict.time_by_label or rep.verdict.time_by_label[COMM] < 0.05
    assert not {x.knob for x in rep.suggestions} & {"batch_size", "sync_frequency",
                                                      "grad_compression"}
    d = rep.to_dict()
    for r in d["ranks"]:
        if r["rank"] != late:
            assert r["wait_pct"] >= 70, r  # ~40 of ~48 ms
    assert next(r for r in d["ranks"] if r["rank"] == late)["wait_pct"] < 5


def test_no_straggler_when_every_gpu_does_the_same_work(tmp_path):
    rep = _report(tmp_path, ranks=4)
    assert rep.stragglers == []
    assert rep.verdict.label != "imbalanced"


def test_the_model_puts_the_waiting_on_the_device_not_on_the_host(tmp_path):
    """The model itself: on the host every rank's tail (DDP's finalize, NCCL) is as short; what
    the hosts wait in is loss.item(), alike on every rank. So the device is the only witness."""
    import json

    ddp_nccl_run(str(tmp_path), ranks=2, extra_ms={1: 40.0})
    rows, dev = {}, {}
    for r in (0, 1):
        lines = (tmp_path / f"rank-0000{r}.gpuscope.jsonl").read_text().splitlines()
        rows[r] = [json.loads(x) for x in lines[1:] if x.startswith("[")]
        dev[r] = next(json.loads(x)["device"] for x in lines if x.startswith('{"device"'))
    host_comm = {r: rows[r][10][5] for r in rows}
    assert host_comm[0] == host_comm[1] < 100_000
    assert abs(rows[0][10][2] - rows[1][10][2]) < 1_000_000  # the same host step
    gpu_comm = {r: dev[r][10]["gpu_comm_ns"] for r in dev}
    assert gpu_comm[0] > 40_000_000 > 3_000_000 > gpu_comm[1]


def test_the_cuda_seam_is_read_in_batches_not_once_per_event(tmp_path):
    """Events are resolved every few steps, never with a synchronize per step."""
    seams = ddp_nccl_run(str(tmp_path), ranks=2, steps=20)
    for seam in seams.values():
        assert seam.calls["synchronize"] <= 1  # at close only
