"""Damaged input: what does not fit is skipped and counted, the rest analysed; only a file with
nothing usable is an error; forked decoders never outlive an analysis. Uses the traces and run
dirs in sample_traces/ (part of the repository), so none of these skip."""

import gzip
import json
import os
import shutil

import pytest

import gpuscope
from gpuscope.errors import GpuscopeError, TraceFormatError
from gpuscope.readers import read_path
from helpers import live_children

HERE = os.path.dirname(__file__)
SAMPLES = os.path.join(HERE, "..", "sample_traces")
RECORD = os.path.join(SAMPLES, "comm", "record")
KINETO = os.path.join(SAMPLES, "imbalanced", "kineto")


def _copy(src, tmp_path):
    dst = tmp_path / "in"
    shutil.copytree(src, dst)
    return dst


def _lines(path):
    return path.read_text().split("\n")


def _set_row(run, line_no, fn):
    """Apply fn to the step row on line `line_no` (1-based) of rank 0's file."""
    p = run / "rank-00000.gpuscope.jsonl"
    lines = _lines(p)
    row = json.loads(lines[line_no - 1])
    assert isinstance(row, list)
    fn(row)
    lines[line_no - 1] = json.dumps(row)
    p.write_text("\n".join(lines))


def _first_row_line(run):
    lines = _lines(run / "rank-00000.gpuscope.jsonl")
    return next(i + 1 for i, line in enumerate(lines) if line.startswith("[") and i > 5)


# each: what is done to one step row, and the words of the warning it must give
ROW_DAMAGE = {
    "huge": (lambda r: r.__setitem__(4, 2 ** 64 + 5), "out of range"),
    "huge-fits": (lambda r: r.__setitem__(4, 2 ** 62), "out of range"),
    "negative": (lambda r: r.__setitem__(2, -5), "out of range"),
    "float": (lambda r: r.__setitem__(3, 1.5), "wrong type"),
    "string": (lambda r: r.__setitem__(0, "ProfilerStep#-1"), "wrong type"),
    "dict": (lambda r: r.__setitem__(5, {"a": 1}), "wrong type"),
    "null": (lambda r: r.__setitem__(6, None), "wrong type"),
    "short": (lambda r: r.__delitem__(slice(3, None)), "too few values"),
    "1e308": (lambda r: r.__setitem__(7, -1e308), "wrong type"),
}


@pytest.mark.parametrize("kind", sorted(ROW_DAMAGE))
def test_a_bad_step_row_is_skipped_and_counted(tmp_path, kind):
    """The crash sites of the audit (int() of a dict / string / huge number while building the
    frame): now the row is left out, one warning names it, and the other rows are analysed."""
    run = _copy(RECORD, tmp_path)
    good = gpuscope.analyze(RECORD).to_dict()
    line = _first_row_line(run)
    fn, words = ROW_DAMAGE[kind]
    _set_row(run, line, fn)
    table = read_path(run)
    full = read_path(RECORD).frame
    assert (table.frame["rank"] == 0).sum() == (full["rank"] == 0).sum() - 1
    assert (table.frame["rank"] == 1).sum() == (full["rank"] == 1).sum()
    hits = [w for w in table.warnings if words in w]
    assert len(hits) == 1, table.warnings
    assert "rank-00000.gpuscope.jsonl: 1 step row(s)" in hits[0] and f"line {line})" in hits[0]
    rep = gpuscope.analyze(run).to_dict()
    assert rep["verdict"] == good["verdict"]
    json.dumps(rep, allow_nan=False)


def test_a_repeated_step_counts_once(tmp_path):
    run = _copy(RECORD, tmp_path)
    p = run / "rank-00000.gpuscope.jsonl"
    lines = _lines(p)
    line = _first_row_line(run)
    lines.insert(line, lines[line - 1])
    p.write_text("\n".join(lines))
    table = read_path(run)
    assert not table.frame.duplicated(["rank", "step"]).any()
    assert any("1 step row(s) repeating a step" in w for w in table.warnings), table.warnings


