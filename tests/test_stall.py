"""A run that hangs or dies (issue 54): the stall watcher (record/stall.py), how a stall is told
(stall_story.py, analyze/stall.py), live word through the job's store (stall_exchange.py), and
real 4-rank runs (gloo) in which rank 2 blocks in forward, calls a different collective, raises,
or is SIGKILLed while it waits, the job ended from outside as a scheduler does."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import gpuscope
from gpuscope.record.events import StepLog
from gpuscope.record.stall import StallWatch, where
from gpuscope.stall_story import analyse

HERE = os.path.dirname(__file__)
T0 = 1_796_000_000_000_000_000  # a unix time in ns


def _stall(step, where_, seq=None, kind=None, group="default", sizes=None, issued=None,
           at=None, since=T0):
    s = {"step": step, "in": where_, "since_unix_ns": since, "noticed_unix_ns": since + 10**9,
         "groups": {"default": issued if issued is not None else seq}}
    if where_ == "collective":
        s.update(kind=kind, group=group, seq=seq, sizes=sizes or [[1]])
    elif seq is not None and kind is not None:
        s["waits_on"] = {"kind": kind, "group": group, "seq": seq, "sizes": sizes}
    if at:
        s["stack"] = [{"file": "/x/lib/torch/nn/module.py", "line": 1, "func": "f",
                       "user": False}, {"file": f"/home/u/{at[0]}", "line": at[1],
                                        "func": at[2], "user": True}]
    return s


def test_ranks_waiting_in_a_collective_and_the_one_that_never_reached_it():
    """Ranks 0, 1, 3 wait from backward on all_reduce #46 (the Flight Recorder's entry); rank 2
    issued 45 and is in forward at train.py:54: it never reached #46. Had rank 2 issued 46 too,
    nobody is behind."""
    stalls = {r: _stall(20, "backward", 46, "all_reduce", sizes=[[4225]]) for r in (0, 1, 3)}
    stalls[2] = _stall(20, "forward", issued=45, at=("train.py", 54, "stuck"))
    got = analyse(stalls, 4)
    assert got["waiting"] == [0, 1, 3] and got["never_reached"] == [2] and got["silent"] == []
    assert got["kind"] == "all_reduce" and got["seq"] == 46
    assert "ranks 0, 1, 3 waiting in all_reduce #46 (default group, [4225], from backward)" \
        in got["text"]
    assert "rank 2 never reached it: in forward of step 20" in got["text"]
    assert "train.py:54 (stuck)" in got["text"]
    stalls[2] = _stall(20, "backward", 46, "all_reduce", sizes=[[4225]])
    assert analyse(stalls, 4)["never_reached"] == []


def test_mismatched_collectives_name_the_odd_one_out_and_a_silent_rank():
    """At #47 ranks 0 and 1 are in all_reduce of [1], rank 2 in all_gather: rank 2 is the odd
    one out; rank 3 left no stall record (dead or frozen) and says what its end record says.
    Two parties of the same size name no one."""
    stalls = {r: _stall(20, "collective", 47, "all_reduce") for r in (0, 1)}
    stalls[2] = _stall(20, "collective", 47, "all_gather", at=("train.py", 80, "<module>"))
    got = analyse(stalls, 4, others={3: "stopped: no end record"})
    assert got["odd_ones"] == [2] and got["silent"] == [3]
    assert "mismatched collectives at #47 on the default group" in got["text"]
    assert "ranks 0, 1 in all_reduce of [1]; rank 2 in all_gather of [1]" in got["text"]
    assert "rank 2 the odd one out, at train.py:80" in got["text"]
    assert "rank 3 stopped: no end record" in got["text"]
    even = {0: stalls[0], 2: stalls[2]}
    assert analyse(even, 2)["odd_ones"] == []


def test_where_reads_a_blocked_collective_from_the_training_thread_s_frames():
    """A thread blocked inside a function the codes call a collective: where() names its kind,
    group, sizes and since (from the wrapper's locals); outside it, the log's flags say forward
    (a forward begun at t=7) or, with a part of the step ended, after it."""
    torch = pytest.importorskip("torch")
    gate, inside = threading.Event(), threading.Event()

    def timed_c10d(*args):
        what, group, t0 = "all_reduce:default", None, 5  # noqa: F841 - read from the frame
        inside.set()
        gate.wait(10)

    th = threading.Thread(target=timed_c10d, args=(torch.zeros(3, 2),))
    th.start()
    try:
        assert inside.wait(10)
        frame = sys._current_frames()[th.ident]
        got = where(StepLog(lambda: 0), frame, {timed_c10d.__code__: "collective"}, lambda t: T0 + t)
    finally:
        gate.set()
        th.join()
    assert got["in"] == "collective" and got["kind"] == "all_reduce"
    assert got["group"] == "default" and got["sizes"] == [[3, 2]]
    assert got["since_unix_ns"] == T0 + 5
    log = StepLog(lambda: 0)
    log.fwd_t0 = 7
    assert where(log, sys._getframe(), {}, lambda t: T0 + t)["in"] == "forward"
    log = StepLog(lambda: 0)
    log.phases.append(("optimizer", 1, 9))
    got = where(log, sys._getframe(), {}, lambda t: T0 + t)
    assert got["in"] == "after optimizer" and got["since_unix_ns"] == T0 + 9


class _Host:
    """What the watcher reads of a recorder, on a clock the test moves."""

    def __init__(self):
        self.now = 0
        self.clock = lambda: self.now
        self.log = StepLog(self.clock)
        self.unix = lambda t: T0 + t
        self.active, self.steps, self.last = True, 0, 0
        self.flushed, self.side = 0, []

    def last_step_end(self):
        return self.last

    def idle_flush(self):
        self.flushed += 1

    def write_side(self, obj):
        self.side.append(obj)

    def dump_flight_recorder(self):
        return None

    def sigterm_came(self):
        return False


def test_the_watcher_flushes_idle_rows_then_writes_a_stall_and_its_end():
    """Steps every 0.1 s, then none: rows flushed once the last step is flush_s old, the stall
    written once past the bound (10 s given), once; steps resume: its end, with how long."""
    h = _Host()
    w = StallWatch(h, bound_s=10.0, flush_s=1.0, codes={})
    w.ident = threading.get_ident()
    for i in range(1, 6):
        h.now += 100_000_000
        h.steps, h.last = i, h.now
        w.look()
    assert h.flushed == 0 and h.side == []
    h.now += 2 * 10**9
    w.look()
    assert h.flushed == 1 and h.side == []
    h.now += 9 * 10**9  # 11 s without a step
    w.look()
    w.look()
    assert [list(x) for x in h.side] == [["stall"]]
    s = h.side[0]["stall"]
    assert s["step"] == 5 and s["in"] == "between steps" and s["bound_s"] == 10.0
    assert s["since_unix_ns"] == T0 + h.last and s["stack"]
    h.now += 10**9
    h.steps, h.last = 6, h.now
    w.look()
    assert list(h.side[1]) == ["stall_end"] and h.side[1]["stall_end"]["lasted_s"] == 12.0


def test_the_default_bound_is_20_median_steps_but_at_least_10_s():
    h = _Host()
    w = StallWatch(h, bound_s=None, flush_s=1.0, codes={})
    assert w.bound_ns() == 300 * 10**9  # before the second step: warming up
    for i in range(1, 20):
        h.now += 5 * 10**9  # 5 s steps
        h.steps, h.last = i, h.now
        w.look()
    assert w.bound_ns() == 100 * 10**9
    w._rates = [10**8] * 10
    assert w.bound_ns() == 10 * 10**9


def test_rank_0_logs_who_waits_and_who_is_missing_through_the_store(monkeypatch):
    """Live word: ranks 0, 1 and 3 leave their stall in a real store (torch's HashStore), rank 2
    none; rank 0, after the gather time, logs one line naming rank 2; a resumed rank's word
    goes."""
    torch_dist = pytest.importorskip("torch.distributed")
    from gpuscope.record import stall_exchange

    monkeypatch.setattr(stall_exchange, "GATHER_S", 0.0)
    store = torch_dist.HashStore()
    ex = {r: stall_exchange.Exchange(r, 4, log=False, store=store) for r in (0, 1, 3)}
    for r in (1, 3, 0):
        ex[r].said(_stall(20, "backward", 46, "all_reduce"))
    ex[0].look({})
    line = ex[0].line
    assert line.startswith("gpuscope live: no step for "), line
    assert "s, stalled at step 20: ranks 0, 1, 3 waiting in all_reduce #46" in line, line
    assert "rank 2 left no word" in line
    ex[1].resumed({})
    assert not store.check([f"{stall_exchange.PREFIX}1"])


def test_a_recorded_pause_keeps_its_rows_and_is_told_with_where_it_was(tmp_path):
    """One process, a real recorder: 3 steps, then a forward that sleeps 2.5 s (stall_s 0.5),
    then a step. The rows of the first steps reach the file before the stall record, which
    says forward; the stall's end says it lasted; the report lists the pause."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.sleep = 0.0

        def forward(self, x):
            time.sleep(self.sleep)
            return self.lin(x)

    model = Slow()
    with gpuscope.record(tmp_path / "run", model=model, stall_s=0.5, flush_s=0.2,
                         telemetry=False) as rec:
        for i in range(5):
            model.sleep = 2.5 if i == 3 else 0.0
            model(torch.randn(2, 4)).sum().backward()
            rec.step()
    lines = [json.loads(x) for x in open(tmp_path / "run" / "rank-00000.gpuscope.jsonl")]
    kinds = ["row" if isinstance(x, list) else next(iter(x)) for x in lines[1:]]
    assert "stall" in kinds and "stall_end" in kinds, kinds
    assert kinds.index("stall") > kinds.index("row")  # rows before it were written first
    stall = next(x["stall"] for x in lines[1:] if isinstance(x, dict) and "stall" in x)
    assert stall["in"] == "forward" and stall["step"] == 3
    assert any(f["func"] == "forward" and f["user"] for f in stall["stack"])
    end = next(x["stall_end"] for x in lines[1:] if isinstance(x, dict) and "stall_end" in x)
    assert end["lasted_s"] >= 0.5
    d = gpuscope.analyze(tmp_path / "run").to_dict()
    assert d["stall"]["pauses"][0]["in"] == "forward" and "text" not in d["stall"]


# ------------------------------------------------------------------ real 4-rank runs
def _files_with_stall(run) -> set:
    out = set()
    for name in os.listdir(run) if os.path.isdir(run) else ():
        if name.endswith(".jsonl") and '"stall":' in open(os.path.join(run, name)).read():
            out.add(name)
    return out


def _hang(tmp_path, how, wait_for=4, live=0):
    """Run tests/workloads/hangs.py; once `wait_for` ranks wrote their stall (or the job ended
    by itself), stop it as a scheduler's time limit does: SIGTERM to the launcher."""
    run = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "4", os.path.join(HERE, "workloads", "hangs.py"), "--run-dir", run, "--how", how,
           "--late-ms", "10", "--stall-s", "3", "--live-every", str(live)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        if wait_for and len(_files_with_stall(run)) >= wait_for:
            # rank 0's live word comes GATHER_S after its own stall: time for it, with margin
            time.sleep(1.0 + (3.0 if live else 0.0))
            break
        time.sleep(0.5)
    ended_itself = proc.poll() is not None
    t0 = time.monotonic()
    if not ended_itself:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return run, out, ended_itself, time.monotonic() - t0


def _ends(run):
    ends = {}
    for name in sorted(os.listdir(run)):
        if name.endswith(".jsonl"):
            for line in open(os.path.join(run, name)):
                if line.startswith('{"end"'):
                    ends[int(name[5:10])] = json.loads(line)["end"]
    return ends


@pytest.mark.slow
def test_a_rank_blocked_in_forward_is_named_with_its_stack_and_rank_0_logs_it_live(tmp_path):
    run, out, _, _ = _hang(tmp_path, "block", live=5)
    d = gpuscope.analyze(run).to_dict()
    s = d["stall"]
    assert s["step"] == 20 and s["never_reached"] == [2] and s["waiting"] == [0, 1, 3], s["text"]
    assert s["ranks"]["2"]["in"] == "forward" and "hangs.py" in s["ranks"]["2"]["at"]
    assert any(f["func"] == "stuck" for f in s["stacks"]["2"])
    assert "rank 2 was already the straggler" in s["text"] or "rank 2 was already probably" \
        in s["text"], s["text"]
    assert "gpuscope live: no step for" in out and "stalled at step 20" in out
    assert "rank 2 never reached it" in out
    # every step every rank made is there, and the ranks closed on the SIGTERM
    assert all(e.get("terminated") == "SIGTERM" for e in _ends(run).values())
    assert len(gpuscope.analyze(run).table.frame.query("rank == 2")) >= 15


@pytest.mark.slow
def test_a_rank_in_another_collective_is_the_odd_one_out_and_sigterm_still_ends_the_job(tmp_path):
    run, out, _, took = _hang(tmp_path, "mismatch")
    s = gpuscope.analyze(run).to_dict()["stall"]
    assert s["odd_ones"] == [2] and s["seq"] is not None, s["text"]
    assert s["state"] == "mismatched"
    assert "mismatched collectives" in s["text"] and "all_gather" in s["text"]
    assert "rank 2 was already" in s["text"], s["text"]  # late by 10 ms a step before
    # blocked in gloo (native code), yet each rank closed its record on the SIGTERM (the
    # watcher took it) rather than waiting for the launcher's SIGKILL
    ends = _ends(run)
    assert sorted(ends) == [0, 1, 2, 3] and all(e.get("terminated") == "SIGTERM"
                                                for e in ends.values()), ends


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_the_step_and_where(tmp_path):
    run, _, _, _ = _hang(tmp_path, "raise", wait_for=0)
    d = gpuscope.analyze(run).to_dict()
    first = d["died"][0]
    assert first["rank"] == 2 and first["step"] == 20 and first["cause"] == "exception"
    assert "hangs.py" in first["text"] and "before it died" in first["text"], first["text"]


@pytest.mark.slow
def test_a_rank_killed_while_it_waits_is_named_with_its_collective(tmp_path):
    run, _, ended, _ = _hang(tmp_path, "kill", wait_for=0)
    d = gpuscope.analyze(run).to_dict()
    s = d["stall"]
    assert s["ranks"]["2"]["in"] == "collective" and s["ranks"]["2"]["kind"] == "all_reduce"
    assert s["waiting"] == [2] and s["never_reached"] == [0, 1, 3], s["text"]
    assert [x["rank"] for x in d["died"]] == [2] and d["died"][0]["cause"] == "killed"
    assert d["died"][0]["text"].startswith("rank 2 was killed in step 20 (steps 0-19 "
                                           "completed)"), d["died"][0]["text"]
    assert "rank 2 was already" in d["died"][0]["late_before"], d["died"][0]


def test_a_stalled_run_says_so_first_in_every_view(tmp_path):
    """The recorded block run (tests/fixtures/stalled: rank 2 blocked in forward at step 20, the
    others in DDP's all-reduce #46): the terminal's first line, the JSON and the dashboard say
    the stall before the verdict, with rank 2's stack in the dashboard."""
    from gpuscope.render.terminal import render

    rep = gpuscope.analyze(os.path.join(HERE, "fixtures", "stalled"))
    d = rep.to_dict()
    assert d["stall"]["never_reached"] == [2] and d["stall"]["kind"] == "all_reduce"
    assert d["stall"]["seq"] == 46 and d["stall"]["waiting"] == [0, 1, 3]
    text = render(rep, width=100)
    assert text.splitlines()[1].startswith("THE RUN STALLED: at step 20: ranks 0, 1, 3 waiting")
    assert text.index("THE RUN STALLED") < text.index("Verdict of the steps before it stalled")
    rep.write_html(str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert 0 < html.index('id="stall"') < html.index('class="verdict"')
    assert "hangs.py:" in html and "in stuck" in html  # its stack


def test_flight_recorder_dumps_beside_a_run_ours_and_torch_s_pickles(tmp_path):
    """Rank 0's dump as the watcher writes it (JSON), rank 1's as torch writes one (a pickle
    named nccl_trace_rank_1), rank 3's as JSON under another prefix, rank 2's missing: ranks 0,
    1 and 3 wait in all_reduce #46 of the default group; rank 2 left no dump and stopped the job.
    A pickle that would run code is not read, and says why."""
    import pickle
    import shutil

    from gpuscope.analyze.hang_report import tell
    from gpuscope.readers import flight_recorder

    src = os.path.join(HERE, "fixtures", "stalled")
    shutil.copy(os.path.join(src, "rank-00000.gpuscope.fr.json"), tmp_path)
    with open(os.path.join(src, "rank-00001.gpuscope.fr.json")) as fh:
        (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(json.load(fh)))
    shutil.copy(os.path.join(src, "rank-00003.gpuscope.fr.json"), tmp_path / "_dump_3")
    dumps, bad = flight_recorder.find(str(tmp_path))
    assert sorted(dumps) == [0, 1, 3] and not bad
    got = tell(dumps, bad, 4)
    assert got["missing"] == [2] and got["blamed"] == [2], got["text"]
    assert "ranks 0, 1, 3 wait in all_reduce of [[4225]] #46" in got["text"], got["text"]
    assert "rank 2 left no dump" in got["text"]

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "nccl_trace_rank_2").write_bytes(pickle.dumps({"entries": [Evil()]}))
    why = flight_recorder.load(str(tmp_path / "nccl_trace_rank_2"))
    assert isinstance(why, str) and "not plain data" in why
    dumps, bad = flight_recorder.find(str(tmp_path))
    assert sorted(dumps) == [0, 1, 3] and bad[0][0] == "nccl_trace_rank_2"


def test_analyze_of_a_folder_of_flight_recorder_dumps_alone(tmp_path):
    """Three of four ranks' dumps and nothing else: `gpuscope analyze` joins them (the world
    size from their groups' members) and names rank 2, whose dump is missing, as the rank that
    stopped the job; --json - gives the same as JSON."""
    import shutil

    for r in (0, 1, 3):
        shutil.copy(os.path.join(HERE, "fixtures", "stalled", f"rank-0000{r}.gpuscope.fr.json"),
                    tmp_path)
    out = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "3 of 4 ranks left a dump" in out.stdout
    assert "THE JOB HUNG: rank 2 stopped it; it left no dump" in out.stdout, out.stdout
    assert "ranks 0, 1, 3 wait in all_reduce of [[4225]] #46" in out.stdout
    js = subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(tmp_path), "--json",
                         "-"], capture_output=True, text=True, timeout=120)
    d = json.loads(js.stdout)
    assert d["world_size"] == 4 and d["missing"] == [2] and d["blamed"] == [2]
    assert d["schema"] == "gpuscope.flight_recorder/2"


