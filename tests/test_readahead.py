"""Files asked of the disk ahead of their reading (readers/readahead.py): each file after the
first is asked for once, before it is read, never more than the window ahead of the one being
read; a run dir read with it gives the same table as one read without it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpuscope.readers import read_path, readahead
from gpuscope.readers.record_file import HEAD_BYTES
from gpuscope.run_format import columns_path

from test_rowblock import _make_run


def _asked(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(readahead, "advise", calls.append)
    return calls


@pytest.mark.parametrize("ahead", [1, 25, 100, 10_000])
def test_each_file_is_asked_once_within_the_window(monkeypatch, ahead):
    calls = _asked(monkeypatch)
    sizes = [10, 30, 5, 60, 10, 10, 20, 1, 40, 10]
    items = [(f"r{i}", f"s{i}") for i in range(len(sizes))]
    a = readahead.Ahead(items, sizes, ahead)
    a.on = True  # the window's logic, whatever this platform's call
    for i in range(len(items)):
        before = len(calls)
        a.before(i)
        asked = {int(p[1:]) for p in calls}
        # the item about to be read is not asked for after it is read
        assert f"r{i}" not in calls[before:]
        # what is asked and not yet read lies within the window, less the last item taken
        pending = [j for j in asked if j > i]
        if pending:
            assert sum(sizes[j] for j in pending) - sizes[max(pending)] < ahead
        # and the window is filled: the next item is asked unless it alone would overflow
        if i + 1 < len(items) and ahead >= sum(sizes[i + 1:i + 2]):
            assert i + 1 in asked
    # every file but the first, once each, in order, a record file with its side file
    assert calls == [p for i in range(1, len(items)) for p in items[i]]
    assert len(calls) == len(set(calls))


def test_nothing_asked_without_the_call(monkeypatch):
    calls = _asked(monkeypatch)
    monkeypatch.setattr(readahead, "_ADVISE", None)
    a = readahead.Ahead([("a", "b"), ("c", "d")], [1, 1])
    a.before(0), a.before(1)
    assert calls == [] and not a.on


def test_missing_file_is_skipped(tmp_path):
    readahead.advise(str(tmp_path / "no-such-file"))  # no error
    real = tmp_path / "f"
    real.write_bytes(b"x" * 10_000)
    readahead.advise(str(real))  # the real call, on a real file


def test_run_dir_read_with_files_asked_ahead_is_the_same(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _make_run(run, 80, 40)  # above PARALLEL_MIN_FILES: read by two processes
    with monkeypatch.context() as m:
        m.setattr(readahead, "AHEAD_BYTES", 0)
        plain = read_path(str(run))
    calls: list[tuple] = []
    real = readahead.advise
    monkeypatch.setattr(readahead, "advise",
                        lambda p, n=0, t=0: (calls.append((p, n)), real(p, n, t)))
    monkeypatch.setattr(readahead, "AHEAD_BYTES", 64 << 10)
    ahead = read_path(str(run))
    names = sorted(str(p) for p in run.glob("rank-*.gpuscope.jsonl"))
    # the parent's files, asked for in this process (the child's were asked in the child):
    # the side files whole, the record files (older than them) only their head
    assert calls and len(calls) == len(set(calls))
    assert {(p, n) for p, n in calls if p in names} <= {(p, HEAD_BYTES) for p in names}
    assert {p for p, n in calls if p not in names} <= {columns_path(p) for p in names}
    assert {n for p, n in calls if p not in names} == {0}
    a, b = plain.frame, ahead.frame
    assert list(a.columns) == list(b.columns) and len(a) == len(b) == 80 * 40
    for c in a.columns:
        assert np.array_equal(a[c].to_numpy(), b[c].to_numpy()), c
    assert os.path.isdir(run)