@pytest.mark.parametrize("record,words", [
    ({"end": 0}, "malformed end record"),
    ({"knobs": {"batch_size": "eight", "num_workers": -3, "device": 7}}, "3 knob value(s)"),
    ({"knobs": [1, 2]}, "knob value(s)"),
    ({"device": [{"step": "x"}, 5]}, "2 malformed device time(s)"),
    ({"nvml": [[1, 2, 3]]}, "1 malformed NVML sample(s)"),
    ({"dataparallel": {"devices": "01"}}, "malformed DataParallel"),
    ({"routing": {"steps": [3], "rows": [[5], [6]]}}, "1 malformed all-to-all row record(s)"),
])
def test_bad_side_records_are_skipped_and_counted(tmp_path, record, words):
    run = _copy(RECORD, tmp_path)
    p = run / "rank-00000.gpuscope.jsonl"
    lines = _lines(p)
    lines.insert(3, json.dumps(record))
    p.write_text("\n".join(lines))
    rep = gpuscope.analyze(run)
    hits = [w for w in rep.warnings if words in w]
    assert len(hits) == 1 and "first at line 4" in hits[0], rep.warnings
    assert rep.to_dict()["steps_analysed"] == gpuscope.analyze(RECORD).to_dict()["steps_analysed"]


def test_a_header_of_the_wrong_types_falls_back(tmp_path):
    run = _copy(RECORD, tmp_path)
    p = run / "rank-00001.gpuscope.jsonl"
    lines = _lines(p)
    head = json.loads(lines[0])
    head.update(rank="one", world_size=-2, columns={"x": 1}, start_unix_ns=2 ** 70)
    lines[0] = json.dumps(head)
    p.write_text("\n".join(lines))
    rep = gpuscope.analyze(run)
    assert rep.to_dict()['ranks_analysed'] == 2  # the rank came from the file name
    assert any("'rank': taken from the file name" in w for w in rep.warnings), rep.warnings


def test_a_rank_file_with_no_usable_row_is_named(tmp_path):
    run = _copy(RECORD, tmp_path)
    p = run / "rank-00001.gpuscope.jsonl"
    lines = _lines(p)
    p.write_text("\n".join(line.replace("[", '["x",', 1) if line.startswith("[") else line
                           for line in lines))
    rep = gpuscope.analyze(run)
    assert rep.to_dict()['ranks_analysed'] == 1
    assert any("rank 1 recorded no usable steps" in w for w in rep.warnings), rep.warnings


