"""A rank that dies: the other rank's file is closed (its all-reduce fails, or torchrun's SIGTERM
is caught to close the recording first), everything analyses, and the report names the rank that
stopped and the step it stopped at."""

import json
import os
import subprocess
import sys

import pytest

import gpuscope

HERE = os.path.dirname(__file__)


def _run(tmp_path, how):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         os.path.join(HERE, "workloads", "dies.py"), "--run-dir", str(run), "--how", how,
         "--die-at", "30"],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode != 0  # the job failed, as it should
    return run, out


def _end(path):
    lines = [json.loads(x) for x in open(path) if x.startswith("{")]
    return next((x["end"] for x in lines if "end" in x), None)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_rank_that_dies_is_named_with_its_step(tmp_path, how):
    run, out = _run(tmp_path, how)
    end0 = _end(run / "rank-00000.gpuscope.jsonl")
    assert end0 is not None and (end0.get("crashed") or end0.get("terminated")), end0
    end1 = _end(run / "rank-00001.gpuscope.jsonl")
    if how == "kill":
        assert end1 is None  # SIGKILL: no chance to close
    else:
        assert end1["crashed"] and end1["steps"] == 30
    rep = gpuscope.analyze(run)
    d = rep.to_dict()
    assert [s["rank"] for s in d["stopped_ranks"]] == [1], d.get("stopped_ranks")
    s = d["stopped_ranks"][0]
    # rank 1 ran steps 0..29; killed, its last flush (every 4 steps) may lack up to 3 of them
    assert (26 <= s["last_step"] <= 29) if how == "kill" else s["last_step"] == 29
    assert s["others_reached"] >= s["last_step"]
    assert "the other ranks then failed waiting on it" in s["reason"]
    assert ("no end record" in s["reason"]) if how == "kill" else ("exception" in s["reason"])
    assert any(w.startswith("rank 1 stopped first") for w in d["warnings"])
    assert "missing_ranks" not in d


def test_missing_rank_files_are_listed(tmp_path):
    import shutil

    src = os.path.join(HERE, "..", "sample_traces", "comm", "record")
    shutil.copytree(src, tmp_path / "run")
    os.remove(tmp_path / "run" / "rank-00001.gpuscope.jsonl")
    d = gpuscope.analyze(tmp_path / "run").to_dict()
    assert d["missing_ranks"] == [1] and d["world_size"] == 2
    assert any("1 of 2 ranks have no readable record file (ranks 1)" in w for w in d["warnings"])


SIGTERM_LOOP = """
import os, signal, sys, time, gpuscope
with gpuscope.record(sys.argv[1], flush_rows=1000, flush_s=1000) as rec:
    for i in rec.data(range(100000)):
        time.sleep(0.001)
        rec.step()
        if i == 50:
            print("ready", flush=True)
"""


def test_sigterm_closes_the_recording_then_terminates(tmp_path):
    """torchrun stops the other ranks with SIGTERM: their rows (here none flushed yet) and an
    end record reach the disk, and the process still ends by SIGTERM as it would have."""
    import signal

    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", SIGTERM_LOOP, str(run)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM
    end = _end(run / "rank-00000.gpuscope.jsonl")
    assert end["terminated"] == "SIGTERM" and end["steps"] >= 51
    d = gpuscope.analyze(run).to_dict()
    assert d["steps_analysed"] >= 50
    assert any("terminated by SIGTERM" in w for w in d["warnings"])


SIGTERM_WHILE_CLOSING = """
import os, signal, sys, time, gpuscope
from gpuscope.record import writer

close = writer.RecordWriter.close

def slow_close(self, end=None):  # the launcher's SIGTERM lands while the recording closes
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    return close(self, end)

writer.RecordWriter.close = slow_close
try:
    with gpuscope.record(sys.argv[1]) as rec:
        for i in rec.data(range(40)):
            rec.step()
        raise RuntimeError("training failed")
except RuntimeError:
    pass
print("survived SIGTERM", flush=True)
"""


def test_sigterm_while_the_recording_closes_waits_for_the_end_record(tmp_path):
    """A rank whose training raised is closing its recording when torchrun's SIGTERM arrives
    (it stops the others once one failed): the close finishes, the end record is on disk, then
    the process ends by SIGTERM. Found by a suite run where rank 0's file had no end record."""
    import signal

    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_CLOSING, str(run)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGTERM, p.stderr[-2000:]
    assert "survived" not in p.stdout
    end = _end(run / "rank-00000.gpuscope.jsonl")
    assert end is not None and end["crashed"] and end["steps"] == 40
    assert "training failed" in end["error"]


def test_a_handler_of_the_users_own_is_left_alone(tmp_path):
    import signal

    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        with gpuscope.record(tmp_path / "run"):
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)
    with gpuscope.record(tmp_path / "run2"):
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def _cut_table(last: dict, ends: dict, flush_rows=None):
    """Two ranks' steps 0..last[r], each with its end record (None: killed, none written)."""
    from helpers import table_from_rows

    rows = [{"rank": r, "step": s, "compute": 10} for r, n in last.items() for s in range(n + 1)]
    table = table_from_rows(rows)
    for r, info in table.ranks.items():
        info.meta["end"] = ends[r]
        if flush_rows is not None:
            info.meta["flush"] = {"rows": flush_rows, "s": 1.0}
    return table


def test_a_whole_job_killed_at_once_names_no_one_within_a_flush():
    # SIGKILL to every rank at once (a scheduler, a lost node): rank 1's last rows (up to one
    # flush of 16 steps) may not have reached its file, so 42 against 43 says nothing of who
    # stopped first (a busy-core suite run named rank 1 so). Past a flush, or beside a rank that
    # ended properly, the lag is real; a record's own flush setting is used when it says one
    from gpuscope.analyze.stopped import stopped_ranks

    killed = {0: None, 1: None}
    assert stopped_ranks(_cut_table({0: 43, 1: 42}, killed)) == ([], [])
    assert stopped_ranks(_cut_table({0: 43, 1: 27}, killed)) == ([], [])
    (s,), _ = stopped_ranks(_cut_table({0: 43, 1: 26}, killed))
    assert (s.rank, s.last_step, s.others_reached) == (1, 26, 43)
    assert stopped_ranks(_cut_table({0: 43, 1: 26}, killed, flush_rows=64)) == ([], [])
    (s,), _ = stopped_ranks(_cut_table({0: 43, 1: 42}, {0: {"steps": 44}, 1: None}))
    assert s.rank == 1 and "no end record" in s.reason
