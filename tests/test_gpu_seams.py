"""GPU code paths without a GPU: NVML and CUDA events behind seams.

What is real here: the no-driver path (this machine has no NVIDIA driver, so the real pynvml
raises and telemetry must switch itself off), the recorder, the reader and the analysis.
What is faked, and only that: `FakeNvml` replays scripted NVML readings in place of a driver,
and `FakeCuda` stands in for CUDA events with a scripted GPU timeline. The real CUDA/NVML paths
are exercised on a GPU machine by scripts/gpu_check.sh.
"""

import json
import logging
import os
import time

import pandas as pd
import pytest
import torch

import gpuscope
from gpuscope.record import cuda_timing, memory, nvml
from gpuscope.analyze.run import analyze_table
from gpuscope.readers import read_path as load_table
from gpuscope.thresholds import Thresholds
from helpers import FakeCuda, fake_time, table_from_rows

GiB = 1 << 30


class FakeCudaMemory:
    """Fake CUDA caching allocator (no GPU here): scripted memory_stats, one dict per read (the
    last one repeats); counts the peak resets."""

    script = [{}]
    total = 80 * GiB

    def __init__(self, device=None):
        self.device, self.reads, self.resets = device, 0, 0
        FakeCudaMemory.last = self

    def stats(self):
        self.reads += 1
        return self.script[min(self.reads - 1, len(self.script) - 1)]

    def window(self):
        return memory.device_window(self.stats())

    def reset_peaks(self):
        self.resets += 1

    def total_bytes(self):
        return self.total


@pytest.fixture(autouse=True)
def fake_allocator(monkeypatch):
    """Every recording here that believes it is on CUDA reads the fake allocator."""
    monkeypatch.setattr(FakeCudaMemory, "script", [{}])
    monkeypatch.setattr(memory, "device_factory", FakeCudaMemory)


def _no_driver():
    """The real NVML as a machine without an NVIDIA driver has it (the fake stands in on GPU
    machines, where the real one would find a GPU)."""
    try:
        nvml.NvmlApi().shutdown()
    except nvml.NvmlUnavailable:
        return nvml.NvmlApi  # the real thing: no driver here

    def unavailable():
        raise nvml.NvmlUnavailable("NVML unavailable (NVML Shared Library Not Found) (faked)")

    return unavailable


def test_without_a_driver_telemetry_switches_off_with_one_line(tmp_path, caplog, monkeypatch):
    pytest.importorskip("pynvml")
    monkeypatch.setattr(nvml, "api_factory", _no_driver())
    from gpuscope import _log

    _log._seen.discard("nvml-off")
    with caplog.at_level(logging.INFO, logger="gpuscope"):
        s = nvml.Sampler(0, 5).start()
        s2 = nvml.Sampler(0, 5).start()
    assert not s.active and not s2.active
    assert "NVML" in s.reason
    assert len([r for r in caplog.records if "telemetry off" in r.getMessage()]) == 1
    with gpuscope.record(tmp_path) as rec:  # recording is unaffected
        for _ in rec.data(range(3)):
            rec.step()
    header = json.loads((tmp_path / "rank-00000.gpuscope.jsonl").read_text().splitlines()[0])
    assert header["gpu"]["telemetry"].startswith("off:")


class FakeNvml:
    """Fake NVML (no driver here): replays a GPU at `clock` MHz, `util`%, 40 GiB of 80 used."""

    clock, util, throttle = 1980, 90, 0

    def __init__(self):
        self.calls = 0

    def handle(self, **selector):
        self.selector = selector
        return "gpu0"

    def describe(self, h):
        return {"name": "Fake H100", "pci_bus_id": "00000000:01:00.0", "uuid": "GPU-fake"}

    def sample(self, h):
        self.calls += 1
        return (self.util, 40 * GiB, 80 * GiB, 350.0, self.clock, 61, self.throttle)

    def shutdown(self):
        pass


