"""The run dir fails under a training run: a full disk (a real one: a file-size limit makes the
kernel refuse writes with EFBIG, as ENOSPC would), a run dir deleted mid-run, a filesystem so
slow that each write takes longer than many steps. Training always goes on at its own speed; one
warning says recording stopped; what reached the disk still analyses."""

import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time

import gpuscope
from gpuscope import _log
from gpuscope.record.writer import RecordWriter

TRAIN = textwrap.dedent("""
    import sys, time, gpuscope
    done = 0
    with gpuscope.record(sys.argv[1], flush_rows=4) as rec:
        for batch in rec.data(range(400)):
            with rec.phase("forward"):
                time.sleep(0.0005)
            rec.step()
            done += 1
    print("steps", done)
""")


def _fsize_limit(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_stops_recording_once_and_training_goes_on(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-c", TRAIN, str(run)], capture_output=True, text=True,
                         timeout=120, preexec_fn=_fsize_limit(12_000))
    assert out.returncode == 0, out.stderr
    assert "steps 400" in out.stdout
    stopped = [line for line in out.stderr.splitlines() if "recording stopped" in line]
    assert len(stopped) == 1, out.stderr
    assert "File too large" in stopped[0]
    size = os.path.getsize(run / "rank-00000.gpuscope.jsonl")
    assert 8_000 < size <= 12_000
    rep = gpuscope.analyze(run)
    d = rep.to_dict()
    assert 10 < d["steps_analysed"] < 400
    assert any("no end record" in w for w in d["warnings"])


def _loop(rec, n, work_s=0.0):
    longest = 0.0
    for _ in rec.data(range(n)):
        time.sleep(work_s)
        t = time.perf_counter()
        rec.step()
        longest = max(longest, time.perf_counter() - t)
    return longest


def test_the_run_dir_deleted_mid_run(tmp_path, caplog):
    _log._seen.clear()
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="gpuscope"):
        with gpuscope.record(run, flush_rows=4) as rec:
            _loop(rec, 20, 0.002)
            shutil.rmtree(run)
            # the writer looks once a second whether its file is still there (a syscall)
            deadline = time.monotonic() + 5.0
            while rec.active and time.monotonic() < deadline:
                _loop(rec, 20, 0.002)
            assert not rec.active  # stopped: nothing more is timed
    msgs = [r.getMessage() for r in caplog.records if "recording stopped" in r.getMessage()]
    assert len(msgs) == 1 and "was deleted" in msgs[0], caplog.text


class _SlowFile:
    """A file whose writes take `delay` s each (an NFS server under load; none can be had
    here)."""

    def __init__(self, fh, delay=0.3):
        self._fh = fh
        self.delay = delay
        self.writes = 0

    def write(self, text):
        time.sleep(self.delay)
        self.writes += 1
        return self._fh.write(text)

    def __getattr__(self, name):
        return getattr(self._fh, name)


def test_a_slow_filesystem_never_holds_up_a_step(tmp_path, monkeypatch, caplog):
    _log._seen.clear()
    monkeypatch.setattr(RecordWriter, "CLOSE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(RecordWriter, "MAX_PENDING", 8)
    rec = gpuscope.record(tmp_path / "run", flush_rows=2).start()
    # each write 1.5 s: the thread writes everything queued at once, so a slower filesystem
    # keeps up; one whose single write outlasts CLOSE_TIMEOUT_S stalls the end
    slow = rec._writer._fh = _SlowFile(rec._writer._fh, delay=1.5)
    t0 = time.perf_counter()
    longest = _loop(rec, 200)  # 100 batches of rows
    loop_s = time.perf_counter() - t0
    with caplog.at_level(logging.WARNING, logger="gpuscope"):
        t1 = time.perf_counter()
        rec.stop()
        stop_s = time.perf_counter() - t1
    assert longest < 0.1 and loop_s < 2.0  # the steps never waited for a write
    assert stop_s < 3.0  # and the end waited at most CLOSE_TIMEOUT_S for the writes
    assert slow.writes < 20 and rec._writer is None
    assert any("stalled" in r.getMessage() for r in caplog.records), caplog.text


def test_a_flush_is_one_write_with_its_side_lines(tmp_path):
    """A flush's rows and what the sinks measured beside them (the memory sample) reach the
    file in one write: one wake-up of the writer thread, one write and one flush a flush, where
    each used to be a write of its own (the thread's syscalls hand the GIL back and forth with
    the training thread)."""
    rec = gpuscope.record(tmp_path / "run", flush_rows=4, telemetry=False).start()
    counted = rec._writer._fh = _SlowFile(rec._writer._fh, delay=0.0)
    for _ in rec.data(range(40)):
        rec.step()
        time.sleep(0.001)
    time.sleep(0.2)
    writes = counted.writes
    rec.stop()
    lines = [json.loads(x) for x in open(tmp_path / "run" / "rank-00000.gpuscope.jsonl")]
    assert sum(isinstance(x, list) for x in lines) == 40
    samples = [x for x in lines if isinstance(x, dict) and "steps" in x.get("memory", {})]
    assert len(samples) == 10  # a memory line beside each flush's rows
    knobs = sum(isinstance(x, dict) and "knobs" in x and "at_step" in x for x in lines)
    assert 1 <= writes <= 10 + knobs, (writes, knobs)  # before: two a flush (20), + knobs
