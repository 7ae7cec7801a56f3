"""Deaths and hangs told first and right (issue 67): each case a real run of
tests/workloads/deaths.py recorded by scripts/death_fixtures.py into tests/fixtures/deaths/<case>/
with each rank's own log beside it (<case>.log, "rank R step S at T": the truth), analysed here;
and, as slow tests, the recorder's side in fresh runs (the start()/stop() form's exception, the
fatal-signal trace, the live word of a hang before the launcher's TERM)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import gpuscope
from gpuscope.render.terminal import render

HERE = os.path.dirname(__file__)
CASES = os.path.join(HERE, "fixtures", "deaths")


def _case(name):
    rep = gpuscope.analyze(os.path.join(CASES, name))
    return rep, rep.to_dict(), render(rep, width=100)


def _last_logged(name) -> dict:
    """{rank: the last step its own log printed}."""
    last = {}
    with open(os.path.join(CASES, name + ".log")) as fh:
        for line in fh:
            for m in re.finditer(r"rank (\d+) step (\d+) at", line):  # lines may be glued
                last[int(m.group(1))] = max(last.get(int(m.group(1)), -1), int(m.group(2)))
    return last


def _no_placeholders(text: str):
    for bad in ("step None", "step -1", "step ?", "None"):
        assert bad not in text, text


def test_a_rank_killed_before_its_first_rows_is_named_in_the_step_the_others_failed_in():
    """Rank 2 SIGKILLed at step 40, in its first second: its file holds only its header (the
    same run id). It is the death, in step 40, not "another recording"; the others were in
    DDP's forward when it went."""
    rep, d, text = _case("killed_before_flush")
    logged = _last_logged("killed_before_flush")
    assert logged[2] == 39 and all(logged[r] == 39 for r in (0, 1, 3))  # its own log: 0-39
    assert [x["rank"] for x in d["died"]] == [2] and d["died"][0]["step"] == 40
    assert d["died"][0]["cause"] == "killed"
    assert text.splitlines()[1].startswith("THE RUN DIED: rank 2 was killed in step 40 (steps "
                                           "0-39 completed)"), text
    assert "its file holds only its header" in d["died"][0]["text"]
    assert not any("recordings" in w for w in d["warnings"]), d["warnings"]
    _no_placeholders(text)


def test_one_rank_s_data_cannot_tell_waiting_from_transfer():
    """2 ranks, rank 1 killed before its rows were written: the survivor's report is not
    confident and says why."""
    rep, d, text = _case("one_rank_left")
    assert d["confidence"] == "low" and d["ranks_analysed"] == 1, d["confidence_why"]
    assert any("1 of 2 ranks: one rank's data cannot tell" in e for e in d["confidence_why"])
    assert d["died"][0]["rank"] == 1 and d["died"][0]["step"] == 40
    assert "the other rank was in forward" in d["died"][0]["text"]
    _no_placeholders(text)


def test_the_rank_that_raised_first_is_named_with_its_error_time_and_frame_in_the_start_form():
    """rec.start() ... rec.stop() (no `with`): rank 2 raises in `lose` at step 30; the others die
    of the broken connection after it. Rank 2 first, with its exception, the time and the frame
    that raised, not the others."""
    rep, d, text = _case("raised_start_form")
    first = d["died"][0]
    assert first["rank"] == 2 and first["cause"] == "exception" and first["step"] == 30
    assert [x["rank"] for x in d["died"]] == [2], d["died"]
    assert "RuntimeError: injected failure at step 30" in first["text"]
    assert "at deaths.py:" in first["text"] and "(lose)" in first["text"]
    assert re.search(r"at \d\d:\d\d:\d\d UTC", first["text"]) and "later, waiting on it" in \
        first["text"]
    ends = {x["rank"]: x for x in d["died"]}
    assert 0 not in ends and 1 not in ends and 3 not in ends
    _no_placeholders(text)


def test_a_collective_timeout_ending_a_stalled_run_is_said_with_its_message_blaming_the_stalled():
    """Rank 2 blocks in Python; the process group's 12 s timeout ends the others. The stall is
    told first, rank 2 blamed (not rank 0, which waits in DDP's broadcast, nor the ranks that
    timed out), and the timeout's message follows."""
    rep, d, text = _case("timeout_after_stall")
    s = d["stall"]
    assert s["blamed"] == [2] and s["never_reached"] == [2], s["text"]
    assert s.get("behind_them", []) == [] or 0 not in s["never_reached"]
    assert "then the collective timeout ended the run: ranks 0, 1, 3 timed out waiting" in \
        s["text"] and "Timed out waiting 12000ms" in s["text"], s["text"]
    assert text.splitlines()[1].startswith("THE RUN STALLED: at step 20")
    assert not any("rank 0 stopped first" in w for w in d["warnings"]), d["warnings"]


def test_a_sigterm_that_finds_the_job_blocked_before_stall_s_is_told_as_a_stall():
    """Rank 2 blocks; the launcher's SIGTERM comes before the stall bound (60 s here): each
    rank's place at the TERM tells the stall, rank 2 blamed."""
    rep, d, text = _case("sigterm_while_blocked")
    s = d["stall"]
    assert s["blamed"] == [2] and s["step"] == 20, s.get("text")
    assert "a SIGTERM stopped them" in s["text"]
    assert text.splitlines()[1].startswith("THE RUN STALLED: at step 20")
    assert "terminated by SIGTERM in step 20 (steps 0-19 completed)" in " ".join(d["warnings"])


