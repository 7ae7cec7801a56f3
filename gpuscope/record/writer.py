"""Writes one rank's record file (a header, then lines appended and flushed at once) and its
column side file (run_format)."""

from __future__ import annotations

import collections
import json
import os
import threading
import time

from ..run_format import columns_path, rank_file_name
from .columns import Chunk

MAX_RECORDINGS = 10_000


#: one encoder for every line: json.dumps with arguments builds a new one per call, which was
#: most of the time a batch took (126 us for 16 rows, 38 with this one).
_encoder = json.JSONEncoder(separators=(",", ":"), default=str)


def _dumps(obj) -> str:
    return _encoder.encode(obj)


_orjson = None  # orjson.dumps, or False where it cannot be had: loaded by the first batch


def _fast_dumps():
    """orjson.dumps (a dependency, one small C extension), imported with the first rows encoded,
    not when gpuscope or the recorder is imported: 64 rows take ~15 us with orjson, ~150 with
    the json encoder above."""
    global _orjson
    if _orjson is None:
        try:
            from orjson import dumps
        except Exception:
            dumps = False
        _orjson = dumps
    return _orjson


def encode_rows(rows: list) -> bytes:
    """Step rows as JSON lines. orjson's bytes are json.dumps(row, separators=(",", ":"))'s for
    the rows the recorder makes (integers, ASCII names); other characters it writes as UTF-8
    rather than escapes (the same strings read back). A batch orjson refuses (an integer past 64
    bits, a key that is not a string) goes to the json encoder."""
    fast = _fast_dumps()
    if fast:
        try:
            return b"\n".join([fast(r, default=str) for r in rows]) + b"\n"
        except Exception:  # noqa: BLE001 - a value orjson does not take: the json encoder's turn
            pass
    return ("\n".join([_encoder.encode(r) for r in rows]) + "\n").encode()


def create_rank_file(run_dir: str, rank: int):
    """Open a new record file for `rank` in `run_dir`, never one a recording already wrote:
    the first recording gets rank-00000.gpuscope.jsonl, a later one rank-00000-2..., created
    exclusively so two processes cannot share one. Returns (path, recording number, file)."""
    os.makedirs(run_dir, exist_ok=True)
    for n in range(1, MAX_RECORDINGS):
        path = os.path.join(run_dir, rank_file_name(rank, n))
        try:
            return path, n, open(path, "xb")
        except FileExistsError:
            continue
    raise OSError(f"{run_dir}: {MAX_RECORDINGS} recordings of rank {rank} already; use a new run dir")


