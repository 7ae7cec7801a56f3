"""MFU against the peak of the dtype the maths ran in, never above 100%.

The recorder runs for real here (CPU torch: autocast on the CPU casts matmuls as it does on a
GPU); only the device's name is set afterwards to a GPU's, since the peak table holds GPUs.
The H200's own record (bf16 autocast, made before the recorder read the precision) is in
test_gpu_records.py.
"""

import glob
import json
import os

import pytest
from msgspec import UNSET
import torch

import gpuscope
from gpuscope.analyze.run import analyze_table
from gpuscope.analyze.throughput import PEAKS, math_dtypes
from gpuscope.readers import read_path
from gpuscope.thresholds import Thresholds

H200 = next(p for _, label, p in PEAKS if label == "H200")


def _train(run_dir, how: str, steps: int = 6):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    dtype = torch.bfloat16 if how == "bf16_model" else torch.float32
    m = m.to(dtype)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    before = torch.get_float32_matmul_precision()
    if how == "tf32":
        torch.set_float32_matmul_precision("high")
    try:
        with gpuscope.record(run_dir, model=m, count_flops=True) as rec:
            for x in rec.data([torch.randn(16, 64, dtype=dtype) for _ in range(steps)]):
                if how in ("autocast_bf16", "autocast_fp16"):
                    with torch.autocast("cpu", dtype=torch.bfloat16 if how == "autocast_bf16"
                                        else torch.float16):
                        y = m(x)
                else:
                    y = m(x)
                y.float().sum().backward()
                opt.step()
                opt.zero_grad()
                rec.step()
    finally:
        torch.set_float32_matmul_precision(before)


def _knobs(run_dir):
    out = {}
    path = glob.glob(os.path.join(run_dir, "rank-*.gpuscope.jsonl"))[0]
    for line in open(path):
        obj = json.loads(line)
        if isinstance(obj, dict):
            out.update(obj.get("knobs") or {})
    return out


def _on_h200(run_dir):
    """The recorded table, its device named an H200 (the recording ran on this CPU)."""
    table = read_path(str(run_dir))
    for info in table.ranks.values():
        info.meta["gpu"] = {"name": "NVIDIA H200", "device_timing": "cuda_events"}
    return analyze_table(table, Thresholds(warmup_steps=1))


@pytest.mark.parametrize("how,dtype,peak_key", [
    ("autocast_bf16", "bfloat16", "bf16"),
    ("autocast_fp16", "float16", "fp16"),
    ("bf16_model", "bfloat16", "bf16"),
    ("fp32", "float32", "fp32"),
    ("tf32", "float32", "tf32"),
])
def test_the_peak_follows_the_dtype_the_maths_ran_in(tmp_path, how, dtype, peak_key):
    _train(str(tmp_path), how)
    knobs = _knobs(str(tmp_path))
    assert set(knobs["flops_by_dtype"]) == {dtype}, knobs
    assert sum(knobs["flops_by_dtype"].values()) == knobs["flops_per_step"]
    assert knobs["autocast_dtype"] == ("off" if how in ("bf16_model", "fp32", "tf32") else dtype)
    assert knobs["float32_matmul_precision"] == ("high" if how == "tf32" else "highest")
    rep = _on_h200(str(tmp_path))
    t = rep.throughput
    assert t.peak_flops == pytest.approx(H200[peak_key] * 1e12)
    assert f"dense {peak_key} " in t.peak_source
    # MFU by hand: FLOPs per step over the mean step time, over that peak
    want = 100 * knobs["flops_per_step"] / (1e-9 * float(rep.table.frame["step_ns"].mean())) \
        / (H200[peak_key] * 1e12)
    assert 100 * t.flop_per_s / t.peak_flops == pytest.approx(want, rel=0.02)
    assert t.mfu_pct == pytest.approx(want, abs=0.011)


def test_the_probe_leaves_the_model_without_hooks(tmp_path):
    m = torch.nn.Linear(4, 4)
    with gpuscope.record(str(tmp_path), model=m) as rec:
        for x in rec.data([torch.randn(2, 4) for _ in range(4)]):
            m(x).sum().backward()
            rec.step()
        assert not m._forward_pre_hooks  # read on the second forward, then removed
    assert not m._forward_pre_hooks and "forward" not in vars(m)


def test_several_dtypes_give_the_peak_at_which_their_flops_take_their_time():
    knobs = {"flops_by_dtype": {"bfloat16": 900, "float32": 100}}
    shares, how = math_dtypes(knobs)
    assert shares == {"bf16": 0.9, "fp32": 0.1} and "counted" in how
    from gpuscope.analyze.throughput import _peak

    class T:
        ranks = {0: type("I", (), {"meta": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}}})()}

    peak, what = _peak(T, knobs)
    h100 = next(p for _, label, p in PEAKS if label == "H100 SXM")
    assert peak == pytest.approx(1e12 / (0.9 / h100["bf16"] + 0.1 / h100["fp32"]))
    assert "90% bf16 + 10% fp32" in what
    # TF32 allowed: the fp32 share runs at the TF32 peak
    peak, _ = _peak(T, {**knobs, "float32_matmul_precision": "high"})
    assert peak == pytest.approx(1e12 / (0.9 / h100["bf16"] + 0.1 / h100["tf32"]))


def test_an_mfu_above_100_percent_is_never_given(tmp_path):
    """FLOPs that cannot fit the step at the peak: which input is wrong is said, no figure."""
    _train(str(tmp_path), "fp32")
    table = read_path(str(tmp_path))
    for info in table.ranks.values():
        info.meta["gpu"] = {"name": "NVIDIA H200"}
        info.knobs["flops_per_step"] = 1e15  # far more than the step could do at the peak
        info.knobs.pop("flops_by_dtype", None)
        info.knobs["flops_source"] = "given"
    rep = analyze_table(table, Thresholds(warmup_steps=1))
    t = rep.throughput
    assert t.mfu_pct is None and all(r.mfu_pct is UNSET for r in t.per_rank)
    assert "no device runs above its peak" in t.mfu_impossible
    assert any("no device runs above its peak" in w for w in rep.warnings)
    from gpuscope.render.terminal import render

    text = render(rep)
    assert "MFU unknown (above 100%" in text
    assert not any("MFU" in line and "%" in line and "of H200" in line
                   for line in text.splitlines())
