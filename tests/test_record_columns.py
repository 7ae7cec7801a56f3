"""The column side file (rank-N.gpuscope.cols): the writer thread appends a chunk per batch, the
reader takes the step rows from it without decoding JSON, and gets exactly what decoding the JSON
gives; whenever it does not account for the record file (damaged, cut, stale, lying about a
value), the JSON is decoded as before. A record file unchanged since its side file was written
is read only where its side records lie (readers/record_file.py)."""

from __future__ import annotations

import glob
import os
import shutil
import struct
import zlib

import numpy as np
import pandas as pd
import pytest

from helpers import spy_taken

from gpuscope.readers import read_path
from gpuscope.readers.rundir import rank_file as rec_reader
from gpuscope.record.columns import Chunk
from gpuscope.record.writer import RecordWriter
from gpuscope.run_format import (CHUNK_HEADER, CHUNK_MAGIC, CHUNK_MAGIC_V1, COLUMNS_SUFFIX,
                                 COMM_KEY, SCHEMA, STEP_COLUMNS, columns_path)

W = len(STEP_COLUMNS)
T0 = 1_790_000_000_000_000_000


def _row(step, comm=None, samples=None, synced=1):
    start = T0 + step * 50_000_000
    row = [step, start, 50_000_000, 2_000_000 + step, 40_000_000, 9_000_000, 3_000_000 + step,
           5_000_000 - step, 10_000_000, 25_000_000, 5_000_000, len(comm or {}), 100_000,
           synced, 7]
    extra = {}
    if comm:
        extra["_comm"] = comm
    if samples is not None:
        extra["_samples"] = samples
    return row + [extra] if extra else row


def _write(run_dir, rank=0, batches=None, end=True, **header):
    """A record file written by the real RecordWriter (its thread, its side file)."""
    w = RecordWriter(str(run_dir), rank)
    w.write_header({"schema": SCHEMA, "rank": rank, "world_size": 2, "host": "h", "pid": 1,
                    "run_id": "t", "recording": 1, "start_unix_ns": T0,
                    "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
                    "knobs": {"world_size": 2, "backend": "gloo", "device": "cpu"}, **header})
    w.add_meta({"knobs": {"loader": "DataLoader", "num_workers": 2, "batch_size": 8},
                "at_step": 0})
    for batch in batches if batches is not None else _batches(rank):
        if isinstance(batch, dict):
            w.add_meta(batch)
        else:
            w.add_rows(batch)
    w.close({"steps": 40, "crashed": False} if end else None)
    assert w.error is None
    return w.path


def _batches(rank):
    """Rows with every shape the recorder writes: collectives under two keys whose order
    changes, a key that appears late, no_sync micro-steps without collectives, a smaller last
    batch, side records between batches."""
    ddp = "all_reduce:ddp"
    out, step = [], 0
    for b in range(5):
        rows = []
        for _ in range(8):
            if step % 4 == 3:
                rows.append(_row(step, synced=0))  # no_sync: nothing communicated
            elif step % 2:
                rows.append(_row(step, {"broadcast:0": [1000 + step, 0, 1],
                                        ddp: [9_000_000 + rank, 3_000_000, 4]}))
            else:
                comm = {ddp: [9_000_000 + step, 3_000_000, 4]}
                if b >= 3:
                    comm[f"all_gather:{rank}"] = [2000, 1000 + step, 2]
                rows.append(_row(step, comm))
            step += 1
        out.append(rows)
        if b == 1:
            out.append({"nvml": [[T0, 50, 1, 2, 100.0, 1000, 50, 0]]})
    out[-1][-1] = _row(step - 1, {ddp: [1, 1, 1]}, samples=3)  # a smaller last batch
    return out


def _read(run_dir, json_only=False):
    """read_path on the run dir; `json_only`: the side files hidden, so the JSON is decoded."""
    if json_only:
        hidden = str(run_dir) + "-json"
        shutil.copytree(run_dir, hidden, dirs_exist_ok=True)
        for p in glob.glob(os.path.join(hidden, "*" + COLUMNS_SUFFIX)):
            os.remove(p)
        return read_path(hidden)
    return read_path(str(run_dir))


