"""The shared row block (readers/rowblock.py): two processes write the ranks' columns in place,
the frame is a view of it, and anything that does not fit in order is copied as before."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pandas as pd
import pytest

from gpuscope.readers import fork, read_path
from gpuscope.readers.rundir import parallel_load
from gpuscope.readers.record_body import BLOCK_ROWS
from gpuscope.readers.rowblock import Region, RowBlock, rows_bound

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def _make_run(path, ranks: int, steps: int) -> None:
    """A run dir of the recorder's own writer, side files included (bench_scale.make_run)."""
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location("bench_scale",
                                                      os.path.join(BENCH, "bench_scale.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(BENCH)
    mod.make_run(str(path), ranks, steps)


def _one_process(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(parallel_load, "forks", lambda: False)
        return read_path(str(path))


def _same(a, b):
    pd.testing.assert_frame_equal(a.frame, b.frame)
    pd.testing.assert_frame_equal(a.comm, b.comm)
    assert a.warnings == b.warnings


@pytest.fixture
def two_processes(monkeypatch):
    if not fork.can_fork():
        pytest.skip("the reader forks only with 2+ cores and no other thread")
    monkeypatch.setattr(parallel_load, "PARALLEL_MIN_FILES", 2)
    blocks = []
    real = RowBlock.__init__

    def spy(self, *args):
        real(self, *args)
        blocks.append(self)

    monkeypatch.setattr(RowBlock, "__init__", spy)
    return blocks


def test_the_frame_is_the_shared_block_the_two_processes_wrote(tmp_path, monkeypatch,
                                                               two_processes):
    _make_run(tmp_path / "run", 6, 40)
    one = _one_process(tmp_path / "run", monkeypatch)
    from gpuscope.readers import rowblock

    moved = []
    real = rowblock.ctypes.memmove
    monkeypatch.setattr(rowblock.ctypes, "memmove", lambda *a: moved.append(a) or real(*a))
    two = read_path(str(tmp_path / "run"))
    _same(one, two)
    assert not moved  # the child's region ends where the parent's begins
    assert len(two_processes) == 1
    shared = two_processes[0].array
    for name in ("rank", "step_ns", "between_ns", "wait_ns"):  # views, not copies
        assert np.shares_memory(two.frame[name].to_numpy(), shared), name
    assert two.frame["rank"].tolist() == [r for r in range(6) for _ in range(40)]


@pytest.mark.parametrize("rank", [1, 4])  # in the forked reader's region, in the parent's
def test_a_file_longer_than_its_side_file_gets_its_own_arrays(tmp_path, monkeypatch,
                                                              two_processes, rank):
    """Rows appended after the side file's last chunk (more than its bound): the file is
    decoded from its JSON into an array of its own, and the frame is copied together."""
    run = tmp_path / "run"
    _make_run(run, 6, 20)
    name = run / f"rank-{rank:05d}.gpuscope.jsonl"
    lines = name.read_bytes().split(b"\n")
    rows = [line for line in lines[1:] if line.startswith(b"[")]
    assert rows_bound(str(name)) < 3 * len(rows)
    last = [line for line in lines if line.startswith(b'{"end"')]
    body = [line for line in lines[1:] if line and not line.startswith(b'{"end"')]
    extra = []
    for k in range(2 * len(rows)):  # 40 more steps, numbered after the last
        values = rows[-1].split(b",")
        values[0] = b"[" + str(len(rows) + k).encode()
        extra.append(b",".join(values))
    name.write_bytes(b"\n".join([lines[0], *body, *extra, *last]) + b"\n")
    one = _one_process(run, monkeypatch)
    two = read_path(str(run))
    _same(one, two)
    assert (two.frame["rank"] == rank).sum() == 60
    assert not np.shares_memory(two.frame["step_ns"].to_numpy(), two_processes[0].array)


def _filled(block, region, n, rank):
    got = region.place(n)
    got[...] = rank
    region.commit(got)
    return got


def test_regions_close_up_in_order_and_refuse_any_other():
    block = RowBlock(20)
    left, right = Region(block, 0, 8), Region(block, 8, 12)
    a = _filled(block, left, 3, 1)
    b = _filled(block, left, 2, 2)
    c = _filled(block, right, 4, 3)
    own = _filled(block, right, 9, 4)  # beyond the region: an array of its own
    assert not block.holds(own) and right.used == 4
    assert block.joined([b, a, c], [left, right]) is None  # out of order
    assert block.joined([a, c], [left, right]) is None  # a file left out
    joined = block.joined([a, b, c], [left, right])
    assert joined.shape == (len(BLOCK_ROWS) + 1, 9)
    assert joined[0].tolist() == [1, 1, 1, 2, 2, 3, 3, 3, 3]
    assert not joined[-1].any()  # wait_ns: zeros


def test_a_region_filled_from_the_right_meets_the_next_with_nothing_moved(monkeypatch):
    """The forked reader's region fills leftwards, its files taken last to first: its columns
    end where the parent's begin, so the frame is the block as written (no memmove)."""
    from gpuscope.readers import rowblock

    block = RowBlock(20)
    left, right = Region(block, 0, 8, downward=True), Region(block, 8, 12)
    b = _filled(block, left, 2, 2)  # the child's last file first
    a = _filled(block, left, 3, 1)
    c = _filled(block, right, 4, 3)
    assert [block.offset_of(x) for x in (a, b, c)] == [3, 6, 8] and left.first == 3
    moved = []
    monkeypatch.setattr(rowblock.ctypes, "memmove", lambda *args: moved.append(args))
    assert block.joined([b, a, c], [left, right]) is None  # out of order
    joined = block.joined([a, b, c], [left, right])
    assert not moved
    assert joined[0].tolist() == [1, 1, 1, 2, 2, 3, 3, 3, 3]
    assert block.offset_of(joined) == 3


def test_a_file_that_falls_back_takes_the_place_it_was_offered_again():
    block = RowBlock(10)
    region = Region(block, 0, 10)
    first = region.place(4)  # the side file path wrote here, then gave up
    first[...] = 7
    again = region.place(5)  # the JSON path
    assert block.offset_of(again) == block.offset_of(first) == 0
    region.commit(again)
    assert region.used == 5


def _report_json(report) -> bytes:
    from gpuscope.render import json as render_json

    text = render_json.render(report)
    return text if isinstance(text, bytes) else text.encode()


@pytest.mark.parametrize("forked", [True, False])
def test_an_analysis_that_owns_its_table_leaves_the_warm_up_out_in_place(
        tmp_path, monkeypatch, forked):
    """gpuscope.analyze reads the table for itself: the warm-up rows are moved out inside the
    reader's block instead of copied, and the report is the one a borrowed table gives."""
    import gpuscope
    from gpuscope.analyze import prepare as prep
    from gpuscope.analyze.run import analyze_table

    _make_run(tmp_path / "run", 6, 30)
    if forked:
        if not fork.can_fork():
            pytest.skip("the reader forks only with 2+ cores and no other thread")
        monkeypatch.setattr(parallel_load, "PARALLEL_MIN_FILES", 2)
    else:
        monkeypatch.setattr(parallel_load, "forks", lambda: False)
    borrowed = read_path(str(tmp_path / "run"))
    before = borrowed.frame.copy()
    want = _report_json(analyze_table(borrowed))
    pd.testing.assert_frame_equal(borrowed.frame, before)  # a borrowed table is left as read
    moved = []
    real = prep.compacted
    monkeypatch.setattr(prep, "compacted",
                        lambda *a: moved.append(out := real(*a)) or out)
    into = []
    real_into = prep.own_column
    monkeypatch.setattr(prep, "own_column", lambda *a: into.append(out := real_into(*a)) or out)
    got = _report_json(gpuscope.analyze(str(tmp_path / "run")))
    if forked:  # rows placed in the shared block: the warm-up was set apart as they were read
        assert moved == []  # (tests/test_warm_split.py), nothing left to move
    else:
        assert len(moved) == 1 and moved[0] is not None  # the in-place path was taken
    assert len(into) == 1 and into[0] is not None  # ... and the waits written into the block
    assert got == want


def test_in_place_needs_the_frame_to_be_the_block():
    from gpuscope.analyze.prepare import compacted

    block = np.arange(12, dtype=np.int64).reshape(2, 6)
    frame = pd.DataFrame(block.T, columns=["rank", "step"], copy=False)
    keep = np.array([False, True, True, False, True, True])
    assert compacted(frame.copy(), keep, (block, ["rank", "step"])) is None  # a copy: refused
    out = compacted(frame, keep, (block, ["rank", "step"]))
    assert out["step"].tolist() == [7, 8, 10, 11] and out["rank"].tolist() == [1, 2, 4, 5]


@pytest.mark.parametrize("seed", range(6))
def test_kept_rows_moved_a_run_at_a_time_are_the_mask_s(seed):
    """The warm-up left out in place: runs of kept rows (a rank's rows after its first few, of
    any length, overlapping where they move) moved as slices give what the mask gives, on every
    row of the block, and what lies past the kept rows is not read as theirs."""
    from gpuscope.analyze import prepare as prep

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, 60)
    keep = np.concatenate([np.arange(n) >= rng.integers(0, 6) for n in lengths])
    keep[rng.integers(0, keep.size, 3 * seed)] = False  # a few holes of other kinds
    block = rng.integers(-1 << 40, 1 << 40, (5, keep.size))
    k = int(keep.sum())
    want = block[:, keep].copy()
    for run_min in (1, 10 ** 9):  # by runs, and by the mask (runs too short on average)
        got = block.copy()
        old = prep.RUN_MOVE_MIN
        prep.RUN_MOVE_MIN = run_min
        try:
            prep._move_up(got, keep, k)
        finally:
            prep.RUN_MOVE_MIN = old
        assert np.array_equal(got[:, :k], want)


def test_a_run_dir_that_may_not_fit_in_memory_says_so_before_it_is_read(tmp_path, monkeypatch,
                                                                         caplog):
    """The side files' row bounds times the measured peak bytes per rank-step, against the
    memory available: said in the log before any file is read, and among the table's warnings;
    the step table is then kept in an unlinked file under $GPUSCOPE_SPILL_DIR (mapped while the
    table lives) and is the table that would have been read in memory."""
    from gpuscope.readers import rowblock

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("GPUSCOPE_SPILL_DIR", str(spill))
    if rowblock.in_memory_fs(str(spill)):
        pytest.skip("the test's directory is in memory (tmpfs): nothing is spilled there")

    run = tmp_path / "run"
    _make_run(run, 6, 40)
    monkeypatch.setattr(parallel_load, "PARALLEL_MIN_FILES", 2)
    plain = read_path(str(run))
    assert not any("memory" in w for w in plain.warnings)
    rows = sum(rowblock.side_rows_bound(str(p)) for p in run.glob("rank-*.gpuscope.jsonl"))
    assert 6 * 40 <= rows < 2 * 6 * 40
    need = rows * rowblock.PEAK_BYTES_PER_ROW
    read_first = []
    real = parallel_load.load_rank_file
    monkeypatch.setattr(parallel_load, "load_rank_file",
                        lambda *a, **k: read_first.append(len(caplog.records)) or real(*a, **k))
    monkeypatch.setattr(rowblock, "available_memory", lambda: need - 1)
    with caplog.at_level("WARNING", logger="gpuscope"):
        tight = read_path(str(run))
    said = [w for w in tight.warnings if "may take about" in w]
    assert len(said) == 1 and f"up to {rows:,} rank-steps" in said[0]
    if not parallel_load.forks():  # one process reads: its tables stay in memory, and it says so
        assert "read by one process here" in said[0]
    else:
        assert f"are kept in files under {spill}" in said[0]
    if parallel_load.forks() and fork.can_fork():  # the two-process reader maps its tables there
        with open("/proc/self/maps") as fh:
            mapped = {line.split()[-2] for line in fh if f" {spill}/" in line
                      and line.rstrip().endswith("(deleted)")}
        frame_at = tight.frame["step_ns"].to_numpy().ctypes.data
        comm_at = tight.comm["comm_ns"].to_numpy().ctypes.data
        assert len(mapped) >= 2 and _in_a_mapping_of(frame_at, spill) and \
            _in_a_mapping_of(comm_at, spill)
    assert os.listdir(spill) == []  # unlinked: nothing left behind
    assert caplog.records and said[0] in caplog.records[0].getMessage()
    assert read_first and min(read_first) >= 1  # logged before the first file was read
    _same(plain, replace_warnings(tight, plain.warnings))
    monkeypatch.setattr(rowblock, "available_memory", lambda: need)
    assert not any("may take about" in w for w in read_path(str(run)).warnings)
    monkeypatch.setattr(rowblock, "available_memory", lambda: None)  # not known: nothing said
    assert not any("may take about" in w for w in read_path(str(run)).warnings)


def _in_a_mapping_of(address: int, folder) -> bool:
    """Whether `address` lies in this process's mapping of a deleted file in `folder`."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            span, *rest = line.split()
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return f" {folder}/" in line and line.rstrip().endswith("(deleted)")
    return False


def replace_warnings(table, warnings):
    from dataclasses import replace

    return replace(table, warnings=list(warnings))


def test_memory_room_in_a_control_group(tmp_path):
    """A container's (or a job's) memory limit is the memory there is: cgroup v2 and v1 read
    from their files, the page cache not counted as used; no limit, no answer."""
    from gpuscope.readers.rowblock import cgroup_room

    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("4294967296\n")
    (v2 / "job" / "memory.current").write_text(str(3 << 30) + "\n")
    (v2 / "job" / "memory.stat").write_text("anon 100\nfile 1073741824\nkernel 5\n")
    proc = tmp_path / "cgroup2"
    proc.write_text("0::/job\n")
    assert cgroup_room(str(proc), str(v2)) == (4 << 30) - (2 << 30)
    (v2 / "job" / "memory.max").write_text("max\n")
    assert cgroup_room(str(proc), str(v2)) is None

    v1 = tmp_path / "v1"
    (v1 / "memory" / "pod").mkdir(parents=True)
    (v1 / "memory" / "pod" / "memory.limit_in_bytes").write_text(str(8 << 30))
    (v1 / "memory" / "pod" / "memory.usage_in_bytes").write_text(str(7 << 30))
    (v1 / "memory" / "pod" / "memory.stat").write_text("cache 9\ntotal_cache 3221225472\n")
    proc1 = tmp_path / "cgroup1"
    proc1.write_text("12:cpu,cpuacct:/pod\n9:memory:/pod\n1:name=systemd:/pod\n")
    assert cgroup_room(str(proc1), str(v1)) == (8 << 30) - (4 << 30)
    (v1 / "memory" / "pod" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert cgroup_room(str(proc1), str(v1)) is None
    assert cgroup_room(str(tmp_path / "none"), str(v1)) is None


def test_a_spill_directory_in_memory_or_without_room_is_not_used(tmp_path, monkeypatch):
    """The step table goes to disk only where a file is outside memory and the disk has room;
    otherwise the warning says why it stays in memory."""
    from gpuscope.readers import rowblock

    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {tmp_path}/ram tmpfs rw 0 0\n")
    assert rowblock.in_memory_fs(str(tmp_path / "ram" / "x"), str(mounts))
    assert not rowblock.in_memory_fs(str(tmp_path / "ramdisk"), str(mounts))
    assert not rowblock.in_memory_fs(str(tmp_path), str(mounts))

    monkeypatch.setenv("GPUSCOPE_SPILL_DIR", str(tmp_path))
    rows = 1_000_000
    assert rowblock.memory_plan(rows, rows * rowblock.PEAK_BYTES_PER_ROW) == (None, None)
    monkeypatch.setattr(rowblock, "free_disk", lambda path: 10 << 40)
    said, where = rowblock.memory_plan(rows, 1 << 20)
    assert where == str(tmp_path) and "kept in files" in said and "may still not fit" in said
    monkeypatch.setattr(rowblock, "in_memory_fs", lambda path: True)
    said, where = rowblock.memory_plan(rows, 1 << 20)
    assert where is None and "held in memory (tmpfs)" in said
    monkeypatch.setattr(rowblock, "in_memory_fs", lambda path: False)
    said, where = rowblock.memory_plan(rows, 1 << 20, shared=False)  # one process reads
    assert where is None and "read by one process here" in said
    monkeypatch.setattr(rowblock, "free_disk", lambda path: 1 << 20)
    said, where = rowblock.memory_plan(rows, 1 << 20)
    assert where is None and "GB free of the" in said


def test_a_spill_directory_whose_disk_runs_out_keeps_the_table_in_memory(tmp_path, monkeypatch):
    """The step table's disk is allocated before a row is written: when it cannot be (a full
    disk), the table is read in memory, the same table, and the report says so."""
    from gpuscope.readers import rowblock

    run = tmp_path / "run"
    _make_run(run, 6, 40)
    monkeypatch.setattr(parallel_load, "PARALLEL_MIN_FILES", 2)
    plain = read_path(str(run))
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("GPUSCOPE_SPILL_DIR", str(spill))
    monkeypatch.setattr(rowblock, "available_memory", lambda: 1)

    def full(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    full_disk = read_path(str(run))
    pd.testing.assert_frame_equal(plain.frame, full_disk.frame)
    pd.testing.assert_frame_equal(plain.comm, full_disk.comm)
    if parallel_load.forks():
        assert any("could not be kept in a file" in w and "No space left" in w
                   for w in full_disk.warnings)