def test_samples_are_recorded_joined_to_steps_and_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(nvml, "api_factory", FakeNvml)
    with gpuscope.record(tmp_path, telemetry_hz=10) as rec:
        for _ in rec.data(range(8)):
            time.sleep(0.06)
            rec.step()
    table = load_table(tmp_path)
    tel = table.telemetry
    assert len(tel) >= 3 and set(tel["sm_clock_mhz"]) == {1980}
    assert table.ranks[0].meta["gpu"]["name"] == "Fake H100"
    report = gpuscope.analyze(tmp_path)
    d = report.to_dict()
    assert d["ranks"][0]["telemetry"]["mem_used_max_pct"] == 50.0
    assert report.table.frame["gpu_util_pct"].notna().any()
    from gpuscope.render.html import figures
    from gpuscope.render.terminal import render as render_text

    assert "GPU telemetry (NVML)" in render_text(report)
    panels = dict(figures(report))
    assert "panel-telemetry" in panels and len(panels["panel-telemetry"].data) == 5


def test_device_is_chosen_from_cuda_visible_devices(monkeypatch):
    # before CUDA is initialized (on a GPU machine, torch's own PCI bus id comes first)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert nvml.device_selector(1) == {"index": 5}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    assert nvml.device_selector(0) == {"uuid": "GPU-aaaa"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml.device_selector(2) == {"index": 2}


def _straggler_table(mem_frac=0.5):
    rows = []
    for s in range(10):
        for r in range(4):
            slow = r == 2
            exposed = 5 if slow else 45
            rows.append({"rank": r, "step": s, "compute": 90 if slow else 50, "comm": exposed,
                         "comm_exposed": exposed, "data": 5})
    table = table_from_rows(rows, knobs={"batch_size": 32})
    t0 = int(table.frame["start_ns"].min())
    tel = pd.DataFrame([{"rank": r, "t_ns": t0 + k * 50_000_000, "util_pct": 95,
                         "mem_used_bytes": int(mem_frac * 80 * GiB), "mem_total_bytes": 80 * GiB,
                         "power_w": 300.0, "sm_clock_mhz": 1200 if r == 2 else 1980,
                         "temp_c": 88 if r == 2 else 60, "throttle": 0x40 if r == 2 else 0}
                        for r in range(4) for k in range(20)])
    table.telemetry = tel
    return table


def test_straggler_explanation_cites_clocks_heat_and_throttling():
    report = analyze_table(_straggler_table(), Thresholds(warmup_steps=0))
    assert [s.rank for s in report.stragglers] == [2]
    why = report.suggestions[0].why
    assert "SM clock averages 1200 MHz" in why and "hw_thermal" in why and "hotter" in why
    assert "1200" in report.to_dict()["straggler_details"][0]["telemetry"]


def test_memory_headroom_limits_the_batch_size_suggestion():
    def batch(mem):
        table = _straggler_table(mem)
        rows = [{"rank": r, "step": s, "compute": 50, "comm": 40, "comm_exposed": 40}
                for r in range(2) for s in range(6)]
        t = table_from_rows(rows, knobs={"batch_size": 32})
        t.telemetry = table.telemetry[table.telemetry["rank"] < 2].copy()
        t.telemetry["t_ns"] = int(t.frame["start_ns"].min())
        rep = analyze_table(t, Thresholds(warmup_steps=0))
        return next((s for s in rep.suggestions if s.knob == "batch_size"), None)

    assert batch(0.2).proposed == 32 * 2 and "GPU memory peaks at 20%" in batch(0.2).why
    assert batch(0.6) is None  # no room for 2x the batch


def test_device_timer_resolves_gpu_stall_and_comm_without_blocking():
    # step 0: ready 0, comm 20->50, end 100 | step 1: ready 130 (GPU idle 30 ns waiting for
    # data), end 200 | step 2: ready 200 (queued behind step 1: no stall), end 290
    fake = FakeCuda([0, 20, 50, 100, 130, 200, 200, 290])
    t = cuda_timing.DeviceTimer(fake)
    t.batch_ready()
    launch = t.comm_launch()
    t.comm_done(launch)
    t.step_end(0)
    for step in (1, 2):
        t.batch_ready()
        t.step_end(step)
    fake.now = 150  # only step 0 has finished on the GPU
    first = t.resolve()
    assert first == [{"step": 0, "gpu_comm_ns": 30, "gpu_comm_exposed_ns": 30}]
    rest = t.resolve(wait=True)
    assert rest == [{"step": 1, "gpu_comm_ns": 0, "gpu_step_ns": 100, "gpu_data_stall_ns": 30},
                    {"step": 2, "gpu_comm_ns": 0, "gpu_step_ns": 90, "gpu_data_stall_ns": 0}]
    assert fake.created <= 64  # events come from the pool


