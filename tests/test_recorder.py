"""The recorder in one process: timing of data and phases, the file, and failure containment."""

import json
import logging
import os
import time

import pytest

import gpuscope
from gpuscope import run_format
from gpuscope.readers import read_path as load_table
from gpuscope.record import writer
from helpers import fake_time


class SlowIterable:
    """Yields `n` items, each taking `delay` seconds to produce."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.delay)
            yield [i] * 4


def _rows(run_dir):
    path = os.path.join(run_dir, run_format.rank_file_name(0))
    with open(path) as fh:
        lines = [json.loads(x) for x in fh]
    return lines[0], [x for x in lines if isinstance(x, list)], lines[-1]


def test_data_and_phases_are_timed(tmp_path, monkeypatch):
    """On a clock only the sleeps move (helpers.fake_time): each row holds exactly the 20 ms
    fetch, the 10 ms forward, the 5 ms of communication and 3 ms of untracked host work."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with fake_time() as clock, gpuscope.record(tmp_path, clock=clock) as rec:
        for _ in rec.data(SlowIterable(5, 0.02)):
            with rec.phase("forward"):
                time.sleep(0.01)
            with rec.phase("comm"):
                time.sleep(0.005)
            time.sleep(0.003)  # untracked host work: "other"
            rec.step()
    header, rows, end = _rows(tmp_path)
    assert header["rank"] == 0 and header["world_size"] == 1
    assert header["placement_source"] == "single"
    assert end == {"end": {**end["end"], "steps": 5, "crashed": False}}
    assert len(rows) == 5
    cols = header["columns"]
    for row in rows:
        r = dict(zip(cols, row))
        assert (r["data_ns"], r["forward_ns"], r["compute_ns"]) == (20e6, 10e6, 10e6)
        assert r["comm_ns"] == r["comm_exposed_ns"] == 5e6
        assert r["other_ns"] == 3e6 and r["step_ns"] == 38e6
        assert r["data_cpu_ns"] < r["data_ns"] / 2  # sleeping is not CPU work


def test_rank_and_world_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with gpuscope.record(tmp_path) as rec:
        rec.step()
    assert os.path.exists(tmp_path / "rank-00003.gpuscope.jsonl")
    header = json.loads((tmp_path / "rank-00003.gpuscope.jsonl").read_text().splitlines()[0])
    assert (header["rank"], header["world_size"], header["local_rank"]) == (3, 8, 1)
    assert header["placement_source"] == "env"


def test_knobs_from_dataloader_and_batch(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(40, 3), torch.zeros(40))
    loader = DataLoader(ds, batch_size=8, num_workers=0, pin_memory=False)
    with gpuscope.record(tmp_path) as rec:
        for _ in rec.data(loader):
            rec.step()
    knobs = load_table(tmp_path).knobs()
    assert knobs["batch_size"] == 8 and knobs["num_workers"] == 0
    assert knobs["pin_memory"] is False and knobs["batches_per_epoch"] == 5


def test_internal_error_does_not_stop_training(tmp_path, monkeypatch, caplog):
    def broken(self, row):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(writer.RecordWriter, "add_rows", broken)
    seen = []
    with caplog.at_level(logging.WARNING, logger="gpuscope"):
        with gpuscope.record(tmp_path) as rec:
            for item in rec.data(range(20)):
                with rec.phase("forward"):
                    seen.append(item)
                rec.step()
    assert seen == list(range(20))  # every batch still reached the loop
    msgs = [r for r in caplog.records if "recording stopped" in r.getMessage()]
    assert len(msgs) == 1  # logged once, not per step
    assert not rec.active


def test_unwritable_run_dir_does_not_stop_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    out = []
    with gpuscope.record(blocker / "run") as rec:
        for x in rec.data([1, 2, 3]):
            out.append(x)
            rec.step()
    assert out == [1, 2, 3]