def test_a_mismatched_collective_before_stall_s_is_told_with_the_odd_rank():
    """2 ranks; rank 1 calls an all_gather rank 0 never does; the TERM before the stall bound:
    the mismatch, rank 1 the odd one out (the call the group does not make there each step)."""
    rep, d, text = _case("mismatch_at_sigterm")
    s = d["stall"]
    assert s["odd_ones"] == [1] and s["blamed"] == [1], s["text"]
    assert "rank 1 in all_gather" in s["text"] and "rank 0 in all_reduce" in s["text"]


def test_an_extra_collective_against_ddps_broadcast_names_the_odd_rank_by_its_own_call():
    """Rank 0 adds an all_reduce of [1] where rank 1 goes into DDP's buffer broadcast: two
    parties of one; the dumps' rhythm names rank 0, and the Flight Recorder line says each
    rank's own call (rank 1: broadcast), not one kind for both."""
    rep, d, text = _case("extra_collective")
    s = d["stall"]
    assert s["odd_ones"] == [0] and s["blamed"] == [0], s["text"]
    fr = s["flight_recorder"]
    assert fr["blamed"] == [0]
    mism = [g for g in fr["stuck_groups"] if g["odd_ones"]]
    assert mism and mism[0]["calls"] == {"all_reduce of [[1]]": [0],
                                         "broadcast of [[128]]": [1]}, mism
    assert "rank 1 called broadcast of [[128]]" in s["flight_recorder_text"]


def test_an_abort_in_a_collective_the_others_are_not_in_is_told_as_the_mismatch():
    """Rank 0 is aborted (SIGABRT) in its extra all_reduce: its fatal-signal trace names the
    signal and the collective; told as the mismatch, not as a SIGKILL."""
    rep, d, text = _case("aborted_in_odd_collective")
    first = d["died"][0]
    assert first["rank"] == 0 and first["cause"] == "fatal_signal", first
    text = first["text"]
    assert text.startswith("mismatched collectives: rank 0 in all_reduce at deaths.py:"), text
    assert "ranks 1, 2, 3 in broadcast" in text and "(rank 0 the odd one out)" in text, text
    assert "SIGABRT" in text and "SIGKILL" not in text


# ------------------------------------------------------------------ the recorder's side, live
def _run(tmp_path, n, args, term_after=None, timeout=150):
    run = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(n), os.path.join(HERE, "workloads", "deaths.py"), "--run-dir", run, *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    t0 = time.monotonic()
    if term_after:
        try:
            p.wait(term_after)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=timeout)
    return run, out, time.monotonic() - t0


def _ends(run):
    ends = {}
    for name in sorted(os.listdir(run)):
        if name.endswith(".gpuscope.jsonl"):
            for line in open(os.path.join(run, name)):
                if line.startswith('{"end"'):
                    ends[int(name[5:10])] = json.loads(line)["end"]
    return ends


@pytest.mark.slow
def test_the_start_form_records_the_exception_and_where_it_was_raised(tmp_path):
    run, out, _ = _run(tmp_path, 2, ["--how", "raise", "--rank", "1", "--at", "12", "--form",
                                     "start"])
    end = _ends(run)[1]
    assert end["crashed"] and end["error"] == "RuntimeError: injected failure at step 12", end
    assert end["error_where"]["at"].startswith("deaths.py:") and "(lose)" in \
        end["error_where"]["at"], end["error_where"]


@pytest.mark.slow
def test_an_abort_leaves_its_fatal_signal_trace_beside_the_record(tmp_path):
    run, out, _ = _run(tmp_path, 2, ["--how", "abort", "--rank", "0", "--at", "12"])
    fatal = os.path.join(run, "rank-00000.gpuscope.fatal")
    assert os.path.exists(fatal) and "Fatal Python error: Aborted" in open(fatal).read()
    assert not os.path.exists(os.path.join(run, "rank-00001.gpuscope.fatal"))  # closed: removed
    died = gpuscope.analyze(run).to_dict()["died"][0]
    assert died["rank"] == 0 and died["cause"] == "fatal_signal", died


@pytest.mark.slow
def test_rank_0_logs_the_hang_live_before_the_launcher_s_term(tmp_path):
    """No live diagnosis asked for, the default stall bound (10 s or 20 median steps): rank 1
    calls an all_gather rank 0 never does; rank 0 logs which rank is where while the job hangs,
    and the launcher's TERM (sent once the line is there, or at 60 s) ends the job."""
    run = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", os.path.join(HERE, "workloads", "deaths.py"), "--run-dir", run, "--how",
           "gather", "--rank", "1", "--at", "25"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    t0, line, hang, seen = time.monotonic(), None, None, []
    for text in p.stdout:
        seen.append(text)
        # two processes share the pipe: a line of one may follow another's unfinished line
        if "rank 1 step 24 at" in text:
            hang = time.monotonic()  # its own log: the last step before the odd collective
        if "gpuscope live: no step for" in text:
            line = text
            break
        if time.monotonic() - t0 > 60:
            break
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    assert line is not None, "no live line within 60 s:\n" + "".join(seen[-20:])
    assert hang is not None, "rank 1's log of step 24 missing:\n" + "".join(seen[-40:])
    assert "mismatched collectives" in line and "rank 1 in all_gather" in line, line
    assert time.monotonic() - t0 < 60
