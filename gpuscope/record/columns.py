"""Chunks of the column side file (record_format: ``rank-N.gpuscope.cols``), made on the writer
thread from the lines it has just appended to the record file: standard library only."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array

from ..record_format import CHUNK_HEADER, CHUNK_MAGIC, STEP_COLUMNS

_HEAD = struct.Struct(CHUNK_HEADER)
_WIDTH = len(STEP_COLUMNS)
_EXTRA_KEYS = {"_comm", "_samples"}


class Chunk:
    """The batches of lines written since the last chunk, as columns. `add_rows` / `add_side`
    take each batch right after it is in the record file; `full` says when to write the chunk
    (`to_bytes`) and start the next one at the record file's new end."""

    MAX_ROWS = 2048  # rows held before the chunk is written (~340 KB of columns at most)

    def __init__(self, offset: int):
        self.offset, self.length, self.lines = offset, 0, 0
        self._crc = 0
        self._rows, self._samples, self._comm, self._side = array("q"), array("q"), array("q"), \
            array("q")
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
        ends, and readers decode the JSON."""
        if data.count(b"\n") != len(rows):
            return False
        flat, samples, comm = array("q"), array("q"), array("q")
        keys, base = self._keys, self.n_rows
        try:
            for i, row in enumerate(rows, base):
                if type(row) is not list:
                    return False
                if len(row) == _WIDTH + 1:
                    extra = row[_WIDTH]
                    if type(extra) is not dict or not extra.keys() <= _EXTRA_KEYS:
                        return False
                    n = extra.get("_samples", -1)
                    if type(n) is not int or (n < 0 and "_samples" in extra):
                        return False
                    samples.append(n)
                    by_key = extra.get("_comm", {})
                    if type(by_key) is not dict:
                        return False
                    for key, vals in by_key.items():
                        if type(key) is not str or len(vals) != 3 or \
                                not all(type(v) is int for v in vals):
                            return False
                        comm.extend((i, keys.setdefault(key, len(keys)), *vals))
                elif len(row) == _WIDTH:
                    samples.append(-1)
                else:
                    return False
                values = row[:_WIDTH]
                if not all(type(v) is int for v in values):  # bool, float, str: not columns
                    return False
                flat.extend(values)
        except (OverflowError, TypeError):  # past int64, or not a list of three
            return False
        self._rows += flat
        self._samples += samples
        self._comm += comm
        self.n_rows += len(rows)
        self.lines += len(rows)
        self._grow(data)
        return True

    def _grow(self, data: bytes) -> None:
        self._crc = zlib.crc32(data, self._crc)
        self.length += len(data)

    def to_bytes(self) -> bytes:
        """The chunk: its header, then its columns; the crc32 covers the record file's bytes
        and then the columns."""
        parts = [self._rows, self._samples, self._comm, self._side]
        if sys.byteorder == "big":
            for a in parts:
                a.byteswap()
        names = json.dumps(list(self._keys), separators=(",", ":")).encode() if self._keys \
            else b""
        names += b" " * (-len(names) % 8)  # chunks stay 8-byte aligned: the file reads as int64
        body = b"".join([a.tobytes() for a in parts] + [names])
        return _HEAD.pack(CHUNK_MAGIC, self.offset, self.length, zlib.crc32(body, self._crc),
                          self.lines, self.n_rows, len(self._comm) // 5, len(self._side) // 3,
                          len(names), 0) + body