def test_training_exception_propagates_and_is_noted(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with gpuscope.record(tmp_path) as rec:
            for i in rec.data(range(5)):
                rec.step()
                if i == 2:
                    1 / 0
    table = load_table(tmp_path)
    assert len(table.frame) == 3
    assert any("raised an exception" in w for w in table.warnings)


def test_disabled_by_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_DISABLE", "1")
    with gpuscope.record(tmp_path / "r") as rec:
        assert list(rec.data([1, 2])) == [1, 2]
        rec.step()
    assert not (tmp_path / "r").exists()


def test_rows_reach_the_disk_every_flush_s_not_only_every_flush_rows(tmp_path):
    """flush_rows is far away (1000): the 0.2 s timer alone must put the rows on disk while the
    run goes on (a killed run loses at most flush_s of steps)."""
    import time

    path = tmp_path / "run" / "rank-00000.gpuscope.jsonl"

    def on_disk():
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text().splitlines() if line.startswith("["))

    seen = []  # rows on disk after each step
    with gpuscope.record(tmp_path / "run", flush_rows=1000, flush_s=0.2) as rec:
        for _ in rec.data(range(35)):
            time.sleep(0.02)
            rec.step()
            seen.append(on_disk())
        time.sleep(0.1)  # the writer thread's turn
        written = on_disk()
    assert written >= 20  # the timer wrote them while the run went on
    # ... in batches, a flush every 0.2 s of 20 ms steps, not a write per step: most steps see
    # no new row (a step 10x slower under load still leaves half of them without one)
    assert len(set(seen)) <= len(seen) // 2, seen
    assert on_disk() == 35


def test_options_are_one_frozen_dataclass_and_keywords_set_its_fields(tmp_path):
    import dataclasses

    from gpuscope import RecordOptions

    o = RecordOptions(flush_rows=4, tensorboard=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.flush_rows = 5
    rec = gpuscope.record(tmp_path / "a", options=o, flush_s=2.0)
    assert (rec.options.flush_rows, rec.options.flush_s, rec.options.tensorboard) == (4, 2.0, True)
    assert gpuscope.record(tmp_path / "b", live_every=8).options.live_every == 8
    with pytest.raises(TypeError, match="did you mean flush_rows"):
        gpuscope.record(tmp_path / "c", flush_row=4)  # a misspelt option is not ignored
    # a knob is not an option: the error says where knobs come from (a newcomer's first guess)
    with pytest.raises(TypeError, match=r"no option 'batch_size'.*rec\.data\(loader\)"):
        gpuscope.record(tmp_path / "d", batch_size=8)
    with pytest.raises(TypeError, match="no option 'flush_row'"):
        gpuscope.record(tmp_path / "e", options=o, flush_row=4)
    # every field is documented where it is declared (its doc, which help() shows)
    for f in dataclasses.fields(RecordOptions):
        assert len(f.metadata.get("doc", "")) > 10, f.name


def test_the_flush_timer_runs_on_the_injected_clock(tmp_path):
    """A clock the test moves by hand: no rows are handed to the writer until the oldest step
    is flush_s old on that clock, then all of them at the next step (no sleeping)."""
    now = [0]
    rec = gpuscope.record(tmp_path / "run", flush_rows=1000, flush_s=1.0, telemetry=False,
                          clock=lambda: now[0])
    with rec:
        for i in range(6):  # the first call opens step 0, each next one closes a step
            now[0] += 100_000_000  # 0.1 s per step
            rec.step()
        assert len(rec._raw) == 5  # the oldest is 0.5 s old: kept
        now[0] += 1_000_000_000
        rec.step()  # now it is 1.5 s old: all six go
        assert not rec._raw and rec.steps == 6
    rows = [line for line in (tmp_path / "run" / "rank-00000.gpuscope.jsonl").read_text()
            .splitlines() if line.startswith("[")]
    assert len(rows) == 6
    # the steps' lengths are the injected clock's: 0.1 s each, then 1 s
    steps = load_table(str(tmp_path / "run")).frame["step_ns"].tolist()
    assert steps == [100_000_000] * 5 + [1_000_000_000]


def test_teardown_closes_every_side_channel_in_one_loop_even_when_one_fails(tmp_path, caplog):
    """Side channels are sinks in one list: teardown closes them last-opened first, then the
    hooks, the record file last; one that raises neither stops the others nor training."""
    from gpuscope.record.sinks import Closing

    order = []
    rec = gpuscope.record(tmp_path / "run", telemetry=False).start()
    opened = len(rec._sinks)
    rec._add_sink(Closing("first channel", lambda: order.append("a")))

    def broken():
        order.append("b")
        raise RuntimeError("cannot close")

    rec._add_sink(Closing("second channel", broken))
    rec.step()
    rec.step()
    with caplog.at_level(logging.WARNING, logger="gpuscope"):
        rec.stop()  # never raises
    assert order == ["b", "a"] and rec._sinks == [] and opened > 0  # the recorder's own too
    assert any("second channel" in r.getMessage() for r in caplog.records)
    # the record file, closed last, holds the end record, which names the one that failed
    last = json.loads((tmp_path / "run" / "rank-00000.gpuscope.jsonl").read_text()
                      .splitlines()[-1])["end"]
    assert last["steps"] == 1 and any("second channel off" in w for w in last["warnings"])
    rec.stop()  # again: nothing left to close
    assert order == ["b", "a"]


def test_a_sink_that_raises_goes_alone_and_the_others_and_training_go_on(tmp_path, caplog):
    """Side channels are sinks in one list: each flush hands them the rows and writes their
    meta and, to those that listen, each step's end; one that raises is switched off alone (no
    more calls, one warning, named in the end record), the other keeps every row, and training
    is never touched."""
    from gpuscope.record.sinks import Sink

    class Counting(Sink):
        name, off = "counting sink", "counting off"

        def __init__(self):
            self.seen, self.closed = [], 0

        def rows(self, built):
            self.seen += [r[0] for r in built.rows]

        def meta(self, final):
            return {"counting": len(self.seen)} if final else None

        def close(self):
            self.closed += 1

    class Breaking(Counting):
        name, off, listens = "breaking sink", "breaking off", True
        ends: list = []

        def step_end(self, step):
            self.ends.append(step)

        def rows(self, built):
            super().rows(built)
            if len(self.seen) > 4:
                raise RuntimeError("broke at a flush")

    good, bad = Counting(), Breaking()
    rec = gpuscope.record(tmp_path / "run", telemetry=False, flush_rows=4).start()
    rec._add_sink(good)
    rec._add_sink(bad)
    assert bad in rec._listeners and good not in rec._listeners
    with caplog.at_level(logging.WARNING, logger="gpuscope"):
        for _ in rec.data(range(12)):
            rec.step()
        rec.stop()
    assert rec.steps == 12 and good.seen == list(range(12)) and good.closed == 1
    assert bad.seen == list(range(8)) and bad.closed == 1 and bad not in rec._listeners
    assert bad.ends == list(range(8))  # called at each step's end until it went
    assert sum("breaking off" in r.getMessage() for r in caplog.records) == 1
    lines = [json.loads(x) for x in (tmp_path / "run" / "rank-00000.gpuscope.jsonl").read_text()
             .splitlines() if x.startswith("{")]
    assert {"counting": 12} in lines  # the final meta, beside the rows
    assert any("breaking off: RuntimeError('broke at a flush')" in w
               for w in lines[-1]["end"]["warnings"])
    assert load_table(str(tmp_path / "run")).frame["step"].tolist() == list(range(12))


def test_the_models_mesh_is_looked_for_once_not_at_every_flush(tmp_path, monkeypatch):
    """Finding a DeviceMesh walks the model's parameters: done at the first flush, not at each
    (a plain model has none, and looking again every 16 steps cost a large one ~1 ms each)."""
    import torch

    from gpuscope.record import knobs

    calls = []
    real = knobs.mesh_dims
    monkeypatch.setattr(knobs, "mesh_dims", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)])
    with gpuscope.record(tmp_path / "run", model=model, flush_rows=2) as rec:
        for _ in rec.data(range(12)):
            model(torch.zeros(1, 4)).sum().backward()
            rec.step()
    assert len(calls) == 1