class RecordWriter:
    """One rank file, created at once (so an unwritable run dir is known before anything is
    hooked into training) with its header written there and then. Later lines are made into
    bytes by the caller and handed to a writer thread, so a slow or stalled filesystem never
    holds up a training step: `add_rows` encodes and queues. When the disk is full, the file
    vanished or a write fails, the thread stops and sets `error` (the recorder then stops
    recording, once, and training goes on); when writes stall, batches past MAX_PENDING are
    dropped and counted. `close` is idempotent and waits for the thread at most
    CLOSE_TIMEOUT_S.

    The column side file (run_format) is kept beside it: each batch joins the current chunk as
    it is queued, and a full chunk (the last at close, whatever its size) is queued after the
    lines it stands for; the thread writes it once they are in the record file. A row the
    columns cannot hold exactly (named phases), or a side file that cannot be written, ends the
    side file (it is removed: readers then decode the JSON, which is always complete)."""

    MAX_PENDING = 256       # batches of lines queued before new ones are dropped
    CLOSE_TIMEOUT_S = 10.0  # a stalled filesystem never holds up the end of training longer

    def __init__(self, run_dir: str, rank: int):
        self.path, self.recording, self._fh = create_rank_file(run_dir, rank)
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._has_header = False
        self.error: str | None = None  # why writing stopped
        self.dropped = 0                # lines dropped while writes stalled
        self._cols = None               # the column side file, once the header is written
        self._chunk: Chunk | None = None  # the lines since its last chunk

    def write_header(self, header: dict) -> None:
        data = (_dumps(header) + "\n").encode()
        self._fh.write(data)  # here: a failure is known before training
        self._fh.flush()
        self._has_header = True
        try:
            self._cols = open(columns_path(self.path), "wb")
            self._chunk = Chunk(len(data))
        except OSError:
            self._cols = None  # no side file: readers decode the JSON

    def add_rows(self, rows: list[list], wake: bool = True) -> None:
        """Queue step rows, as JSON lines and columns made here, on the caller's thread: ~0.5 us
        a row, where the writer thread's turn cost ~4 (the rows on another core's cache, and
        the GIL handed to it and back mid-step). The caller hands them over: it does not
        change them afterwards. `wake=False`: more follows at once (a flush's side lines), and
        `wake()` then."""
        if rows:
            self._put(encode_rows(rows), rows, wake)

    def add_meta(self, obj: dict, wake: bool = True) -> None:
        self._put((_dumps(obj) + "\n").encode(), None, wake)

    def wake(self) -> None:
        """Have the thread write what was queued with wake=False."""
        with self._cv:
            if self._queue:
                self._start()
                self._cv.notify()

    def _put(self, data: bytes, rows: list | None = None, wake: bool = True) -> None:
        """Queue `data` for the record file: lines of step `rows` or (rows None) side lines.
        The batch joins the column chunk here, in the order the lines are queued (the order
        they are written in); a full chunk is queued after them."""
        with self._cv:
            if self._fh is None or self._closing or self.error is not None:
                return
            if len(self._queue) >= self.MAX_PENDING:
                self.dropped += len(rows) if rows is not None else data.count(b"\n")
                return
            self._enqueue(data, rows)
            if wake:
                self._start()
                self._cv.notify()

    def _enqueue(self, data: bytes, rows: list | None) -> None:
        """The batch, and what the side file gets after it (called holding _cv)."""
        self._queue.append((data, self._add_columns(rows, data)))

    def _add_columns(self, rows: list | None, data: bytes):
        """The batch joins the current chunk (called holding _cv). Returns what the writer
        thread writes to the side file after the batch: a full chunk's bytes, False to end
        the side file (a row the columns cannot hold), or None."""
        chunk = self._chunk
        if chunk is None:
            return None
        try:
            fits = chunk.add_rows(rows, data) if rows is not None else chunk.add_side(data)
        except Exception:  # noqa: BLE001 - only ever an optimisation: never the recording's end
            fits = False
        if fits is False:
            self._chunk = None
            return False
        return self._take_chunk() if chunk.full else None

    def _take_chunk(self) -> bytes | None:
        """The current chunk's bytes (None when empty); the next starts where it ends."""
        chunk = self._chunk
        if chunk is None or not chunk.lines:
            return None
        self._chunk = Chunk(chunk.offset + chunk.length)
        return chunk.to_bytes()

    def _start(self) -> None:
        """The writer thread, started with the first line to write (called holding _cv)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpuscope-writer",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """Writes what was queued, all of it at each wake-up: the record file's lines, flushed,
        then the side file's chunks that stand for them. Only I/O here (which runs without the
        GIL): the training thread made the bytes."""
        fh = self._fh
        checked = 0.0  # when the file was last seen still linked (a deleted file: an error)
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    break
                batch = list(self._queue)
                self._queue.clear()
            try:
                fh.write(b"".join([data for data, _ in batch]))
                fh.flush()
                now = time.monotonic()
                if now >= checked + 1.0:  # a syscall: once a second, not every batch
                    checked = now
                    if os.fstat(fh.fileno()).st_nlink == 0:
                        raise OSError(f"{self.path} was deleted while recording")
            except (OSError, ValueError) as exc:
                with self._cv:
                    self.error = f"cannot write {self.path}: {getattr(exc, 'strerror', None) or exc}"
                    self._queue.clear()
                    self._chunk = None
                self._end_columns(remove=True)
                return
            for _, cols in batch:
                if cols is False:
                    self._end_columns(remove=True)
                elif cols:
                    self._write_chunk(cols)

    def _write_chunk(self, data: bytes) -> None:
        if self._cols is None:
            return
        try:
            self._cols.write(data)
            self._cols.flush()
        except (OSError, ValueError):
            with self._cv:
                self._chunk = None
            self._end_columns(remove=True)

    def _end_columns(self, remove: bool = False) -> None:
        cols, self._cols = self._cols, None
        if cols is None:
            return
        try:
            cols.close()
        except OSError:
            pass
        if remove:
            try:
                os.remove(columns_path(self.path))
            except OSError:
                pass

    def close(self, end: dict | None = None) -> None:
        """Write the end record (when given and the file is still writable) and close; a file
        that never got its header (setup failed) is removed rather than left behind empty."""
        with self._cv:
            fh = self._fh
            if fh is None or self._closing:
                return
            if self._has_header and self.error is None:
                if end is not None:
                    self._enqueue((_dumps({"end": end}) + "\n").encode(), None)
                last = self._take_chunk()  # the last chunk, whatever its size
                if last:
                    self._queue.append((b"", last))
                if self._queue:
                    self._start()
            self._closing = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.CLOSE_TIMEOUT_S)
            if thread.is_alive():  # stalled: leave it (a daemon) rather than hang training
                self.error = self.error or f"writing {self.path} stalled; the end was not written"
                return
        self._fh = None
        self._end_columns()
        try:
            fh.close()
        except OSError:
            pass
        finally:
            if not self._has_header:
                try:
                    os.remove(self.path)
                except OSError:
                    pass
