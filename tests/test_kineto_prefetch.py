"""The command line's early parse (readers/kineto/prefetch.py): trace files parsed by processes
forked before the analysis stack is imported give the very table the reader makes on its own,
nothing is parsed twice, what changed or failed is parsed again by the reader, and no process
outlives the block on any path."""

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gpuscope.cli import main
from gpuscope.readers import read_path
from gpuscope.readers.fork import can_fork
from gpuscope.readers.kineto import parse, reader
from gpuscope.readers.kineto.prefetch import prefetching
from gpuscope.trace_files import find_trace_files

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "imbalanced", "kineto")
def _first_cycle_each() -> tuple[str, ...]:
    """Each rank's first profiler cycle among the sample's files (one process's files share
    the prefix before the dot; the timestamp after it orders them)."""
    by_process: dict = {}
    for name in sorted(os.listdir(SAMPLE)):
        by_process.setdefault(name.split(".", 1)[0], name)
    return tuple(by_process.values())


ONE_CYCLE_EACH = _first_cycle_each()

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs fork and two cores")


@pytest.fixture
def traces(tmp_path):
    for name in ONE_CYCLE_EACH:
        shutil.copy(os.path.join(SAMPLE, name), tmp_path / name)
    return tmp_path


def _count_parses(monkeypatch) -> list:
    """Files parsed from now on by this process (the forked ones keep the real function)."""
    calls = []
    real = parse.parse_file
    for module in (parse, reader):
        monkeypatch.setattr(module, "parse_file",
                            lambda f, **kw: calls.append(os.path.basename(f)) or real(f, **kw))
    return calls


def _same_table(a, b):
    assert a.frame.equals(b.frame)
    assert a.warnings == b.warnings
    assert a.gpu_breakdown == b.gpu_breakdown
    assert {r: i.meta for r, i in a.ranks.items()} == {r: i.meta for r, i in b.ranks.items()}


def test_prefetched_files_are_taken_not_parsed_again(traces, monkeypatch):
    files = find_trace_files(str(traces))
    with prefetching(files) as ahead:
        assert len(mp.active_children()) == 2  # one process per file on two cores
        calls = _count_parses(monkeypatch)
        early = read_path(str(traces), parsed=ahead)
        assert calls == []
    assert mp.active_children() == []
    monkeypatch.undo()
    _same_table(early, read_path(str(traces)))
    assert sorted(early.frame["rank"].unique()) == [0, 1]


def test_one_file_is_cut_in_two_by_its_process(traces, tmp_path, monkeypatch):
    one = traces / ONE_CYCLE_EACH[0]
    monkeypatch.setattr(parse, "SPLIT_TEXT_BYTES", 64 << 10)  # the sample file is cut too
    whole = tmp_path / "decoded in one piece"
    real = parse.decode_trace  # patched before the fork: the processes leave a mark if used
    monkeypatch.setattr(parse, "decode_trace", lambda p, b=None: whole.touch() or real(p, b))
    with prefetching([str(one)]) as ahead:
        calls = _count_parses(monkeypatch)
        early = read_path(str(one), parsed=ahead)
        assert calls == []
    assert not whole.exists()  # the text was cut and each half decoded by its own process
    monkeypatch.undo()
    _same_table(early, read_path(str(one)))


def test_a_file_changed_since_the_start_is_parsed_again(traces, monkeypatch):
    files = find_trace_files(str(traces))
    with prefetching(files) as ahead:
        calls = _count_parses(monkeypatch)
        with open(files[1], "ab") as fh:  # gzip ignores nothing after its end: rewrite instead
            fh.truncate(0)
        shutil.copy(os.path.join(SAMPLE, ONE_CYCLE_EACH[0]), files[1])
        early = read_path(str(traces), parsed=ahead)
    assert calls == [os.path.basename(files[1])]
    monkeypatch.undo()
    _same_table(early, read_path(str(traces)))


def test_a_bad_file_is_reported_as_without_the_early_parse(traces, monkeypatch):
    bad = traces / "vm_1_9.123.pt.trace.json"
    bad.write_bytes(b"\x00 not a trace at all {{{")
    files = find_trace_files(str(traces))
    assert str(bad) in files
    with prefetching(files) as ahead:
        calls = _count_parses(monkeypatch)
        early = read_path(str(traces), parsed=ahead)
    assert calls == [bad.name]  # the reader tried it again itself (and reported it)
    monkeypatch.undo()
    plain = read_path(str(traces))
    _same_table(early, plain)
    assert any(w.startswith("skipped: ") for w in early.warnings)


def test_no_process_outlives_a_block_that_fails(traces):
    files = find_trace_files(str(traces))
    with pytest.raises(RuntimeError):
        with prefetching(files):
            pids = [p.pid for p in mp.active_children()]
            raise RuntimeError("the analysis failed before it read anything")
    assert len(pids) == 2 and mp.active_children() == []
    for pid in pids:  # reaped, not merely forgotten
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie is gone
    except OSError:
        return True


def test_no_process_outlives_a_block_that_fails_while_a_file_is_cut(traces, monkeypatch):
    """One file: its process forks a child for half of it. Stopped early, both are gone."""
    if not os.path.exists("/proc/self/task"):
        pytest.skip("needs /proc")
    one = traces / ONE_CYCLE_EACH[0]
    monkeypatch.setattr(parse, "SPLIT_TEXT_BYTES", 64 << 10)
    real = parse.sort_events  # slowed in the processes, so that they are caught mid-parse
    monkeypatch.setattr(parse, "sort_events", lambda b: __import__("time").sleep(30) or real(b))
    grand = []
    with pytest.raises(RuntimeError):
        with prefetching([str(one)]):
            (child,) = [p.pid for p in mp.active_children()]
            for _ in range(200):
                grand = _children(child)
                if grand:
                    break
                __import__("time").sleep(0.01)
            raise RuntimeError("the analysis failed before it read anything")
    assert grand, "the process never forked its half's child"
    assert _gone(child)  # joined by the block's exit
    # its child was stopped by it on the way out: on a loaded machine (CI beside other work)
    # it was seen still exiting at this instant; gone within seconds, never left running
    deadline = __import__("time").monotonic() + 20
    while not all(map(_gone, grand)) and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.05)
    assert all(map(_gone, grand))