def test_batch_size_of_takes_the_first_tensor_as_the_walk_does():
    """batch_size_of's shortcut for a list, tuple or dict batch gives what the breadth-first
    walk (knobs._tensors) gives, for every shape of batch."""
    torch = pytest.importorskip("torch")
    from gpuscope.record.knobs import _tensors, batch_size_of

    def walk(batch):
        return next((int(t.shape[0]) for t in _tensors(batch) if len(t.shape) > 0), None)

    x, y, s = torch.zeros(5, 3), torch.zeros(7), torch.tensor(1.0)
    batches = [x, [x, y], (y, x), {"a": y, "b": x}, [s, x], (s,), [[x], y], [{"k": y}, x], [],
               {}, ["text", x], {"ids": [y]}, [None, y], 3, "abc", None, [s, [s, y]]]
    for b in batches:
        assert batch_size_of(b) == walk(b), b
    assert batch_size_of([x, y]) == 5 and batch_size_of({"a": y}) == 7
    assert batch_size_of([s, x]) == 5  # a scalar first: the walk goes on


@pytest.mark.parametrize("how", ["model", "phase"])
def test_forwards_per_step_are_counted_as_they_run(tmp_path, how):
    """A pipeline stage runs forward once per micro-batch: 3 forwards a step are noted as
    forwards_per_step 3, from the model's own forward or from rec.phase("forward")."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    with gpuscope.record(tmp_path / "run", model=model if how == "model" else None,
                         telemetry=False, flush_rows=4) as rec:
        for step in range(12):
            for _ in range(3 if step >= 2 else 1):  # the first two steps: one forward
                if how == "model":
                    model(torch.randn(2, 4))
                else:
                    with rec.phase("forward"):
                        pass
            rec.step()
    table = load_table(str(tmp_path / "run"))
    assert table.ranks[0].knobs.get("forwards_per_step") == 3


def test_help_shows_every_option_with_its_meaning_and_default():
    """help(gpuscope.record) and help(gpuscope.RecordOptions) list every option (an IDE shows
    the same docstrings; the options' comments in the source did not reach them)."""
    import dataclasses
    import pydoc

    import gpuscope

    text = pydoc.render_doc(gpuscope.record, renderer=pydoc.plaintext)
    opts = pydoc.render_doc(gpuscope.RecordOptions, renderer=pydoc.plaintext)
    for f in dataclasses.fields(gpuscope.RecordOptions):
        assert f.metadata.get("doc"), f.name
        assert f"{f.name} (default " in text and f"{f.name} (default " in opts, f.name


def test_loading_cpu_is_read_where_a_fetch_waits_and_on_a_sample_of_the_fast_ones(tmp_path):
    """Reading the thread's CPU time is a system call (~1 us): it is read on the first fetch, on
    each after one that waited CPU_TIMED_WAIT_NS or more, and on one in CPU_SAMPLE_EVERY of the
    rest; -1 (not measured) elsewhere, kept as such by the reader and left out of the share.
    The injected clock sets each fetch's wait: 1 us, except steps 30-33 (1 ms)."""
    from gpuscope.analyze.findings import typical_step
    from gpuscope.record import recorder

    now = [0]

    def batches():
        for i in range(40):
            now[0] += 1_000_000 if 30 <= i <= 33 else 1_000
            yield [i]

    with gpuscope.record(tmp_path / "run", telemetry=False, memory=False,
                         clock=lambda: now[0]) as rec:
        for _ in rec.data(batches()):
            now[0] += 50_000
            rec.step()
    frame = load_table(str(tmp_path / "run")).frame
    measured = frame.loc[frame["data_cpu_ns"] >= 0, "step"].tolist()
    every = recorder.CPU_SAMPLE_EVERY
    assert recorder.CPU_TIMED_WAIT_NS <= 1_000_000
    # the first; one in 16; each after a slow fetch (31-34: the fetch after 30's, ...)
    assert measured == sorted({0, every, 2 * every, 31, 32, 33, 34})
    assert (frame.loc[~frame["step"].isin(measured), "data_cpu_ns"] == -1).all()
    share = typical_step(frame).data_cpu / typical_step(frame).data
    known = frame[frame["data_cpu_ns"] >= 0]
    assert share == pytest.approx(known["data_cpu_ns"].sum() / known["data_ns"].sum())


def test_a_trainers_fetches_are_timed_on_the_recorders_clock(tmp_path, monkeypatch):
    """Lightning's fetches reach the recorder through its profiler (integrations/lightning.py):
    timed on the recorder's clock, as every other timer, so on helpers.fake_time each row holds
    exactly the 20 ms fetch and the 10 ms of work after it (on perf_counter they would be
    whatever the real clock read around the sleeps: nothing)."""
    pytest.importorskip("lightning")
    from gpuscope.integrations.lightning import FETCH, _FetchListener

    class Profiler:  # Lightning's profiler interface: start and stop an action by name
        def start(self, name):
            pass

        def stop(self, name):
            pass

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    prof = Profiler()
    with fake_time() as clock, gpuscope.record(tmp_path, clock=clock) as rec:
        listener = _FetchListener(prof, rec)
        for _ in range(3):
            prof.start(f"[_TrainingEpochLoop].{FETCH}")
            time.sleep(0.02)
            prof.stop(f"[_TrainingEpochLoop].{FETCH}")
            time.sleep(0.01)
            rec.step()
        listener.restore()
    header, rows, _ = _rows(tmp_path)
    assert len(rows) == 3
    for row in rows:
        r = dict(zip(header["columns"], row))
        assert (r["data_ns"], r["step_ns"]) == (20e6, 30e6)