def _gpu_gap_run(tmp_path, monkeypatch, load_s, between_s, idle_before_ms):
    """6 steps on a scripted GPU that sits idle 5 ms at the start of each step: the first
    `idle_before_ms` of it before the host asks for the batch, the rest until the batch arrives;
    the host takes `load_s` in next() and spends `between_s` elsewhere between steps."""
    timeline = []  # per step: fetch, ready, end; then the fetch that ends the loader
    for k in range(6):
        timeline += [k * 25_000_000 + idle_before_ms * 1_000_000, k * 25_000_000 + 5_000_000,
                     k * 25_000_000 + 25_000_000]
    timeline.append(150_000_000)
    monkeypatch.setattr(cuda_timing, "backend_factory", lambda: FakeCuda(timeline))

    def loader():
        for i in range(6):
            time.sleep(load_s)
            yield i

    with gpuscope.record(tmp_path, device_timing=True, telemetry=False) as rec:
        for _ in rec.data(loader()):
            rec.step()
            time.sleep(between_s)  # e.g. a checkpoint or a profiler writing its trace
    table = load_table(tmp_path)
    assert table.ranks[0].meta["gpu"]["device_timing"] == "cuda_events"
    assert not rec.warnings
    later = table.frame[table.frame["step"] >= 1]
    assert (later["gpu_data_stall_ns"] + later["gpu_idle_before_data_ns"] == 5_000_000).all()
    return later


def test_a_gpu_idle_while_the_host_waits_for_data_is_a_data_stall(tmp_path, monkeypatch):
    later = _gpu_gap_run(tmp_path, monkeypatch, load_s=0.008, between_s=0, idle_before_ms=0)
    # the host waited >= 8 ms, the GPU only saw 5 ms of it (queued work covered the rest)
    assert (later["data_ns"] == 5_000_000).all()


def test_a_gpu_idle_while_the_host_works_elsewhere_is_not_data(tmp_path, monkeypatch):
    later = _gpu_gap_run(tmp_path, monkeypatch, load_s=0, between_s=0.008, idle_before_ms=5)
    assert (later["data_ns"] < 1_000_000).all()  # the host barely waited in next()
    assert (later["other_ns"] + later["data_ns"] == 5_000_000).all()  # the gap is "other"


def test_a_batch_fetched_mid_step_counts_only_the_gpu_idle_inside_next(tmp_path, monkeypatch):
    """nanoGPT's loop asks for the next batch after the forward is queued; a fetch that waits on
    the GPU (CUDA tensors indexed on the host) blocks the host 10 ms while the GPU finishes that
    forward. Scripted GPU: per step the forward runs 15 ms, the fetch's event completes then,
    the batch is there 2 ms later, the step ends at 25 ms. The GPU idled 2 ms for data, not the
    17 ms from the previous step's end (the forward in between is compute)."""
    timeline = []  # step 0: the first batch (fetched before the loop), then per step: fetch,
    for k in range(6):  # ready, end
        timeline += [k * 25_000_000 + 15_000_000, k * 25_000_000 + 17_000_000,
                     k * 25_000_000 + 25_000_000]
    monkeypatch.setattr(cuda_timing, "backend_factory", lambda: FakeCuda(timeline))
    model = torch.nn.Linear(4, 4)

    def batches():
        while True:
            time.sleep(0.010)  # the host blocked until the GPU is done with the forward
            yield torch.randn(2, 4)

    rec = gpuscope.record(tmp_path, model=model, device_timing=True, telemetry=False)
    rec.start()
    it = rec.data(batches())
    x = next(it)
    for _ in range(6):
        y = model(x)
        x = next(it)  # the next batch, fetched mid-step
        y.sum().backward()
        rec.step()
    rec.stop()
    assert not rec.warnings
    frame = load_table(tmp_path).frame
    later = frame[frame["step"] >= 1]
    assert (later["gpu_data_stall_ns"] == 2_000_000).all()
    assert (later["gpu_idle_before_data_ns"] == 0).all()  # the step queued its forward first
    assert (later["data_ns"] == 2_000_000).all() and (later["other_ns"] == 0).all()


