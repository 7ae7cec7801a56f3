"""A record file's bytes, read whole only where they must be.

A record file with its column side file (run_format) is taken from the side file; its own bytes
are then needed for two things: the side records' lines, which the side file points to, and the
check that the side file stands for them. That check is made in full (each chunk's crc32 over
the record file's bytes it stands for) unless the record file was last written no later than
its side file, which the writer appends to after the lines a chunk stands for: an edit of the
record file, or lines appended after a kill, make it newer (a copy that does not keep the times
may too; it is then checked in full). The side file's chunks are then checked against their own
crc32 and the record file's size, as rsync's quick check and git's index trust a file's size and
time, and only the record file's head (its header line), its tail (the end record) and its other
side records' lines are read: half of a big run dir's bytes. An edit within one tick of the
clock that stamps files after the run closed is not seen. The record file is read whole
wherever anything does not fit.
"""

from __future__ import annotations

import os

from ..run_format import columns_path

#: bytes read first from a record file: its header line (the knobs) fits in them
HEAD_BYTES = 64 << 10
#: bytes read from its end: its end record (and the last NVML samples) fit in them
TAIL_BYTES = 64 << 10
#: side records' lines read one by one at most; more, and the whole file is read
PIECES_MAX = 8


def unchanged_since_side(path: str) -> bool:
    """Whether the record file `path` was last written no later than its side file."""
    try:
        return os.stat(path).st_mtime_ns <= os.stat(columns_path(path)).st_mtime_ns
    except OSError:
        return False


class RecordBytes:
    """The bytes of a record file: whole, or (`head`) its header line and its last TAIL_BYTES
    (where the end record lies) at first, its other bytes read where asked (`pieces`) or all
    at once where they must all be looked at (`whole`). `trusted`: the side file may stand for
    the rest without its bytes being read."""

    def __init__(self, data: bytes, size: int, path: str | None = None, trusted: bool = False,
                 tail: bytes = b""):
        self.data, self.size, self.path, self.trusted = data, size, path, trusted
        self.tail, self.tail_at = tail, size - len(tail)

    @classmethod
    def read(cls, path: str, head: bool = False) -> "RecordBytes":
        """The file (OSError where it cannot be read); `head`: its header line (the first
        line, up to the file's end) and what came with it, and its tail."""
        with open(path, "rb") as fh:
            if not head:
                data = fh.read()
                return cls(data, len(data), path)
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(HEAD_BYTES)
            while b"\n" not in data and len(data) < size:
                more = fh.read(max(len(data), HEAD_BYTES))
                if not more:
                    break
                data += more
            size = max(size, len(data))
            at = max(size - TAIL_BYTES, len(data))
            tail = os.pread(fh.fileno(), size - at, at) if at < size else b""
        return cls(data, size, path, trusted=True, tail=tail)

    @property
    def is_whole(self) -> bool:
        return len(self.data) >= self.size

    def _load(self) -> bytes:
        if not self.is_whole:
            with open(self.path, "rb") as fh:
                self.data = fh.read()
            self.size, self.tail, self.tail_at = len(self.data), b"", len(self.data)
        return self.data

    def whole(self) -> bytes:
        """Every byte of the file (read now where only its head was), and the file no longer
        trusted without its bytes."""
        self.trusted = False
        return self._load()

    def _held(self, offset: int, length: int) -> bytes | None:
        if offset + length <= len(self.data) or self.is_whole:
            return self.data[offset:offset + length]
        if offset >= self.tail_at:
            return self.tail[offset - self.tail_at:offset - self.tail_at + length]
        return None

    def pieces(self, spans: list) -> list[bytes]:
        """The bytes [offset, offset + length) of each (offset, length) of `spans` (b"" past
        the end): from the head and the tail, else read where they lie, the file opened once
        (read whole where more than PIECES_MAX lie elsewhere: a run's NVML samples, every
        flush or so, are fewer reads that way)."""
        held = [self._held(o, n) for o, n in spans]
        missing = [i for i, h in enumerate(held) if h is None]
        if len(missing) > PIECES_MAX:
            self._load()
            return [self.data[o:o + n] for o, n in spans]
        if missing:
            with open(self.path, "rb") as fh:
                for i in missing:
                    held[i] = os.pread(fh.fileno(), spans[i][1], spans[i][0])
        return held
