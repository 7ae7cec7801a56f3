"""gpuscope.record beside torch.profiler: the trace gets the facts it cannot hold (cores per
rank, how much of loading used the CPU, the loader's settings), so the trace's report gives the
same fix as the record's; the steps in which the profiler wrote its trace are noted, and the
record's analysis leaves them out (hundreds of ms of the profiler's own work, not training's)."""

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

import gpuscope  # noqa: E402
from gpuscope.readers import read_path  # noqa: E402
from gpuscope.readers.kineto.decode import DEVICE_KEY, head_facts  # noqa: E402


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GPUSCOPE_DISABLE"):
        monkeypatch.delenv(var, raising=False)


class SlowLoad(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.002)  # I/O-like: the thread waits, no CPU
        return torch.randn(8)


def test_a_profiler_beside_the_recording_gets_its_facts_and_its_writes_are_left_out(tmp_path):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowLoad(), batch_size=4)
    traces = tmp_path / "kineto"
    traces.mkdir()

    def write(p):  # the export: slow, as a big trace's is
        time.sleep(0.15)
        p.export_chrome_trace(str(traces / f"t{p.step_num}.pt.trace.json"))

    prof = profile(activities=[ProfilerActivity.CPU], on_trace_ready=write,
                   schedule=schedule(wait=1, warmup=1, active=3, repeat=1))
    with gpuscope.record(tmp_path / "run", model=model, telemetry=False) as rec:
        prof.start()
        for x in rec.data(loader):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            rec.step()
            prof.step()
        prof.stop()
    (trace,) = traces.iterdir()
    facts = head_facts(str(trace))
    assert facts["num_workers"] == 0 and facts["batch_size"] == 4 and facts["dataloader"]
    # 4 samples of 8 float32: a worker's hand-over cost grows with it (a 2 MB batch's costs
    # 1.6 ms against 0.5 assumed without it: the compute demo's traces then suggested a worker
    # its record found too costly)
    assert facts["batch_bytes"] == 4 * 8 * 4
    assert facts["cpus_available"] >= 1 and facts["local_world_size"] == 1
    assert 0 <= facts["data_cpu_share"] < 0.5  # the loader sleeps
    # a top-level key of the trace (head_facts adds the device's name, from deviceProperties,
    # which a torch with CUDA writes even when the profiler records the CPU alone)
    assert json.load(open(trace))["gpuscope"] == {k: v for k, v in facts.items()
                                                  if k != DEVICE_KEY}
    table = read_path(str(traces))
    assert table.ranks[0].knobs["data_cpu_share"] == facts["data_cpu_share"]
    # the recording noted the step the profiler wrote its trace in (after its 3 active steps)
    run = read_path(str(tmp_path / "run"))
    (wrote,) = run.ranks[0].knobs["profiler_trace_steps"]
    frame = run.frame.set_index("step")
    assert frame.loc[wrote, "step_ns"] > 0.15e9  # the export's sleep is in it
    rep = gpuscope.analyze(str(tmp_path / "run"))
    assert wrote not in set(rep.table.frame["step"])
    assert any("wrote its trace" in w for w in rep.warnings)
    assert max(s.step_ns for s in rep.steps) < 0.1e9


def test_a_profiler_write_inside_an_accumulating_run_leaves_its_optimizer_step_out(tmp_path):
    # 2 micro-steps per optimizer step, the profiler stepped after each optimizer step: its
    # export lands in a micro-step, and the optimizer step holding it goes (it went in per-step
    # runs only: in a run that accumulates, 1-2 s of trace writing made a straggler's excess
    # "mostly in other", 3.5x the injected fault, benchmarks/faults)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowLoad(), batch_size=4)
    traces = tmp_path / "kineto"
    traces.mkdir()

    def write(p):
        time.sleep(0.15)
        p.export_chrome_trace(str(traces / f"t{p.step_num}.pt.trace.json"))

    prof = profile(activities=[ProfilerActivity.CPU], on_trace_ready=write,
                   schedule=schedule(wait=1, warmup=1, active=2, repeat=1))
    with gpuscope.record(tmp_path / "run", model=model, telemetry=False) as rec:
        prof.start()
        for i, x in enumerate(rec.data(loader)):
            model(x).sum().backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
            rec.step()
            if i % 2 == 1:
                prof.step()
        prof.stop()
    run = read_path(str(tmp_path / "run"))
    (wrote,) = run.ranks[0].knobs["profiler_trace_steps"]
    assert run.frame.set_index("step").loc[wrote, "step_ns"] > 0.15e9
    rep = gpuscope.analyze(str(tmp_path / "run"))
    assert rep.knobs["sync_interval"] == 2  # read as optimizer steps of 2 micro-steps
    assert any("wrote its trace" in w for w in rep.warnings)
    assert max(s.step_ns for s in rep.steps) < 0.12e9  # 2 micro-steps of ~8 ms loading


def test_host_facts_for_a_profiler_without_the_recorder(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    facts = json.loads(gpuscope.host_facts())
    assert facts["local_world_size"] == 4 and facts["cpu_count"] == os.cpu_count()
    assert all(isinstance(v, (bool, int, float, str)) for v in facts.values())


def test_the_record_knows_the_steps_a_profiler_captured_and_reads_them_as_the_traces(tmp_path):
    """Recorded and profiled at once (wait 1, warmup 1, active 4, two cycles): the record notes
    the windows of steps the profiler recorded; `steps="profiled"` reads the record over the
    steps the traces hold (each window less its last step, which a trace leaves out)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    import gpuscope

    m = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    prof = profile(activities=[ProfilerActivity.CPU],
                   schedule=schedule(wait=1, warmup=1, active=4, repeat=2),
                   on_trace_ready=tensorboard_trace_handler(str(tmp_path / "kineto")))
    with gpuscope.record(str(tmp_path / "record"), model=m) as rec, prof:
        for x in rec.data([torch.randn(8, 32) for _ in range(16)]):
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
            rec.step()
            prof.step()
    whole = gpuscope.analyze(str(tmp_path / "record"))
    hint = [w for w in whole.warnings if "--steps profiled" in w]
    assert hint and "a torch.profiler captured steps" in hint[0]
    same = gpuscope.analyze(str(tmp_path / "record"), steps="profiled")
    traces = gpuscope.analyze(str(tmp_path / "kineto"))
    assert sorted({s.step for s in same.steps}) == sorted({s.step for s in traces.steps})
    assert any("analysed steps" in w for w in same.warnings)
    with pytest.raises(gpuscope.GpuscopeError, match="no step in"):
        gpuscope.analyze(str(tmp_path / "record"), steps="900-999")