def test_a_forked_child_s_sigterm_is_not_taken_for_the_parent_s(tmp_path):
    """A DataLoader worker is a fork of the training process: when it is sent SIGTERM, the wakeup
    fd it inherited must not tell the parent's watcher a SIGTERM came (it would end the parent).
    The child lets go of it at the fork; the parent records on, then closes as usual."""
    # as in a training process: SIGTERM's default action, no wakeup fd (earlier tests in this
    # process may have left theirs: an event loop's, a handler)
    handler, theirs = signal.signal(signal.SIGTERM, signal.SIG_DFL), signal.set_wakeup_fd(-1)
    rec = gpuscope.record(tmp_path / "run", telemetry=False).start()
    try:
        assert rec._sigterm.wakeup is not None  # the wakeup fd is ours here
        pid = os.fork()
        if pid == 0:  # the child: as a worker the parent terminates
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        time.sleep(2.5)  # past the watcher's grace and a look or two
        assert rec.active
    finally:
        rec.stop()
        signal.set_wakeup_fd(theirs)
        signal.signal(signal.SIGTERM, handler)
    lines = [json.loads(x) for x in open(tmp_path / "run" / "rank-00000.gpuscope.jsonl")]
    assert "terminated" not in lines[-1]["end"]


def test_a_recording_closed_after_a_long_evaluation_paused_it_did_not_hang(tmp_path):
    """The loop ends, an evaluation runs past stall_s with the recorder still open, then the
    program closes it: a pause until the end, not THE RUN STALLED; the same stall with the
    rank terminated by a signal (a scheduler's time limit) is a stall."""
    import shutil

    from gpuscope.readers import read_path
    from gpuscope.analyze.stall import open_stalls, pauses

    run = tmp_path / "run"
    with gpuscope.record(run, stall_s=0.3, flush_s=0.1, telemetry=False) as rec:
        for _ in range(4):
            rec.step()
        time.sleep(1.5)  # an evaluation, no steps
    table = read_path(str(run))
    assert table.ranks[0].meta.get("stalls"), "the watcher wrote no stall"
    assert open_stalls(table) == {}
    p = pauses(table)
    assert p and p[0]["until_end"] and p[0]["lasted_s"] >= 0.3
    cut = tmp_path / "cut"
    shutil.copytree(run, cut)
    f = cut / "rank-00000.gpuscope.jsonl"
    text = f.read_text().replace('"crashed":false', '"crashed":false,"terminated":"SIGTERM"')
    f.write_text(text)
    (cut / "rank-00000.gpuscope.cols").unlink(missing_ok=True)
    assert list(open_stalls(read_path(str(cut)))) == [0]


