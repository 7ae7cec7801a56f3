"""The record reader's bulk paths (a body decoded into typed rows by msgspec, else all lines
decoded in one call and collectives checked in bulk; medians by partition) give exactly what the
line-by-line paths give, on good and bad input."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pandas as pd
import pytest

import gpuscope
from helpers import spy_taken
from gpuscope.analyze.rowgroups import Groups
from gpuscope.readers.rundir import frames, parallel_load
from gpuscope.readers.rundir import rank_file as rec_reader
from gpuscope.readers import read_path

ROOT = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
#: real recordings without column side files (an older recorder's): the typed JSON paths' input
OLD = os.path.join(os.path.dirname(__file__), "fixtures", "old_recorder")
RUNS = [os.path.join(OLD, s, "record") for s in ("imbalanced", "comm", "data")]


def _slow(monkeypatch):
    monkeypatch.setattr(rec_reader, "decode_body", lambda *a: None)  # no typed decoding
    monkeypatch.setattr(frames, "_comm_only", lambda *a: None)

    def one_by_one(body, text=b""):
        idx, out = [], []
        for i, line in enumerate(body):
            if line.strip():
                idx.append(i)
                try:
                    out.append(rec_reader._decode(line))
                except Exception:
                    out.append(rec_reader._BAD)
        return idx, out

    monkeypatch.setattr(rec_reader, "_objects", one_by_one)


def _same(a, b):
    pd.testing.assert_frame_equal(a.frame, b.frame)
    pd.testing.assert_frame_equal(a.comm, b.comm)
    assert a.warnings == b.warnings


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.split(os.sep)[-2])
def test_bulk_paths_read_what_line_by_line_reads(run, monkeypatch):
    seen = _typed_files(monkeypatch)
    fast = read_path(run)
    assert seen and all(seen)  # the recorder's files take the typed path
    assert fast.comm is not None and len(fast.comm) > 0
    _slow(monkeypatch)
    _same(fast, read_path(run))


def _typed_files(monkeypatch) -> list:
    """Counts the files the typed decoder took (None: it declined)."""
    return spy_taken(monkeypatch, rec_reader, "decode_body")


@pytest.mark.parametrize("shape", ["as_recorded", "no_trailing_objects", "mixed_with_samples",
                                   "side_records_between_rows", "named_phase"])
def test_typed_rows_read_what_line_by_line_reads(tmp_path, monkeypatch, shape):
    """Each shape of body the typed decoder knows (every row with collectives, none, a mix with
    a smaller batch's size, side records between rows) is decoded typed and gives what the
    careful path gives; one it does not know (a named phase) is left to the careful path."""
    run = tmp_path / "run"
    shutil.copytree(RUNS[1], run)
    for path in run.glob("rank-*.gpuscope.jsonl"):
        lines = path.read_bytes().split(b"\n")
        rows = [i for i, x in enumerate(lines) if x.startswith(b"[")]
        for n, i in enumerate(rows):
            if shape == "no_trailing_objects" or (shape == "mixed_with_samples" and n % 3 == 1):
                lines[i] = re.sub(rb",\{.*\}\]$", b"]", lines[i])
            elif shape == "mixed_with_samples" and n == 5:
                lines[i] = lines[i].replace(b'{"_comm"', b'{"_samples":3,"_comm"', 1)
            elif shape == "named_phase" and n == 5:
                lines[i] = lines[i].replace(b'{"_comm"', b'{"loss":5000,"_comm"', 1)
        if shape == "side_records_between_rows":
            lines.insert(rows[4], b'{"knobs":{"num_workers":3},"at_step":4}')
        path.write_bytes(b"\n".join(lines))
    seen = _typed_files(monkeypatch)
    fast = read_path(str(run))
    assert seen == [shape != "named_phase"] * 2, seen
    if shape == "no_trailing_objects":
        assert fast.comm is None
    else:
        assert fast.comm is not None and len(fast.comm) > 0
    if shape == "mixed_with_samples":
        assert (fast.frame["samples"] == 3).sum() == 2  # one row on each rank
    _slow(monkeypatch)
    slow = read_path(str(run))
    pd.testing.assert_frame_equal(fast.frame, slow.frame)
    if fast.comm is not None:
        pd.testing.assert_frame_equal(fast.comm, slow.comm)
    assert fast.warnings == slow.warnings
    assert fast.knobs() == slow.knobs()


@pytest.mark.parametrize("damage", ["corrupt_middle", "cut_tail", "float_in_comm", "extra_key",
                                    "huge_comm", "blank_lines", "repeated_step", "null_comm"])
def test_bulk_paths_fall_back_on_damage(tmp_path, monkeypatch, damage):
    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run)
    path = run / "rank-00001.gpuscope.jsonl"
    lines = path.read_bytes().split(b"\n")
    rows = [i for i, x in enumerate(lines) if x.startswith(b"[")]
    i = rows[len(rows) // 2]
    if damage == "corrupt_middle":
        lines[i] = lines[i][:20] + b"}{" + lines[i][20:]
    elif damage == "cut_tail":
        lines = lines[:-1]
        lines[-1] = lines[-1][: len(lines[-1]) // 2]
    elif damage == "float_in_comm":
        lines[i] = re.sub(rb'("all_reduce:ddp":\[)\d+', rb"\g<1>1.5", lines[i])
    elif damage == "extra_key":
        lines[i] = lines[i].replace(b'{"_comm"', b'{"mine":5,"_comm"', 1)
    elif damage == "huge_comm":
        lines[i] = re.sub(rb'("all_reduce:ddp":\[)\d+', rb"\g<1>99999999999999999999", lines[i])
    elif damage == "null_comm":
        lines[i] = re.sub(rb'"_comm":\{[^}]*\}', b'"_comm":null', lines[i])
    elif damage == "repeated_step":
        lines.insert(i + 2, lines[i])
    elif damage == "blank_lines":
        lines.insert(i, b"   ")
        lines.insert(i, b"")
    before = path.read_bytes()
    path.write_bytes(b"\n".join(lines))
    assert path.read_bytes() != before
    fast = read_path(str(run))
    if damage not in ("blank_lines", "extra_key"):  # skipped and counted, or the cut reported
        assert any("rank-00001" in w for w in fast.warnings), fast.warnings
    _slow(monkeypatch)
    _same(fast, read_path(str(run)))
    gpuscope.analyze(str(run))  # and it analyses


@pytest.mark.parametrize("keys", [
    np.repeat(np.arange(50), 40),                         # ranks, every step: one group size
    np.tile(np.arange(40), 50),                           # steps, every rank
    np.random.default_rng(0).integers(0, 50, 2000),       # groups of many sizes
    np.repeat(np.arange(7), 2),                           # even counts: mean of the middle two
])
def test_group_medians_are_pandas_medians(keys):
    values = np.random.default_rng(1).integers(0, 10**12, keys.size)
    got = Groups(keys).median(values)
    want = pd.Series(values).groupby(keys).median().to_numpy()
    assert np.array_equal(got, want)


def test_two_processes_read_what_one_reads(tmp_path, monkeypatch):
    """A big run dir is read by two processes (every other file in a fork): same table, same
    warnings, a bad file in either half reported as in one process, no process left behind."""
    from helpers import live_children

    run = tmp_path / "run"
    shutil.copytree(RUNS[0], run)
    for rank in (2, 3):  # four files: two per process; rank 3's is damaged
        src = (run / "rank-00001.gpuscope.jsonl").read_text()
        text = src.replace('"rank":1,', f'"rank":{rank},', 1).replace('"world_size":2', '"world_size":4')
        if rank == 3:
            text = text[: len(text) // 2]
        (run / f"rank-0000{rank}.gpuscope.jsonl").write_text(text)
    one = read_path(str(run))
    from gpuscope.readers import fork

    monkeypatch.setattr(parallel_load, "PARALLEL_MIN_FILES", 2)
    forks = []
    real = fork.in_child
    monkeypatch.setattr(fork, "in_child", lambda work: forks.append(1) or real(work))
    before = live_children()
    two = read_path(str(run))
    assert forks == [1] and live_children() == before
    _same(one, two)
    assert sorted(two.ranks) == [0, 1, 2, 3]
    assert any("rank-00003" in w and "cut" in w for w in two.warnings)


@pytest.mark.parametrize("kind", ["record", "kineto"])
def test_a_progress_bar_on_big_inputs_only(tmp_path, monkeypatch, capsys, kind):
    """More than 64 files (or 100 MB): a bar on stderr while reading, gone before the report;
    a small input: none. GPUSCOPE_PROGRESS=1 draws it on a captured stderr."""
    from gpuscope import progress
    from gpuscope.cli import main

    src = RUNS[0] if kind == "record" else os.path.join(ROOT, "imbalanced", "kineto")
    monkeypatch.setenv("GPUSCOPE_PROGRESS", "1")
    assert main(["analyze", src, "--json", str(tmp_path / "small.json")]) == 0
    assert "reading" not in capsys.readouterr().err
    monkeypatch.setattr(progress, "BIG_FILES", 2)
    draws = []
    real = progress.advance
    monkeypatch.setattr(progress, "advance", lambda n: draws.append(n) or real(n))
    assert main(["analyze", src, "--json", str(tmp_path / "big.json")]) == 0
    err = capsys.readouterr().err
    name = os.path.basename(os.path.normpath(src))
    assert f"reading {name}" in err  # the bar was drawn
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(src) for f in fs
                if f.endswith((".jsonl", ".gz")))
    assert sum(draws) == total  # every byte counted once
    monkeypatch.setenv("GPUSCOPE_PROGRESS", "0")
    assert main(["analyze", src, "-q"]) == 0
    assert "reading" not in capsys.readouterr().err


def _group_waits_reference(frame, comm):
    """The split written with pandas group-bys: the oracle for the numpy one. Per key and step,
    among the ranks seen with the key, when all are there with one instance count."""
    from gpuscope.run_format import comm_kind, is_p2p

    keys = comm["key"].astype(str).tolist()
    keep = np.array([not is_p2p(comm_kind(k)) for k in keys], dtype=bool)
    if not keep.any():
        return None, 0
    c = comm.loc[keep, ["rank", "step", "exposed_ns", "count"]].copy()
    c["key"] = np.array(keys, dtype=object)[keep]
    members = c.groupby("key")["rank"].nunique()
    per = c.groupby(["key", "step", "rank"])[["exposed_ns", "count"]].sum().reset_index()
    by = per.groupby(["key", "step"])
    present = by["rank"].transform("size").to_numpy() == members.reindex(per["key"]).to_numpy()
    same = (by["count"].transform("min") == by["count"].transform("max")).to_numpy()
    mismatched = per[present & ~same][["key", "step"]].drop_duplicates().shape[0]
    per = per[present & same]
    per["wait"] = per["exposed_ns"] - per.groupby(["key", "step"])["exposed_ns"].transform("min")
    total = per.groupby(["rank", "step"])["wait"].sum()
    idx = pd.MultiIndex.from_arrays([frame["rank"].to_numpy(), frame["step"].to_numpy()])
    return total.reindex(idx).fillna(0).to_numpy(np.int64), mismatched


@pytest.mark.parametrize("path", ["grid", "sort"])
@pytest.mark.parametrize("seed", range(6))
def test_group_waits_match_the_pandas_reference(seed, path, monkeypatch):
    """Random collectives tables: 2 data-parallel groups, a tensor group, point-to-point,
    rec.phase("comm"), ranks missing in some steps, several collectives per step; on the
    (group, step, rank) grid and on the sorted table."""
    from gpuscope.analyze import wait as wait_mod
    from gpuscope.analyze.wait import _group_waits

    if path == "sort":
        monkeypatch.setattr(wait_mod, "small_range", lambda cells, n: False)
    taken = []
    for name in ("_dense_waits", "_sorted_waits"):
        real = getattr(wait_mod, name)
        monkeypatch.setattr(wait_mod, name, lambda *a, _r=real, _n=name: (
            out := _r(*a), taken.append(_n) if out is not None else None)[0])

    rng = np.random.default_rng(seed)
    ranks, steps = 8, 30
    frame = pd.DataFrame([(r, s) for r in range(ranks) for s in range(steps)],
                         columns=["rank", "step"])
    rows = []
    for r in range(ranks):
        for s in range(steps):
            if rng.random() < 0.05:
                continue  # this rank's collective missing in this step
            for key in (f"all_reduce:dp{r % 2}", f"all_gather:tp{r // 4}", "send_next:1",
                        "phase:comm"):
                for _ in range(int(rng.integers(1, 3))):
                    e = int(rng.integers(0, 5_000_000))
                    n = 2 if rng.random() < 0.05 else 1  # an extra instance on this rank
                    rows.append((r, s, key, e + 100, e, n))
    comm = pd.DataFrame(rows, columns=["rank", "step", "key", "comm_ns", "exposed_ns", "count"])
    for c in (comm, comm.assign(key=pd.Categorical(comm["key"]))):
        got, got_mismatched = _group_waits(frame, c)
        want, want_mismatched = _group_waits_reference(frame, c)
        assert np.array_equal(got, want)
        assert got.sum() > 0
        assert got_mismatched == want_mismatched > 0
    assert set(taken) == {"_dense_waits" if path == "grid" else "_sorted_waits"}


def test_shared_arena_carries_arrays_across_the_fork():
    """The child's arrays reach the parent through shared memory (slots, not bytes, in the
    pipe); what does not fit, holds objects or is empty travels pickled, unchanged."""
    from gpuscope.readers.fork import SharedArena, in_child, _Slot

    arena = SharedArena(1 << 16)
    arrays = [np.arange(10, dtype=np.int64), np.arange(12.0).reshape(3, 4)[:, 1],  # a view
              np.zeros(0), np.array(["a", None], dtype=object), np.arange(100_000)]
    with in_child(lambda: [arena.put(a) for a in arrays]) as collect:
        status, value = collect()
    assert status == "ok"
    assert [type(v) is _Slot for v in value] == [True, True, False, False, False]
    got = [arena.get(v) for v in value]
    for want, have in zip(arrays, got):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert list(have) == list(want)


SAMPLES = [os.path.join(ROOT, s, src) for s in ("imbalanced", "comm", "data", "compute")
           for src in ("record", "kineto")] + RUNS


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: "/".join(p.split(os.sep)[-3:]))
def test_the_plain_path_reads_what_the_fast_paths_read(path, monkeypatch):
    """One switch (readers/speed.py) turns every fast path off: no fork, no bulk decoder, no
    side file; the table is the same, and the fast paths were really off (spied)."""
    from gpuscope.readers import speed
    from gpuscope.readers.kineto import parse as kparse

    cols = spy_taken(monkeypatch, rec_reader, "read_columns")
    body = spy_taken(monkeypatch, rec_reader, "decode_body")
    fast = read_path(path)
    if path.endswith("record"):  # a bulk path read every rank file
        n = len([f for f in os.listdir(path) if f.endswith(".jsonl")])
        assert len(cols) == n and sum(cols) + sum(body) == n  # side file, else typed rows
    cols.clear(), body.clear()
    with speed.plain():
        assert not speed.forks() and not speed.bulk()
        plain = read_path(path)
    assert cols == [] and body == []
    assert speed.bulk()  # back on after the block
    pd.testing.assert_frame_equal(fast.frame, plain.frame)
    if fast.comm is not None:
        pd.testing.assert_frame_equal(fast.comm.reset_index(drop=True),
                                      plain.comm.reset_index(drop=True))
    assert fast.warnings == plain.warnings
    assert kparse.forks is speed.forks  # the trace reader asks the same switch