def _spy(monkeypatch) -> list:
    """Records, per file, whether the side file was taken."""
    return spy_taken(monkeypatch, rec_reader, "read_columns")


def _same(a, b):
    pd.testing.assert_frame_equal(a.frame, b.frame)
    pd.testing.assert_frame_equal(a.comm, b.comm)
    assert a.warnings == b.warnings
    assert (a.telemetry is None) == (b.telemetry is None)
    if a.telemetry is not None:
        pd.testing.assert_frame_equal(a.telemetry, b.telemetry)
    assert {k: r.knobs for k, r in a.ranks.items()} == {k: r.knobs for k, r in b.ranks.items()}


def test_side_file_gives_what_the_json_gives(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for rank in (0, 1):
        _write(run, rank)
    assert sorted(os.listdir(run)) == ["rank-00000.gpuscope.cols", "rank-00000.gpuscope.jsonl",
                                       "rank-00001.gpuscope.cols", "rank-00001.gpuscope.jsonl"]
    seen = _spy(monkeypatch)
    fast = _read(run)
    assert seen == [True, True]
    slow = _read(run, json_only=True)
    assert seen == [True, True, False, False]
    _same(fast, slow)
    assert set(fast.comm["key"]) >= {"all_reduce:ddp", "broadcast:0", "all_gather:0"}
    assert "samples" in fast.frame and fast.frame["samples"].max() == 3
    assert len(fast.frame) == 80


def test_a_real_recording_writes_side_files_read_as_the_json(scenario_run, monkeypatch):
    """A real 2-rank DDP recording (torchrun, gloo): its side files are taken, and the table
    equals the one decoded from its JSON."""
    run = scenario_run("comm")
    assert len(glob.glob(os.path.join(run, "*" + COLUMNS_SUFFIX))) == 2
    seen = _spy(monkeypatch)
    fast = read_path(run)
    assert seen == [True, True]
    _same(fast, _read(run, json_only=True))
    assert fast.comm is not None and len(fast.comm) > 0


HEAD = struct.Struct(CHUNK_HEADER)


def _chunks(side: bytes) -> list[int]:
    """Where each chunk of a side file starts."""
    out, pos = [], 0
    while pos < len(side):
        out.append(pos)
        _, _, _, _, _, n, n_comm, n_side, n_keys, _ = HEAD.unpack_from(side, pos)
        pos += HEAD.size + 8 * (n * (W + 1) + 5 * n_comm + 3 * n_side) + n_keys
    assert pos == len(side)
    return out


def _resealed(side: bytearray, blob: bytes, at: int) -> bytearray:
    """The chunk at `at` given the crc32 its changed body now has (a side file that lies but
    is internally consistent: what a writer bug would leave)."""
    magic, off, length, crc, lines, n, n_comm, n_side, n_keys, _ = HEAD.unpack_from(side, at)
    end = at + HEAD.size + 8 * (n * (W + 1) + 5 * n_comm + 3 * n_side) + n_keys
    own = zlib.crc32(bytes(side[at + HEAD.size:end]))
    HEAD.pack_into(side, at, magic, off, length, crc, lines, n, n_comm, n_side, n_keys, own)
    return side


def _edited_later(path):
    """The file's time a second past its side file's: an edit made after the run (a test
    runs within one tick of the clock that stamps files)."""
    later = os.stat(columns_path(path)).st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(later, later))