def test_whether_the_rank_was_late_before_from_the_report_s_stragglers():
    """The straggler, a minor straggler (late under the threshold), not late, or no steps of it
    (a rank killed before its rows were written)."""
    from types import SimpleNamespace

    from gpuscope.analyze.stall import late_before
    from gpuscope.results import MinorStraggler, Straggler

    ranks = [SimpleNamespace(rank=r) for r in range(4)]
    big = Straggler(rank=2, slow_steps_share=0.9, excess_ns=3_100_000, cause="compute",
                    last_in=(17, 19))
    small = MinorStraggler(rank=1, late_ns=1_200_000, late_share=0.03, excess_ns=1_000_000,
                           cause="compute")
    rep = SimpleNamespace(stragglers=[big], minor_stragglers=[small], steps=[1, 2], ranks=ranks)
    assert late_before(rep, 2) == ("straggler", "rank 2 was already the straggler before it "
                                   "stalled (3.1 ms a step busier than the median rank, last "
                                   "to arrive in 17 of 19 steps)")
    assert late_before(rep, 1, "died").kind == "minor"
    assert late_before(rep, 1, "died").text.startswith("rank 1 was already slightly late before "
                                                       "it died (1.2 ms a step")
    assert late_before(rep, 3) == ("not_late", "rank 3 was not late before it stalled")
    rep.ranks = ranks[:3]
    assert late_before(rep, 3).kind == "unknown"
    assert late_before(rep, 3).text.startswith("no steps of rank 3")