def test_truncated_trace_reads_the_events_before_the_cut(tmp_path):
    run = _copy(KINETO, tmp_path)
    name = sorted(os.listdir(run))[0]
    text = gzip.decompress((run / name).read_bytes())
    (run / name).write_bytes(gzip.compress(text[: len(text) * 2 // 3]))
    full = read_path(KINETO)
    cut = read_path(run)
    # its distributedInfo (at the end) is lost with the cut: the rank is its process's, whose
    # other file (a second profiler cycle) names it
    assert sorted(cut.ranks) == sorted(full.ranks)
    assert any(name in w and "same process" in w for w in cut.warnings), cut.warnings
    assert any(name in w and "read event by event" in w for w in cut.warnings), cut.warnings
    r0 = full.ranks[0].meta["events"]
    assert 0 < cut.ranks[0].meta["events"] < r0


def test_truncated_gzip_reads_what_inflates(tmp_path):
    run = _copy(KINETO, tmp_path)
    name = sorted(os.listdir(run))[0]
    blob = (run / name).read_bytes()
    (run / name).write_bytes(blob[: len(blob) // 2])
    t = read_path(run)
    assert any(name in w and "read event by event" in w for w in t.warnings), t.warnings


def test_damaged_events_are_counted(tmp_path):
    src = sorted(os.listdir(KINETO))[0]
    doc = json.loads(gzip.decompress(open(os.path.join(KINETO, src), "rb").read()))
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    xs[3]["ts"] = -5
    xs[4]["dur"] = 1e300
    xs[5]["ts"] = "soon"
    p = tmp_path / "t.pt.trace.json"
    p.write_text(json.dumps(doc))
    t = read_path(p)
    assert any("2 event(s) with a negative, huge or non-numeric time" in w for w in t.warnings), \
        t.warnings


def test_nothing_usable_is_one_error(tmp_path):
    (tmp_path / "t.json").write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file"):
        read_path(tmp_path / "t.json")
    (tmp_path / "u.json").write_bytes(b'{"hello": [1, 2, 3]}')
    with pytest.raises(TraceFormatError, match="not a torch.profiler trace"):
        read_path(tmp_path / "u.json")
    (tmp_path / "v.pt.trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "ts": ')
    with pytest.raises(TraceFormatError, match="no event that parses"):
        read_path(tmp_path / "v.pt.trace.json")
    (tmp_path / "w.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceFormatError, match="truncated"):
        read_path(tmp_path / "w.pt.trace.json.gz")


def test_no_decoder_process_outlives_an_analysis(tmp_path):
    """The reader forks a decoder for half of the files (two cores); when the parent's half
    raises, the child is stopped. Before, it stayed blocked writing to a pipe nobody read: one
    process per analysis of a folder with one unreadable file."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the reader forks only with 2+ cores")
    run = _copy(KINETO, tmp_path)
    # the biggest file goes to this process's half: make it the unreadable one
    biggest = max(os.listdir(run), key=lambda f: (run / f).stat().st_size)
    (run / biggest).write_bytes(b"{" * 300_000)
    gpuscope.analyze(run)  # first: imports and their files are open from now on
    before, fds = set(live_children()), len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        rep = gpuscope.analyze(run)
        assert any(w.startswith("skipped:") and biggest in w for w in rep.warnings)
    assert set(live_children()) - before == set()
    assert len(os.listdir("/proc/self/fd")) == fds  # nor a pipe end left open
    # and when every file fails
    for f in os.listdir(run):
        (run / f).write_bytes(b"{" * 300_000)
    with pytest.raises(GpuscopeError):
        gpuscope.analyze(run)
    assert set(live_children()) - before == set()


class _ParentFailed(Exception):
    pass


def test_a_decoder_still_working_is_stopped_when_the_parent_gives_up():
    """The parent's half raised while the child is still decoding (here: sleeping): the child
    is terminated on the way out, not left to finish or to block on its pipe."""
    import time

    from gpuscope.readers.fork import in_child

    before = set(live_children())
    t0 = time.perf_counter()
    with pytest.raises(_ParentFailed):
        with in_child(lambda: time.sleep(60)):
            raise _ParentFailed()
    assert time.perf_counter() - t0 < 10
    assert set(live_children()) - before == set()


# distributedInfo fields of the wrong type (a mutation fuzz of the samples found pg_config: 5
# raising TypeError): each is left out, the file is read, and the rank comes from elsewhere
INFO_DAMAGE = {
    "pg_config number": {"rank": 0, "world_size": 2, "pg_config": 5},
    "pg_config string": {"rank": 0, "world_size": 2, "pg_config": "0,1"},
    "pg_config object": {"rank": 0, "world_size": 2, "pg_config": {"ranks": [0, 1]}},
    "pg entry list": {"rank": 0, "world_size": 2, "pg_config": [[0, 1]]},
    "pg ranks number": {"rank": 0, "world_size": 2, "pg_config": [{"pg_name": "0", "ranks": 2}]},
    "pg ranks strings": {"rank": 0, "world_size": 2, "pg_config": [{"ranks": ["a"]}]},
    "pg name object": {"rank": 0, "world_size": 2, "pg_config": [{"pg_name": {}, "ranks": [0]}]},
    "rank string": {"rank": "0", "world_size": 2},
    "rank float": {"rank": 0.0, "world_size": 2},
    "world list": {"rank": 0, "world_size": [2]},
    "backend number": {"rank": 0, "world_size": 2, "backend": 7},
    "info list": [1, 2],
    "info number": 3,
}


@pytest.mark.parametrize("kind", sorted(INFO_DAMAGE))
def test_distributed_info_of_the_wrong_types_is_read_around(tmp_path, kind):
    src = os.path.join(KINETO, sorted(os.listdir(KINETO))[0])
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    doc["distributedInfo"] = INFO_DAMAGE[kind]
    p = tmp_path / "rank-0.pt.trace.json"
    p.write_text(json.dumps(doc))
    table = read_path(str(p))
    assert list(table.ranks) == [0] and not table.frame.empty
    groups = table.ranks[0].knobs.get("process_groups")
    assert groups is None or all(isinstance(v, list) for v in groups.values())


@pytest.mark.parametrize("name,body,says", [
    ("other_tool.json", {"traceEvents": [{"name": "frame", "ph": "X", "ts": 1, "dur": 5,
                                          "pid": 1, "tid": 1}], "displayTimeUnit": "ms"},
     "a Chrome trace-event file written by another tool"),
    ("array.json", [{"name": "frame", "ph": "B", "ts": 1, "pid": 1, "tid": 1},
                    {"name": "frame", "ph": "E", "ts": 3, "pid": 1, "tid": 1}],
     "a Chrome trace-event array written by another tool"),
    ("snapshot.json", {"segments": [], "device_traces": [[]]}, "a CUDA memory snapshot"),
    ("memory.json", [[1.0, 2.0], [[0, 1], [2, 3]]], "a memory timeline"),
    ("xla.json", {"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1,
                                   "args": {"name": "/device:GPU:0"}},
                                  {"name": "fusion.1", "ph": "X", "ts": 1, "dur": 2, "pid": 1,
                                   "tid": 1}]}, "a TensorFlow / JAX (XLA) profiler trace"),
])
def test_a_json_that_is_not_a_profiler_trace_says_what_it_looks_like(tmp_path, name, body, says):
    """One clear line: what the file seems to be, and what gpuscope reads instead (never "no
    steps to analyse" of a file that never had any)."""
    path = tmp_path / name
    path.write_text(json.dumps(body))
    with pytest.raises(GpuscopeError) as err:
        gpuscope.analyze(str(path))
    msg = str(err.value)
    assert says in msg and "not a torch.profiler trace" in msg and "gpuscope reads" in msg
    assert "\n" not in msg


EXTERNAL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces", "external")


def test_two_unrelated_traces_of_one_rank_are_not_merged_into_one_run(tmp_path):
    """A B200 trace and an MI300X trace, each rank 0 of its own job, in one folder: not one
    process's profiler cycles. One run is analysed, the other named in a warning; no step is
    longer than the file it came from (merged, they made one step of 5,847 s)."""
    pairs = [("tracelens_b200_eager_trace", "eager_trace.json.gz"),
             ("tracelens_mi300_resnet_act_checkpoint", "resnet_act_checkpoint.json.gz")]
    for i, (d, f) in enumerate(pairs):
        src = os.path.join(EXTERNAL, d, f)
        if not os.path.exists(src):
            assert os.environ.get("GPUSCOPE_REQUIRE_SHARED") != "1", src
            pytest.skip("../shared/traces/external is not here")
        shutil.copy(src, tmp_path / f"{'ab'[i]}.json.gz")
    rep = gpuscope.analyze(str(tmp_path))
    said = [w for w in rep.warnings if "cannot be one run" in w]
    assert len(said) == 1 and "NVIDIA B200" in said[0] and "MI300X" in said[0]
    assert "left out" in said[0] and "analyse them apart" in said[0]
    alone = gpuscope.analyze(os.path.join(EXTERNAL, *pairs[1]))
    longest = max(s.step_ns for s in alone.steps) / 1e6 if alone.steps else 0
    assert max(s.step_ns for s in rep.steps) / 1e6 <= max(longest, 1e3)


def test_a_folder_of_json_that_is_no_trace_says_what_its_file_is(tmp_path):
    """Issue 71, 14.: the file alone was refused with its reason ("JSON without 'traceEvents'"),
    the folder holding it with the generic list only; now the folder's error carries the file's
    reason too."""
    (tmp_path / "config.json").write_text('{"lr": 0.1, "epochs": 3}')
    with pytest.raises(GpuscopeError) as alone:
        read_path(str(tmp_path / "config.json"))
    with pytest.raises(GpuscopeError) as folder:
        read_path(str(tmp_path))
    assert "JSON without 'traceEvents'" in str(alone.value)
    assert "neither a gpuscope run dir" in str(folder.value)
    assert "1 JSON file(s) here, none a trace" in str(folder.value)
    assert f"{tmp_path / 'config.json'}: JSON without 'traceEvents'" in str(folder.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GpuscopeError) as nothing:
        read_path(str(empty))
    assert "JSON file" not in str(nothing.value)


def test_traces_of_two_runs_in_one_folder_are_not_one_job(tmp_path):
    """Issue 71, 4.: two unrelated traces in one folder (one machine, minutes apart) were
    analysed as one job's two ranks, confidence high. One job's ranks are profiled at the same
    time: here rank 1's traces (the data sample's) are moved 2 minutes later, and only the
    newest run is analysed, the other named; the sample as it is stays one job of 2 ranks."""
    src = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "data", "kineto")
    assert len(read_path(src).ranks) == 2
    for name in os.listdir(src):
        with gzip.open(os.path.join(src, name), "rt") as fh:
            doc = json.load(fh)
        if doc["distributedInfo"]["rank"] == 1:
            for ev in doc["traceEvents"]:
                if "ts" in ev:
                    ev["ts"] += 120e6  # microseconds
            doc["baseTimeNanoseconds"] += 120 * 10**9
        with gzip.open(tmp_path / name, "wt") as fh:
            json.dump(doc, fh)
    table = read_path(str(tmp_path))
    assert sorted(table.ranks) == [1]
    said = [w for w in table.warnings if "runs that did not run at the same time" in w]
    assert len(said) == 1 and "analysed the newest, rank(s) 1" in said[0]
    assert "left out 2 file(s) (vm_25142." in said[0]