def test_the_command_line_parses_early(traces, tmp_path, monkeypatch, capsys):
    out = tmp_path / "report.json"
    calls = _count_parses(monkeypatch)  # patched before the fork: the processes count apart
    assert main(["analyze", "-q", "--json", str(out), str(traces)]) == 0
    assert calls == []  # without the early parse this process would parse one of the two
    assert mp.active_children() == []
    monkeypatch.undo()
    import gpuscope

    want = gpuscope.analyze(str(traces)).to_dict()
    got = json.loads(out.read_text())
    assert got["verdict"] == json.loads(json.dumps(want["verdict"]))
    assert got["ranks"] == json.loads(json.dumps(want["ranks"]))


def test_a_run_dir_is_not_parsed_early(monkeypatch, tmp_path):
    """A run dir with the profiler's traces beside its records (as the demo writes it) is
    read from its records: parsing the traces early would only take a core from it."""
    run = tmp_path / "run"
    shutil.copytree(os.path.join(SAMPLE, "..", "record"), run)
    shutil.copytree(SAMPLE, run / "kineto")
    started = []
    import gpuscope.readers.kineto.prefetch as prefetch

    real = prefetch.Prefetch
    monkeypatch.setattr(prefetch, "Prefetch", lambda *a: started.append(a) or real(*a))
    assert main(["analyze", "-q", str(run)]) == 0
    assert started == []
    assert main(["analyze", "-q", str(run / "kineto")]) == 0
    assert len(started) == 1  # the same traces on their own are


def test_the_parse_path_imports_no_pandas():
    code = ("import sys, gpuscope.readers.kineto.prefetch, gpuscope.readers; "
            "sys.exit('pandas' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_progress_bar_follows_the_processes(tmp_path, monkeypatch, capsys):
    """While the reader waits for the processes, the bar moves as each file is done (bytes
    counted once, in total the input's size)."""
    import time

    from gpuscope import progress

    import gpuscope.readers.kineto.prefetch as prefetch

    real = parse.parse_file  # patched before the fork: each file takes a while in the processes,
    files = sorted(os.listdir(SAMPLE))  # each its own while, so that the files finish apart
    # however many processes the machine's cores allow (one per file on 4+ cores)

    def slow(f, **kw):
        time.sleep(0.25 * (1 + files.index(os.path.basename(f))))
        return real(f, **kw)

    monkeypatch.setattr(prefetch, "parse_file", slow)
    monkeypatch.setenv("GPUSCOPE_PROGRESS", "1")
    monkeypatch.setattr(progress, "BIG_FILES", 2)
    draws = []
    real_advance = progress.advance
    monkeypatch.setattr(progress, "advance", lambda n: draws.append(n) or real_advance(n))
    assert len(files) == 4
    assert main(["analyze", SAMPLE, "--json", str(tmp_path / "r.json")]) == 0
    assert "reading kineto" in capsys.readouterr().err
    moves = [d for d in draws if d > 0]
    assert len(moves) >= 2  # not all at once at the end
    assert sum(moves) == sum(os.path.getsize(os.path.join(SAMPLE, f)) for f in files)


def test_a_sigterm_right_after_the_fork_still_stops_the_child():
    """A prefetch process stopped by SIGTERM just after it forked the child for half its file,
    before it entered the block that stops that child: the signal waits for the block, so the
    child is stopped all the same (it used to be left running, orphaned)."""
    from gpuscope.readers import fork
    from gpuscope.readers.kineto.prefetch import _unwind

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the prefetch process
        try:
            signal.signal(signal.SIGTERM, _unwind)
            real = mp.process.BaseProcess.start

            def start(self):
                real(self)
                os.write(w, f"{self.pid}\n".encode())
                os.kill(os.getpid(), signal.SIGTERM)  # the parent stops it right now

            mp.process.BaseProcess.start = start
            with fork.in_child(lambda: time.sleep(30)):
                time.sleep(30)
        except SystemExit:
            pass
        finally:
            os._exit(0)
    os.close(w)
    child = int(os.read(r, 100).split()[0])
    os.close(r)
    os.waitpid(pid, 0)
    gone = _gone(child)
    if not gone:
        os.kill(child, signal.SIGKILL)
    assert gone


def test_a_child_whose_parent_is_killed_outright_does_not_stay_behind():
    """A process SIGKILLed while its forked child sends a result bigger than a pipe holds: no
    block is left to stop the child. It used to block for ever on the full pipe (it held the
    pipe's read end too), orphaned (seen after a fuzz run: one left 6 minutes); now it exits."""
    from gpuscope.readers import fork

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the process that forks, then is killed
        try:
            real = mp.process.BaseProcess.start

            def start(self):
                real(self)
                os.write(w, f"{self.pid}\n".encode())

            mp.process.BaseProcess.start = start
            with fork.in_child(lambda: b"x" * (8 << 20)):  # far more than a pipe buffers
                time.sleep(0.5)  # the child is writing now, the pipe full
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(w)
    child = int(os.read(r, 100).split()[0])
    os.close(r)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10  # it goes at once; a loaded machine may take a moment
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = _gone(child)
    if not gone:
        os.kill(child, signal.SIGKILL)
    assert gone