def test_the_idle_flush_of_a_real_recorder_writes_its_rows_once(tmp_path):
    """The watcher's view of a real recorder (watched.Watched): its idle flush hands the writer the
    rows made so far, as rows (a flush's build was handed over whole once, and the rows of a
    rank killed mid-run were lost), and the close does not write them again."""
    import gpuscope
    from gpuscope.readers import read_path
    from gpuscope.record.watched import Watched

    now = [0]
    rec = gpuscope.record(tmp_path / "run", flush_rows=1000, flush_s=1000.0, telemetry=False,
                          stall_watch=False, clock=lambda: now[0])
    path = tmp_path / "run" / "rank-00000.gpuscope.jsonl"
    with rec:
        for _ in range(6):
            now[0] += 10_000_000
            rec.step()
        assert len(rec._raw) == 5
        Watched(rec).idle_flush()
        assert not rec._raw
        for _ in range(100):  # the writer thread's turn
            if sum(line.startswith("[") for line in path.read_text().splitlines()) == 5:
                break
            time.sleep(0.02)
        assert sum(line.startswith("[") for line in path.read_text().splitlines()) == 5
    assert read_path(str(tmp_path / "run")).frame["step"].tolist() == [0, 1, 2, 3, 4]


def test_the_stall_s_words_are_made_once_and_read_back_from_an_older_report():
    """Issue 72, 1.: the stall carries `story`, what every front end shows after its own "The
    run stalled:" (terminal, HTML, the tab's index.js read it; none cuts `text`, which is the
    same words as one line). A report written before `story` existed gets it once, where it is
    read; the ranks' stacks come back keyed by rank, so the HTML finds the stack of the rank
    that never reached the collective without trying both key types."""
    from gpuscope.results import ReportData

    here = os.path.join(os.path.dirname(__file__), "fixtures", "golden", "reports", "stalled")
    with open(os.path.join(here, "expected.json")) as fh:
        new = json.load(fh)
    new.setdefault("path", "run")  # the golden leaves out the machine's path
    stall = new["stall"]
    assert stall["text"] == "stalled " + stall["story"]
    assert stall["story"].startswith("at step 20: ranks 0, 1, 3 waiting in all_reduce #46")
    old = json.loads(json.dumps(new))
    del old["stall"]["story"]
    a, b = ReportData.from_dict(new), ReportData.from_dict(old)
    assert a.stall.story == b.stall.story == stall["story"]
    assert sorted(b.stall.stacks) == [0, 1, 2, 3]
    assert a.stall.state == b.stall.state == "waiting"  # sections.StallState.WAITING
    from gpuscope.render import html, terminal

    for rep in (a, b):
        shown = " ".join(terminal.render(rep, width=400, color=False).split())
        assert f"THE RUN STALLED: {stall['story']}" in shown
        assert "rank 2: its stack as it stalled" in html.render(rep)
    # no front end cuts the sentence it is given
    root = os.path.join(os.path.dirname(__file__), "..", "gpuscope")
    for path in ("render/terminal.py", "render/html.py",
                 "integrations/tensorboard/static/index.js"):
        with open(os.path.join(root, path)) as fh:
            src = fh.read()
        assert 'len("stalled' not in src and '"stalled ".length' not in src, path


