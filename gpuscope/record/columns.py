"""Chunks of the column side file (run_format: ``rank-N.gpuscope.cols``), made on the writer
thread from the lines it has just appended to the record file: standard library only."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from itertools import chain
from operator import itemgetter

from ..run_format import CHUNK_HEADER, CHUNK_MAGIC, STEP_COLUMNS

_HEAD = struct.Struct(CHUNK_HEADER)
_WIDTH = len(STEP_COLUMNS)
_EXTRA_KEYS = {"_comm", "_samples"}
_fixed = itemgetter(slice(0, _WIDTH))
_formats: dict[int, struct.Struct] = {}


def _pack(count: int, values: list) -> bytes:
    """`count` ints as little-endian int64 (struct.error for anything that is not one)."""
    fmt = _formats.get(count)
    if fmt is None:
        if len(_formats) >= 64:  # batch sizes vary little (flush_rows, a live exchange's)
            _formats.clear()
        fmt = _formats[count] = struct.Struct(f"<{count}q")
    return fmt.pack(*values)


class Chunk:
    """The batches of lines written since the last chunk, as columns. `add_rows` / `add_side`
    take each batch right after it is in the record file; `full` says when to write the chunk
    (`to_bytes`) and start the next one at the record file's new end."""

    MAX_ROWS = 2048  # rows held before the chunk is written (~340 KB of columns at most)

    def __init__(self, offset: int):
        self.offset, self.length, self.lines = offset, 0, 0
        self._crc = 0
        self._rows: list[bytes] = []  # the rows' values, packed little-endian int64 per batch
        self._samples, self._comm, self._side = array("q"), array("q"), array("q")
        self._keys: dict[str, int] = {}
        self.n_rows = 0

    @property
    def full(self) -> bool:
        return self.n_rows >= self.MAX_ROWS

    def add_side(self, data: bytes) -> None:
        """Side records (knobs, NVML samples, the end record): the reader decodes their lines
        from the record file; the chunk holds where they are."""
        at = 0
        for line in data.split(b"\n")[:-1]:
            self._side.extend((self.lines, self.length + at, len(line)))
            self.lines += 1
            at += len(line) + 1
        self._grow(data)

    def add_rows(self, rows: list, data: bytes) -> bool:
        """Step `rows`, written to the record file as `data`; False when a row does not fit the
        columns exactly (named phases, a value that is not an int64, ...): the side file then
        ends, and readers decode the JSON. Runs on the training thread at each flush (writer.py):
        one pass over the values in C where it can."""
        n = len(rows)
        if data.count(b"\n") != n or set(map(type, rows)) != {list}:
            return False
        plain = set(map(len, rows)) == {_WIDTH}  # no row has a trailing object
        values = list(chain.from_iterable(rows if plain else map(_fixed, rows)))
        if len(values) != n * _WIDTH:
            return False
        # struct takes ints (no float, no str, nothing past int64) ~3x faster than array("q")
        # does, but takes a bool as 0/1: a bool is in the JSON as true/false, so only a batch
        # whose text has a "t" or an "f" (memchr; rows of numbers have neither) is looked at
        # value by value
        if (b"t" in data or b"f" in data) and bool in set(map(type, values)):
            return False
        try:
            packed = _pack(n * _WIDTH, values)
        except struct.error:
            return False
        samples, comm, keys = array("q", [-1]) * n, [], self._keys
        for i, row in enumerate(rows) if not plain else ():
            if len(row) == _WIDTH:
                continue
            extra = row[_WIDTH] if len(row) == _WIDTH + 1 else None
            if type(extra) is not dict or not extra.keys() <= _EXTRA_KEYS:
                return False
            if "_samples" in extra:
                s = extra["_samples"]
                if type(s) is not int or not 0 <= s < 1 << 63:
                    return False
                samples[i] = s
            by_key = extra.get("_comm", {})
            if type(by_key) is not dict:
                return False
            for key, vals in by_key.items():
                if type(key) is not str or type(vals) is not list or len(vals) != 3:
                    return False
                comm += (self.n_rows + i, keys.setdefault(key, len(keys)), *vals)
        if comm and set(map(type, comm)) != {int}:
            return False
        try:
            self._comm.extend(comm)
        except OverflowError:  # past int64 (False ends the side file: no rollback needed)
            return False
        self._rows.append(packed)
        self._samples += samples
        self.n_rows += n
        self.lines += n
        self._grow(data)
        return True

    def _grow(self, data: bytes) -> None:
        self._crc = zlib.crc32(data, self._crc)
        self.length += len(data)

    def to_bytes(self) -> bytes:
        """The chunk: its header, then its columns; one crc32 covers the record file's bytes,
        the other the columns."""
        parts = [self._samples, self._comm, self._side]
        if sys.byteorder == "big":
            for a in parts:
                a.byteswap()
        names = json.dumps(list(self._keys), separators=(",", ":")).encode() if self._keys \
            else b""
        names += b" " * (-len(names) % 8)  # chunks stay 8-byte aligned: the file reads as int64
        body = b"".join(self._rows + [a.tobytes() for a in parts] + [names])
        return _HEAD.pack(CHUNK_MAGIC, self.offset, self.length, self._crc, self.lines,
                          self.n_rows, len(self._comm) // 5, len(self._side) // 3, len(names),
                          zlib.crc32(body)) + body