def test_device_memory_per_flush_through_the_allocator_seam(tmp_path, monkeypatch):
    """On CUDA the allocator is read after each of the run's young steps (then once per flush),
    then its peaks reset: each window's peak
    allocated and reserved, with the running retries and OOMs, reach the report (a device peak
    growing 256 MiB per window, retries rising, the reserved peak near the device's 80 GiB),
    and an OOM raised in the block leaves what the allocator held in the end record."""
    monkeypatch.setattr(FakeCudaMemory, "script", [
        {"allocated_bytes.all.peak": (20 + i) * GiB // 4 + i * (256 << 20),
         "reserved_bytes.all.peak": (60 + 2 * i) * GiB // 1 if i < 7 else 76 * GiB,
         "num_alloc_retries": i // 2, "num_ooms": 0} for i in range(12)])
    monkeypatch.setattr(cuda_timing, "backend_factory", lambda: FakeCuda([0] * 10**4))
    with pytest.raises(torch.OutOfMemoryError):
        with gpuscope.record(tmp_path, device_timing=True, telemetry=False, flush_rows=2) as rec:
            for i in rec.data(range(100)):
                if i == 20:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB."
                                                 " GPU 0 has a total capacity of 80 GiB")
                rec.step()
    fake = FakeCudaMemory.last
    assert fake.resets == fake.reads - 1  # every flush's read, then a reset; the error's read
    table = load_table(tmp_path)
    assert table.ranks[0].meta["capacity"]["device_total_bytes"] == 80 * GiB
    dev = table.memory[table.memory["device_peak_bytes"].notna()]
    # the 20 steps are all young: the allocator is read every 4th step and at each flush (every
    # 2 steps here), a window of 2 steps each
    assert len(dev) == 10 and (dev["step"] - dev["device_first_step"] == 1).all()
    rep = analyze_table(table, Thresholds(warmup_steps=0))
    kinds = {f["kind"] for f in rep.memory.findings}
    # its peak near capacity is in the out-of-memory post-mortem, not said beside it as a risk
    assert {"alloc_retries", "out_of_memory"} <= kinds and "near_capacity" not in kinds
    oom = next(f for f in rep.memory.findings if f["kind"] == "out_of_memory")
    assert oom["asked_bytes"] == 3 * GiB and oom["memory_at_error"]["device_peak_reserved_bytes"]
    assert "of the device's memory (80.0 GiB)" in oom["text"]
    assert rep.knobs["memory_used_fraction"] == pytest.approx(76 / 80)


def nvml_drawing(watts: int, clock):
    """FakeNvml with the total energy counter (mJ since the driver loaded) of a GPU drawing a
    steady `watts`, on `clock` (the recorder's: a sample at time t reads the counter at t)."""

    class FakeNvmlEnergy(FakeNvml):
        t0 = clock()

        def sample(self, h):
            mj = 5_000_000_000 + (clock() - self.t0) * watts // 10**6
            return (*super().sample(h)[:-1], self.throttle, mj)

    return FakeNvmlEnergy


def test_energy_per_step_from_the_counter_and_the_cost_of_waiting(tmp_path, monkeypatch):
    """A steady 300 W GPU (faked NVML) sampled at 10 Hz of the recorder's clock, which only the
    loop's sleeps move (helpers.fake_time: each sample taken at exactly its time): 40 ms steps
    of which 10 ms wait for data take 12 J each, a quarter of it while waiting for data; at 2.00
    per GPU hour 1,000 steps cost 0.0222, a quarter of it the data wait. Exact, not tolerances."""

    def loader():
        for i in range(40):
            time.sleep(0.010)
            yield i

    with fake_time() as clock:
        monkeypatch.setattr(nvml, "api_factory", nvml_drawing(300, clock))
        with gpuscope.record(tmp_path, telemetry_hz=10, price_per_gpu_hour=2.0,
                             clock=clock) as rec:
            for _ in rec.data(loader()):
                time.sleep(0.030)
                rec.step()
    table = load_table(tmp_path)
    assert len(table.telemetry) == 16  # the first fetch and 40 steps: 1.61 s, one every 0.1 s
    assert table.telemetry["energy_mj"].notna().all()
    rep = analyze_table(table)
    e = rep.energy  # a typed section (sections.Energy)
    assert e.source == "NVML energy counter"
    (r,) = e.per_rank
    assert (rep.table.frame["step_ns"] == 40_000_000).all()
    step_s = float(rep.table.frame["step_ns"].mean()) / 1e9
    assert r.joules_per_step == pytest.approx(12.0) and r.watts == pytest.approx(300)
    assert e.waiting_pct["data"] == pytest.approx(25.0)
    c = e.cost
    per_1000 = step_s * 1000 / 3600 * 2.0  # the report rounds money to 4 places
    assert (c.per_1000_steps, c.data) == (round(per_1000, 4), round(per_1000 / 4, 4))
    from gpuscope.render.terminal import render

    assert "J/step" in render(rep, width=200) and "per 1,000 steps" in render(rep, width=200)
    from gpuscope.render.html import render as page

    assert 'id="energy"' in page(rep, plotlyjs="plotly.js")


def test_older_nvml_samples_without_the_counter_still_read(tmp_path, monkeypatch):
    """8-field samples (written before the energy counter was read): energy from the power
    samples instead, said so."""
    monkeypatch.setattr(nvml, "api_factory", FakeNvml)  # its samples have no counter
    with gpuscope.record(tmp_path, telemetry_hz=10) as rec:
        for _ in rec.data(range(30)):
            time.sleep(0.02)
            rec.step()
    table = load_table(tmp_path)
    assert len(table.telemetry) and table.telemetry["energy_mj"].isna().all()
    e = analyze_table(table).energy
    assert e.source == "power samples"
    assert e.per_rank[0].watts == pytest.approx(350.0, rel=0.02)


def test_collectives_outside_ddp_on_a_gpu_keep_their_host_times_and_say_what_is_not_seen(
        tmp_path, monkeypatch):
    """A CUDA run without DDP (FSDP, tensor parallel, the loop's own collectives): the device
    times only DDP's buckets, so its per-step comm is not the device's. Each step here blocks
    6 ms in a collective (a comm phase): that time stays in the report as communication the
    host blocked on (before, the device's "no DDP bucket" replaced it with zero), the table says
    how much was timed on the host only and that the GPU's waiting is not seen, and an analysis
    that does not call it comm-bound is not high."""
    timeline = []
    for k in range(7):  # per step: fetch, ready, end on a scripted GPU (no data stall)
        timeline += [k * 20_000_000, k * 20_000_000, k * 20_000_000 + 20_000_000]
    timeline.append(140_000_000)  # the fetch that ends the loader
    monkeypatch.setattr(cuda_timing, "backend_factory", lambda: FakeCuda(timeline))
    with gpuscope.record(tmp_path, device_timing=True, telemetry=False) as rec:
        for _ in rec.data(range(7)):
            with rec.phase("comm"):
                time.sleep(0.006)
            time.sleep(0.002)
            rec.step()
    assert not rec.warnings
    table = load_table(tmp_path)
    later = table.frame[table.frame["step"] >= 1]
    assert later["gpu_data_stall_ns"].notna().all()  # the device view was applied
    assert (later["comm_ns"] >= 6_000_000).all() and (later["comm_exposed_ns"] >= 6_000_000).all()
    timed = table.frame[table.frame["gpu_data_stall_ns"].notna()]
    assert table.ranks[0].meta["host_comm_share"] == pytest.approx(
        float((timed["comm_ns"] / timed["step_ns"]).median()))
    (note,) = [w for w in table.warnings if "timed on the host" in w]
    assert "how long the GPU waited for them is not seen" in note
    rep = gpuscope.analyze(str(tmp_path))
    assert rep.ranks[0].comm_exposed_ns >= 6_000_000  # mean per step, in the report too
