"""A record file's step rows from its column side file (run_format), without decoding JSON.

The side file is used only when it accounts for the record file's whole body: its chunks
follow each other from the end of the header to the end of the file, each chunk's own crc32
matches its body, and the record file's bytes it stands for match their crc32, checked unless
the record file is unchanged since the side file was written (record_file.py), where only its
side records' lines are read.
Its values then pass the same range checks as the JSON path's typed decoder. Anything else (no side file, a cut or damaged one, a
record file longer than it covers after a kill, a value out of range, a repeated step) returns
None, and the record file's JSON is decoded as before: the side file only ever saves time.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import msgspec
import numpy as np

try:  # ISA-L's crc32: the same checksum as zlib's, 4x its speed here (benchmarks: bench_scale)
    from isal.isal_zlib import crc32
except ImportError:  # no wheel for this platform: zlib's
    from zlib import crc32

from ..run_format import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_MAGIC_V1, STEP_COLUMNS, columns_path
from .record_body import Body, block_columns, block_of
from .record_file import RecordBytes
from .validate import MAX_NS, column_bounds

_HEAD = struct.Struct(CHUNK_HEADER)
_WIDTH = len(STEP_COLUMNS)
_LO, _HI = (np.array(b, np.int64) for b in zip(*map(column_bounds, STEP_COLUMNS)))
_MAX_SAMPLES = 1 << 40
_keys = msgspec.json.Decoder(list[str]).decode
_decode = msgspec.json.Decoder().decode


class _Unfit(Exception):
    """The side file does not account for the record file: decode the JSON."""


def read_columns(path: str, record, start: int, columns: list, rank: int,
                 place=None) -> Body | None:
    """The body of the record file `path` (its bytes: a RecordBytes, or bytes; the body from
    `start`) from its column side file, or None when there is none or it does not account for
    the body. `place`: where the columns go (record_body.block_of)."""
    if list(columns) != list(STEP_COLUMNS):
        return None
    if not isinstance(record, RecordBytes):
        record = RecordBytes(record, len(record), path)
    try:
        with open(columns_path(path), "rb") as fh:
            side = fh.read()
    except OSError:
        return None
    try:
        return _read(side, record, start, rank, place)
    except (_Unfit, struct.error, ValueError, IndexError, OSError, msgspec.MsgspecError):
        return None


class Head(NamedTuple):
    """A chunk's header (CHUNK_HEADER): its layout, the record file's bytes it stands for
    [off, off + length) and their crc32, the lines they hold, its rows, collectives, side lines
    and key bytes, and its body's own crc32."""
    magic: bytes
    off: int
    length: int
    crc: int
    lines: int
    n: int
    n_comm: int
    n_side: int
    n_keys: int
    own: int


def _accounts(head: Head, body, record: RecordBytes) -> bool:
    """Whether a chunk stands for the record file's bytes its header names: its body's own
    crc32 matches (a chunk of CHUNK_MAGIC), and the record file's bytes match theirs, checked
    where the record file is not trusted (record_file.py); a chunk of the first layout
    (CHUNK_MAGIC_V1) has one crc32 over both, always checked."""
    def record_crc() -> int:  # the whole file read where it has not been
        return crc32(memoryview(record.whole())[head.off:head.off + head.length])

    if head.magic == CHUNK_MAGIC:
        return crc32(body) == head.own and (record.trusted or record_crc() == head.crc)
    return head.magic == CHUNK_MAGIC_V1 and not head.own and \
        crc32(body, record_crc()) == head.crc