def test_a_stall_record_is_parsed_once_into_what_the_telling_reads():
    """Issue 72: each rank's stall record is a StallRecord (stall_story.py) from where the
    telling takes it in: the collective it is in or waits on, whether it waits on its peers,
    how many it issued on a group, its frame of user code."""
    from gpuscope.stall_story import StallRecord, Target

    in_backward = StallRecord.of({
        "step": 7, "in": "backward", "since_unix_ns": 5, "groups": {"default": 12},
        "waits_on": {"kind": "all_reduce", "group": None, "seq": 12, "sizes": [[4]]},
        "stack": [{"file": "/x/lib.py", "line": 1, "func": "f", "user": False},
                  {"file": "/x/train.py", "line": 40, "func": "step", "user": True}]})
    assert in_backward.target == Target("default", 12, "all_reduce", [[4]])
    assert in_backward.waits and in_backward.at == "train.py:40 (step)"
    in_data = StallRecord.of({"step": 7, "in": "data", "groups": {"default": 11, "tp": 3}})
    assert in_data.target == Target("default", 11, None, None) and not in_data.waits
    assert in_data.issued("tp") == 3 and in_data.issued("pp") is None
    fetching = StallRecord.of({"step": 7, "in": "data", "groups": {"default": 11},
                               "waits_on": {"kind": "all_gather", "seq": 12}})
    assert fetching.waits  # in no collective, but its work waits on one (Flight Recorder)
    in_one = StallRecord.of({"step": "?", "in": "collective", "kind": "broadcast", "seq": 4,
                             "group": "tp"})
    assert in_one.step is None and in_one.target == Target("tp", 4, "broadcast", None)
    assert in_one.waits and in_one.issued("tp") == 4