def _damage(kind, jsonl, cols):
    blob, side = bytearray(open(jsonl, "rb").read()), bytearray(open(cols, "rb").read())
    chunks = _chunks(bytes(side))
    assert len(chunks) >= 3  # Chunk.MAX_ROWS is 8 in these tests
    first_rows = chunks[1] + HEAD.size
    if kind == "record_byte_changed":
        at = blob.index(b",", len(blob) // 2) + 1  # a digit of a row in the middle
        blob[at] = ord("9") if blob[at] != ord("9") else ord("8")
    elif kind == "record_longer":  # rows written after the side file's last chunk (a kill)
        blob += (b'[40,' + str(T0).encode() + b',1,1,1,1,1,1,1,1,1,0,1,1,0]\n')
    elif kind == "side_cut":
        side = side[:len(side) - 16]
    elif kind == "side_value_changed":  # one bit of a value: the crc no longer matches
        side[first_rows + 8 * 3] ^= 0x10
    elif kind == "side_value_out_of_range":  # consistent but lying: data_ns of a row -5
        side[first_rows + 8 * 3:first_rows + 8 * 4] = (-5).to_bytes(8, "little", signed=True)
        side = _resealed(side, bytes(blob), chunks[1])
    elif kind == "side_collective_out_of_order":  # consistent, collectives not in row order
        _, _, _, _, _, n, n_comm, _, _, _ = HEAD.unpack_from(side, chunks[1])
        comm = first_rows + 8 * n * (W + 1)
        assert n_comm >= 2
        side[comm:comm + 8] = (n - 1).to_bytes(8, "little")
        side = _resealed(side, bytes(blob), chunks[1])
    elif kind == "side_garbage":
        side = bytearray(b"\x00" * 64)
    elif kind == "chunk_missing":  # a chunk taken out: the offsets no longer follow
        side = side[:chunks[1]] + side[chunks[2]:]
    elif kind == "side_empty":
        side = bytearray()
    if side != open(cols, "rb").read():
        open(cols, "wb").write(bytes(side))
    if blob != open(jsonl, "rb").read():  # edited after the run
        open(jsonl, "wb").write(bytes(blob))
        _edited_later(jsonl)


@pytest.mark.parametrize("kind", ["record_byte_changed", "record_longer", "side_cut",
                                  "side_value_changed", "side_value_out_of_range",
                                  "side_collective_out_of_order", "side_garbage",
                                  "chunk_missing", "side_empty"])
def test_a_side_file_that_does_not_account_for_the_record_is_not_used(tmp_path, monkeypatch,
                                                                       kind):
    monkeypatch.setattr(Chunk, "MAX_ROWS", 8)
    run = tmp_path / "run"
    for rank in (0, 1):
        _write(run, rank)
    jsonl = str(run / "rank-00001.gpuscope.jsonl")
    _damage(kind, jsonl, columns_path(jsonl))
    seen = _spy(monkeypatch)
    got = _read(run)
    assert seen == [True, False]  # rank 0's is intact; rank 1's is declined
    _same(got, _read(run, json_only=True))
    if kind == "side_value_out_of_range":
        assert got.frame["data_ns"].min() >= 0


@pytest.mark.parametrize("crc", ["installed", "zlib"])
def test_the_checksum_is_zlib_s_crc32_whichever_library_computes_it(tmp_path, monkeypatch, crc):
    """ISA-L's crc32 (a dependency where it has wheels) and zlib's (elsewhere) take the same
    side files and decline the same damage."""
    from gpuscope.readers import record_columns

    if crc == "zlib":
        monkeypatch.setattr(record_columns, "crc32", zlib.crc32)
    else:
        assert record_columns.crc32 is not zlib.crc32  # isal is installed with the package here
        assert record_columns.crc32(b"gpuscope", 7) == zlib.crc32(b"gpuscope", 7)
    monkeypatch.setattr(Chunk, "MAX_ROWS", 8)
    run = tmp_path / "run"
    for rank in (0, 1):
        _write(run, rank)
    seen = _spy(monkeypatch)
    _same(_read(run), _read(run, json_only=True))
    jsonl = str(run / "rank-00001.gpuscope.jsonl")
    _damage("record_byte_changed", jsonl, columns_path(jsonl))
    got = _read(run)
    assert seen == [True, True, False, False, True, False]
    _same(got, _read(run, json_only=True))


def test_many_chunks_read_as_one(tmp_path, monkeypatch):
    """Chunks of 8 rows (side records inside some, a collective key that first appears in a
    later chunk): the same table as the JSON."""
    monkeypatch.setattr(Chunk, "MAX_ROWS", 8)
    run = tmp_path / "run"
    path = _write(run, 0)
    assert len(_chunks(open(columns_path(path), "rb").read())) == 6
    seen = _spy(monkeypatch)
    got = _read(run)
    assert seen == [True]
    _same(got, _read(run, json_only=True))
    assert list(dict.fromkeys(got.comm["key"])) == ["all_reduce:ddp", "broadcast:0",
                                                    "all_gather:0"]


def test_rows_the_columns_cannot_hold_end_the_side_file(tmp_path, monkeypatch):
    """A named phase (a user's rec.phase("eval")) is not a column: the writer removes the side
    file, and the reader decodes the JSON, which holds everything."""
    run = tmp_path / "run"
    batches = _batches(0)
    batches[3][1] = batches[3][1][:W] + [{"eval": 123, **batches[3][1][W]}]
    _write(run, 0, batches)
    assert os.listdir(run) == ["rank-00000.gpuscope.jsonl"]
    got = read_path(str(run))
    assert len(got.frame) == 40


@pytest.mark.parametrize("where,value", [(w, v) for w in ("column", "collective", "samples")
                                         for v in (True, 1.5, 1 << 64, "7")]
                         + [("samples", -2), ("collective", None)])
def test_values_that_are_not_int64_end_the_side_file(tmp_path, where, value):
    """What the JSON path's typed decoder would not take as it is (bool, float, past int64, a
    string; a negative batch size) is never put in a column: the writer ends the side file."""
    run = tmp_path / "run"
    batches = _batches(0)
    row = batches[1][2]  # step 10: collectives under one key
    if where == "column":
        row[4] = value
    elif where == "collective":
        row[W]["_comm"]["all_reduce:ddp"][1] = value
    else:
        row[W]["_samples"] = value
    _write(run, 0, batches)
    assert not glob.glob(str(run / ("*" + COLUMNS_SUFFIX)))
    read_path(str(run))  # the JSON path decides (a bad value is skipped and counted)


def test_a_killed_writer_leaves_a_side_file_that_is_declined(tmp_path, monkeypatch):
    """No end record and the side file one chunk short of the record file (killed between the
    two writes): the rows come from the JSON, with the usual warning that the run was cut."""
    run = tmp_path / "run"
    path = _write(run, 0, end=False)
    cols = columns_path(path)
    side = open(cols, "rb").read()
    open(cols, "wb").write(side[:side.rindex(CHUNK_MAGIC)])
    seen = _spy(monkeypatch)
    got = read_path(str(run))
    assert seen == [False]
    assert len(got.frame) == 40 and any("cut" in w for w in got.warnings)


def test_side_file_columns_are_int64_little_endian(tmp_path):
    row = _row(0, {"all_reduce:ddp": [5, 6, 7]})
    path = _write(tmp_path / "run", 0, [[row]])
    side = open(columns_path(path), "rb").read()
    magic, off, length, crc, lines, n, n_comm, n_side, n_keys, own = HEAD.unpack_from(side)
    blob = open(path, "rb").read()
    assert (magic, lines, n, n_comm, n_side) == (b"GSC2", 3, 1, 1, 2)
    assert off == blob.index(b"\n") + 1 and off + length == len(blob) and n_keys % 8 == 0
    body = np.frombuffer(side, "<i8", W + 1 + 5 + 6, HEAD.size)
    assert body[:W].tolist() == row[:W] and body[W] == -1
    assert body[W + 1:W + 6].tolist() == [0, 0, 5, 6, 7]
    knobs_line, end_line = (body[W + 6:W + 9].tolist(), body[W + 9:].tolist())
    assert knobs_line[0] == 0 and end_line[0] == 2  # the knobs before the row, the end after
    assert blob[off + end_line[1]:off + end_line[1] + end_line[2]].startswith(b'{"end"')
    assert side[len(side) - n_keys:].rstrip() == b'["all_reduce:ddp"]'
    assert zlib.crc32(blob[off:]) == crc and zlib.crc32(side[HEAD.size:]) == own


def _first_layout(cols, jsonl):
    """The side file rewritten in the first chunk layout (CHUNK_MAGIC_V1: one crc32 over the
    record file's bytes and the body), as gpuscope before 2026-12-07 wrote it."""
    side, blob = bytearray(open(cols, "rb").read()), open(jsonl, "rb").read()
    for at in _chunks(bytes(side)):
        _, off, length, _, lines, n, n_comm, n_side, n_keys, _ = HEAD.unpack_from(side, at)
        end = at + HEAD.size + 8 * (n * (W + 1) + 5 * n_comm + 3 * n_side) + n_keys
        crc = zlib.crc32(bytes(side[at + HEAD.size:end]), zlib.crc32(blob[off:off + length]))
        HEAD.pack_into(side, at, CHUNK_MAGIC_V1, off, length, crc, lines, n, n_comm, n_side,
                       n_keys, 0)
    open(cols, "wb").write(bytes(side))


def _reads(monkeypatch) -> list:
    """Records each record file read whole (RecordBytes.whole) by the reader."""
    from gpuscope.readers.record_file import RecordBytes

    whole, seen = RecordBytes.whole, []
    monkeypatch.setattr(RecordBytes, "whole",
                        lambda self: (seen.append(os.path.basename(self.path)), whole(self))[1])
    return seen


@pytest.mark.parametrize("pieces_max", [8, 0])
def test_a_record_file_older_than_its_side_file_is_read_where_its_side_records_lie(
        tmp_path, monkeypatch, pieces_max):
    """The record file unchanged since its side file was written: only its header and its side
    records' lines are read (not its rows, half of a run dir's bytes; the whole file where
    more than PIECES_MAX side records lie in its middle), the same table comes out, and a
    flipped bit of the side file is still caught by the chunk's own crc32."""
    from gpuscope.readers import record_file

    monkeypatch.setattr(Chunk, "MAX_ROWS", 8)
    # the NVML samples lie past the head and before the tail, the end record in the tail
    monkeypatch.setattr(record_file, "HEAD_BYTES", 512)
    monkeypatch.setattr(record_file, "TAIL_BYTES", 100)
    monkeypatch.setattr(record_file, "PIECES_MAX", pieces_max)
    run = tmp_path / "run"
    for rank in (0, 1):
        _write(run, rank)
    whole, taken = _reads(monkeypatch), _spy(monkeypatch)
    got = _read(run)
    assert taken == [True, True] and whole == []
    _same(got, _read(run, json_only=True))
    assert got.ranks[0].knobs["num_workers"] == 2 and got.telemetry is not None
    jsonl = str(run / "rank-00001.gpuscope.jsonl")
    _damage("side_value_changed", jsonl, columns_path(jsonl))
    assert os.stat(columns_path(jsonl)).st_mtime_ns >= os.stat(jsonl).st_mtime_ns
    del taken[:]
    got = _read(run)
    assert taken == [True, False]
    _same(got, _read(run, json_only=True))


def test_a_record_file_newer_than_its_side_file_is_checked_in_full(tmp_path, monkeypatch):
    """Touched after its side file (an edit, or a copy that wrote it last): read whole and
    checked byte for byte, and taken when its bytes are those the side file stands for."""
    run = tmp_path / "run"
    path = _write(run, 0)
    _edited_later(path)
    whole, taken = _reads(monkeypatch), _spy(monkeypatch)
    got = _read(run)
    assert taken == [True] and whole == [os.path.basename(path)]
    _same(got, _read(run, json_only=True))


def test_side_files_of_the_first_layout_are_checked_in_full(tmp_path, monkeypatch):
    """Side files written before the chunk had its own crc32 are still taken, always checked
    against the record file's bytes: a changed byte is caught however old the record file."""
    monkeypatch.setattr(Chunk, "MAX_ROWS", 8)
    run = tmp_path / "run"
    for rank in (0, 1):
        _write(run, rank)
    for rank in (0, 1):
        jsonl = str(run / f"rank-0000{rank}.gpuscope.jsonl")
        _first_layout(columns_path(jsonl), jsonl)
    taken = _spy(monkeypatch)
    got = _read(run)
    assert taken == [True, True]
    _same(got, _read(run, json_only=True))
    jsonl = str(run / "rank-00001.gpuscope.jsonl")
    blob = bytearray(open(jsonl, "rb").read())
    at = blob.index(b",", len(blob) // 2) + 1
    blob[at] = ord("9") if blob[at] != ord("9") else ord("8")
    old = os.stat(jsonl).st_mtime_ns
    open(jsonl, "wb").write(bytes(blob))
    os.utime(jsonl, ns=(old - 10**9, old - 10**9))  # older than its side file
    del taken[:]
    got = _read(run)
    assert taken == [True, False]
    _same(got, _read(run, json_only=True))


SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")


@pytest.mark.parametrize("name", ["data", "comm", "compute", "imbalanced", "parallel/hybrid",
                                  "parallel/pipeline"])
def test_sample_runs_read_the_same_from_side_files(tmp_path, monkeypatch, name):
    """The sample runs (real 2- and 4-rank recordings: DDP, pipeline stages with p2p, hybrid
    groups) with side files made from their lines by the writer's Chunk, in chunks of 8 rows:
    every file's side file is taken, and the table is the JSON's."""
    from helpers import add_side_files

    monkeypatch.setattr(Chunk, "MAX_ROWS", 8)
    run = tmp_path / "run"
    shutil.copytree(os.path.join(SAMPLES, name, "record"), run)
    made = add_side_files(str(run))
    n = len(glob.glob(str(run / "*.gpuscope.jsonl")))
    assert len(made) == n
    seen = _spy(monkeypatch)
    got = _read(run)
    assert seen == [True] * n
    _same(got, _read(run, json_only=True))


def test_rows_encode_as_json_dumps_does():
    # the writer encodes rows with orjson where it can, else one cached json encoder, not
    # json.dumps per row: the same bytes for the recorder's rows (integers, ASCII names), the
    # same values for anything else, the json encoder for what orjson refuses
    import json

    from gpuscope.record import writer
    from gpuscope.record.writer import encode_rows

    def std(rows):
        return ("\n".join(json.dumps(r, separators=(",", ":")) for r in rows) + "\n").encode()

    rows = [_row(1), _row(2, comm={"all_reduce:ddp": [5, 3, 1], "all_gather:tp": [9, 0, 4]},
                          samples=3), _row(3, synced=-1), _row(4) + [{"stage.1-e": 12}]]
    assert writer._fast_dumps()  # orjson is a dependency: the fast path is the one tested here
    assert encode_rows(rows) == std(rows)
    odd = [_row(5) + [{"vorwärts": 12}], [6, 2 ** 70], [7, {3: 4}], [8, 0.1, 1e16, True, None]]
    for row in odd:
        got = encode_rows([row])
        assert got.endswith(b"\n") and json.loads(got) == json.loads(std([row])), row
    assert encode_rows(odd[1:3]) == std(odd[1:3])  # refused by orjson: the json encoder's bytes


def _implied(rows):
    """The rows as the recorder writes them now: a "_comm" that only says what the row's own
    columns say ({comm_key: [comm_ns, comm_exposed_ns, n_comm]}) is left out."""
    out = []
    for row in rows:
        extra = dict(row[W]) if len(row) > W else {}
        if extra.get("_comm") == {COMM_KEY: [row[5], row[6], row[11]]}:
            del extra["_comm"]
        out.append(row[:W] + ([extra] if extra else []))
    return out


@pytest.mark.parametrize("way", ["side file", "bulk JSON", "plain"])
def test_a_row_without_its_breakdown_reads_as_the_header_s_comm_key(tmp_path, way):
    """Rows whose only collectives are DDP's carry no "_comm"; with the header's comm_key every
    path (side file, bulk decoder, line by line) reads the same collectives table as from rows
    that spell it out, mixed with rows that have other collectives and no_sync rows."""
    from gpuscope.readers import speed

    batches = []
    for b, rows in enumerate(_batches(0)):
        if isinstance(rows, dict):
            batches.append(rows)
            continue
        for i, row in enumerate(rows):
            if i % 3 == 0 and len(row) == W:  # a DDP-only row (sometimes several buckets)
                rows[i] = row[:11] + [1 + b % 2] + row[12:] + [
                    {"_comm": {COMM_KEY: [row[5], row[6], 1 + b % 2]}}]
        batches.append(rows)
    spelled = _write(tmp_path / "spelled", 0, batches, comm_key=COMM_KEY)
    short = _write(tmp_path / "short", 0, [b if isinstance(b, dict) else _implied(b)
                                           for b in batches], comm_key=COMM_KEY)
    assert os.path.getsize(short) < os.path.getsize(spelled)
    json_only = way != "side file"
    if way == "plain":
        with speed.plain():
            a, b = _read(tmp_path / "spelled", True), _read(tmp_path / "short", True)
    else:
        a, b = _read(tmp_path / "spelled", json_only), _read(tmp_path / "short", json_only)
    _same(a, b)
    ddp = a.comm[a.comm["key"] == COMM_KEY]
    assert len(ddp) == (a.frame["n_comm"] > 0).sum()  # every row with collectives had DDP's
    # without the header's key, nothing is implied: the short file's DDP-only rows lose theirs
    os.makedirs(tmp_path / "nokey")
    lines = open(short, "rb").read().split(b"\n")
    lines[0] = lines[0].replace(b',"comm_key":"all_reduce:ddp"', b"")
    open(tmp_path / "nokey" / os.path.basename(short), "wb").write(b"\n".join(lines))
    c = read_path(str(tmp_path / "nokey"))
    assert len(c.comm[c.comm["key"] == COMM_KEY]) < len(ddp)


def test_batches_queued_from_two_threads_keep_the_side_file_in_step(tmp_path, monkeypatch):
    """Rows from the training thread and side records from another thread (as a sink's might)
    queued at once, each batch joining the chunk as it is queued: the chunks still account for
    the record file byte for byte, and read as its JSON does."""
    import threading

    monkeypatch.setattr(Chunk, "MAX_ROWS", 16)  # full at 20 rows: batches of 5
    monkeypatch.setattr(RecordWriter, "MAX_PENDING", 10_000)  # nothing dropped on a busy core
    run = tmp_path / "run"
    w = RecordWriter(str(run), 0)
    w.write_header({"schema": SCHEMA, "rank": 0, "world_size": 1, "host": "h", "pid": 1,
                    "run_id": "t", "recording": 1, "start_unix_ns": T0,
                    "clock": "perf_counter_ns", "columns": list(STEP_COLUMNS),
                    "knobs": {"world_size": 1, "backend": "gloo", "device": "cpu"}})
    go = threading.Barrier(2)

    def side_records():
        go.wait()
        for i in range(300):
            w.add_meta({"nvml": [[T0 + i, 50, 1, 2, 100.0, 1000, 50, 0]]}, wake=i % 3 == 0)

    other = threading.Thread(target=side_records)
    other.start()
    go.wait()
    for b in range(60):
        w.add_rows([_row(s, {"all_reduce:ddp": [9_000_000, 3_000_000, 4]})
                    for s in range(b * 5, b * 5 + 5)], wake=b % 2 == 0)
    other.join()
    w.close({"steps": 300, "crashed": False})
    assert w.error is None and w.dropped == 0
    side = open(columns_path(w.path), "rb").read()
    assert len(_chunks(side)) == 300 // 20 + 1  # and the last: side lines, the end record
    seen = _spy(monkeypatch)
    got = _read(run)
    assert seen == [True]
    assert len(got.frame) == 300 and len(got.telemetry) == 300
    _same(got, _read(run, json_only=True))