def _read(side: bytes, record: RecordBytes, start: int, rank: int, place=None) -> Body:
    if not side or len(side) % 8:
        raise _Unfit
    words = np.frombuffer(side, "<i8")
    unpack, side_ = _HEAD.unpack_from, memoryview(side)
    size, pos, at, line = len(side), 0, start, 2
    rows, samples, comm, places = [], [], [], []
    n_rows = 0
    while pos < size:
        head = Head(*unpack(side, pos))
        _, off, length, _, lines, n, n_comm, n_side, n_keys, _ = head
        w = (pos + _HEAD.size) // 8
        end = 8 * (w + n * (_WIDTH + 1) + 5 * n_comm + 3 * n_side) + n_keys
        if off != at or lines != n + n_side or end > size or off + length > record.size or \
                not _accounts(head, side_[pos + _HEAD.size:end], record):
            raise _Unfit
        rows.append(words[w:w + n * _WIDTH])
        w += n * _WIDTH
        samples.append(words[w:w + n])
        w += n
        if n_comm:
            keys = _keys(side[end - n_keys:end])
            comm.append((n_rows, n, words[w:w + 5 * n_comm], keys))
        w += 5 * n_comm
        if n_side:  # (line in the chunk, offset in its lines, length): decoded from the record
            for i, rel, size_ in words[w:w + 3 * n_side].reshape(-1, 3).tolist():
                if not 0 <= rel <= rel + size_ <= length or not 0 <= i < lines:
                    raise _Unfit
                places.append((line + i, off + rel, size_))
        pos = end
        n_rows += n
        line += lines
        at = off + length
    if at != record.size:  # lines after the last chunk (a killed run): decode the JSON
        raise _Unfit
    return _body(rows, samples, comm, _side_records(record, places), n_rows, rank, place)


def _side_records(record: RecordBytes, places: list) -> list:
    """[(line number, side record)] from the record file's lines at `places` ((line, offset,
    length) each): each must be a JSON object."""
    out = []
    texts = record.pieces([(o, n) for _, o, n in places])
    for (i, _, _), text in zip(places, texts):
        obj = _decode(text)
        if type(obj) is not dict:
            raise _Unfit
        out.append((i, obj))
    return out


def _body(rows: list, samples: list, comm: list, side_records: list, n: int, rank: int,
          place=None) -> Body:
    """Body as record_body.decode_body makes it, from the chunks' arrays: the same values
    checked against the same ranges."""
    arr = np.concatenate(rows).reshape(n, _WIDTH) if n else np.empty((0, _WIDTH), np.int64)
    block = block_of(arr, rank, place)
    values = block[1:]
    if n and ((values.min(axis=1) < _LO).any() or (values.max(axis=1) > _HI).any()):
        raise _Unfit
    steps = block[1]
    if n > 1 and not (steps[1:] > steps[:-1]).all() and np.unique(steps).size < n:
        raise _Unfit  # a step repeated: the careful path keeps the first and counts the rest
    cols = block_columns(block)
    if n:
        per_row = np.concatenate(samples)
        if per_row.min() < -1 or per_row.max() > _MAX_SAMPLES:
            raise _Unfit
        if per_row.max() >= 0:
            cols["samples"] = per_row
    ends = [arr[0].tolist(), arr[-1].tolist()] if n else []
    return Body(cols, _collectives(comm, steps), side_records, ends, n, coded=True, block=block)


def _collectives(parts: list, steps: np.ndarray) -> tuple | None:
    """(steps, distinct keys, each collective's index into them, values), as record_body.coded:
    keys in order of first appearance, collectives in row order."""
    if not parts:
        return None
    table = np.concatenate([p[2] for p in parts]).reshape(-1, 5)
    counts = [len(p[2]) // 5 for p in parts]
    base = np.repeat(np.array([p[0] for p in parts], np.int64), counts)
    size = np.repeat(np.array([p[1] for p in parts], np.int64), counts)
    row = table[:, 0]
    if (row < 0).any() or (row >= size).any():
        raise _Unfit
    row = row + base
    if (row[1:] < row[:-1]).any():
        raise _Unfit  # collectives out of row order
    vals = np.ascontiguousarray(table[:, 2:])
    if vals.min() < 0 or vals.max() > MAX_NS:
        raise _Unfit
    first = parts[0][3]
    if all(p[3] == first for p in parts):  # the same keys in every chunk: codes as they are
        names, codes = list(first), table[:, 1].copy()
        if (codes < 0).any() or (codes >= len(names)).any():
            raise _Unfit
    else:
        index: dict[str, int] = {}
        remap = []
        for p in parts:
            local = np.array([index.setdefault(k, len(index)) for k in p[3]], np.int64)
            code = p[2].reshape(-1, 5)[:, 1]
            if (code < 0).any() or (code >= len(local)).any():
                raise _Unfit
            remap.append(local[code])
        names, codes = list(index), np.concatenate(remap)
    if len(set(names)) != len(names):
        raise _Unfit
    return steps[row], names, codes, vals
