"""The H200's own records (../shared/gpu-h200/, README there: each run and what was true in it),
read on a CPU: what gpuscope says of them must be what happened.
"""

import os
import re

import pytest

import gpuscope
from gpuscope.analyze.run import analyze_table
from gpuscope.readers import read_path
from gpuscope.render.terminal import render
from gpuscope.thresholds import Thresholds
from helpers import rerun_band

H200 = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "gpu-h200")


def _run(name: str) -> str:
    path = os.path.join(H200, name)
    if not os.path.isdir(path):
        assert os.environ.get("GPUSCOPE_REQUIRE_SHARED") != "1", f"{path} is missing"
        pytest.skip(f"{path} is not here")
    return path


def test_a_straggler_whose_work_is_queued_on_the_device_is_named_by_the_record():
    """2 ranks sharing GPU 0 over gloo; rank 1 runs 15 extra 4096^2 matmuls in its forward,
    queued on the GPU (its host waits for them only in DDP's all-reduce, as rank 0's waits for
    rank 1). The profiler traces of the same run: rank 1, +39.6 ms a step."""
    rep = gpuscope.analyze(_run("straggler_on_device"))
    assert rep.verdict.label == "imbalanced" and rep.verdict.confidence == "high"
    assert rep.straggler_ranks == [1]
    s = rep.stragglers[0]
    assert abs(s.excess_ns / 1e6 - 39.6) <= 0.15 * 39.6  # the traces' figure, within 15%
    assert s.cause == "compute" and "GPU" in s.cause_detail
    d = rep.to_dict()
    r0 = next(r for r in d["ranks"] if r["rank"] == 0)
    assert r0["wait_pct"] >= 70  # rank 0's all-reduce is waiting for rank 1, not transfer
    assert not {x.knob for x in rep.suggestions} & {"batch_size", "sync_frequency",
                                                      "grad_compression"}
    assert rep.suggestions[0].knob == "straggler"


def test_mfu_of_a_record_that_does_not_say_its_dtype_is_never_above_100_percent():
    """bf16 autocast, recorded before the recorder read the precision: against the fp32 peak the
    FLOPs would be 122% of it. No MFU is given; the report says which input must be wrong."""
    path = _run("mfu_autocast")
    rep = gpuscope.analyze(path)
    t = rep.throughput
    assert t.mfu_pct is None and "autocast" in t.mfu_impossible
    text = render(rep)
    assert not re.search(r"MFU \d", text) and "MFU unknown (above 100%" in text
    # what a record of today says of the same run (the probe's knob): 8.3% of the bf16 peak
    table = read_path(path)
    for info in table.ranks.values():
        info.knobs["autocast_dtype"] = "bfloat16"
        info.knobs["float32_matmul_precision"] = "highest"
    rep = analyze_table(table)
    t = rep.throughput
    assert "dense bf16 (989 TFLOPS)" in t.peak_source and "autocast" in t.peak_source
    assert t.mfu_pct == pytest.approx(8.3, abs=0.3)  # 82.6 TFLOP/s over 989.4


def test_a_run_that_died_of_oom_says_so_first_against_what_it_could_use():
    """set_per_process_memory_fraction(0.04): 5.59 GiB of the 139.8 GiB H200; 512 MiB kept
    per step; died in its step 10 (steps 0-9 completed)."""
    rep = gpuscope.analyze(_run("oom_capped"))
    (died,) = rep.died
    assert died.cause == "out_of_memory" and died.rank == 0 and died.step == 10
    assert "5.6 GiB this process was allowed" in died.text
    lines = render(rep).splitlines()
    first = next(i for i, line in enumerate(lines) if "THE RUN DIED" in line)
    verdict = next(i for i, line in enumerate(lines) if "Verdict" in line)
    assert first < verdict and first <= 1
    assert "Verdict of the steps before it died" in lines[verdict]
    text = " ".join(lines)
    # one numbering everywhere: the step it died in is 10
    assert "after step 9" not in text and "after step 10" not in text
    assert "in step 10" in text and "(steps 0-9 completed)" in text
    # no forecast of a run that already ran out, nor of the whole device's memory
    assert "fills" not in text and "139.8 GiB) in" not in text
    assert not any(f["kind"] == "near_capacity" for f in rep.memory.findings)
    growth = next(f for f in rep.memory.findings if f["kind"] == "growth")
    assert growth["forecast_steps"] is None and growth["capacity_bytes"] < 6 * 2**30
    assert rep.to_dict()["died"][0]["step"] == 10
    # the post-mortem's capacity is the device's allowed share, not the host's memory
    oom = next(f for f in rep.memory.findings if f["kind"] == "out_of_memory")
    assert 5.5 * 2**30 < oom["capacity_bytes"] < 5.7 * 2**30


def test_the_dashboard_says_the_death_before_the_verdict(tmp_path):
    rep = gpuscope.analyze(_run("oom_capped"))
    rep.write_html(str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert 0 < html.index('id="died"') < html.index('class="verdict"')
    assert "ran out of memory in step 10" in html


def test_the_data_what_if_holds_the_re_run_with_the_workers_it_proposed():
    """A Dataset sleeping 2 ms an item in the training thread (num_workers=0, pin_memory,
    16 cores); re-run with 8 workers (../shared/gpu-h200/data_workers8): 4.02 ms a step
    (mean of its steps 10-119, by the loop's own clock)."""
    rep = gpuscope.analyze(_run("data_workers0"))
    s = next(x for x in rep.suggestions if x.knob == "num_workers")
    assert s.proposed == 8
    assert abs(s.estimated_step_ms - 4.02) <= 0.15 * 4.02, s.estimated_step_ms
    lo, hi = s.estimated_step_ms_range
    assert lo <= 4.02 <= hi
    # the model's own range within +-25% of its point; the stated one adds this run's drift
    # (rerun_noise.py: on a GPU, twice the change of its median step between its halves)
    w = rerun_band(rep)
    assert 0 <= w < 0.05
    assert hi / (1 + w) <= 1.25 * s.estimated_step_ms and lo / (1 - w) >= 0.75 * s.estimated_step_ms
    # the re-run's own record says the same of itself: the step it measured
    after = gpuscope.analyze(_run("data_workers8"))
    assert abs(after.ranks[0].step_ns / 1e6 - 4.02) < 0.05
