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
#: most of the writer thread's time (126 us for 16 rows, 38 with this one).
_encoder = json.JSONEncoder(separators=(",", ":"), default=str)


def _dumps(obj) -> str:
    return _encoder.encode(obj)


_orjson = None  # orjson.dumps, or False where it cannot be had: loaded by the first batch


def _fast_dumps():
    """orjson.dumps (a dependency, one small C extension), imported on the writer thread when it
    encodes its first rows, not when gpuscope or the recorder is imported. The thread runs under
    the GIL, so in a CPU-bound loop the step waits for it: 16 rows take a few us with orjson, ~40
    with the json encoder above."""
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
    hooked into training) with its header written there and then. Later lines are handed to a
    writer thread, so a slow or stalled filesystem never holds up a training step: `add_rows`
    only queues. When the disk is full, the file vanished or a write fails, the thread stops and
    sets `error` (the recorder then stops recording, once, and training goes on); when writes
    stall, batches past MAX_PENDING are dropped and counted. `close` is idempotent and waits for
    the thread at most CLOSE_TIMEOUT_S.

    The thread also keeps the column side file (run_format): each batch, once in the record
    file, joins the current chunk, written when full and at the end. A row the columns cannot
    hold exactly (named phases), or a side file that cannot be written, ends the side file (it is
    removed: readers then decode the JSON, which is always complete)."""

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
        """Queue step rows; the writer thread turns them into JSON lines (off the step path:
        ~2 us a row). The caller hands them over: it does not change them afterwards.
        `wake=False`: more follows at once (a flush's side lines), and `wake()` then."""
        if rows:
            self._put(None, rows, wake)

    def add_meta(self, obj: dict, wake: bool = True) -> None:
        self._put([_dumps(obj)], None, wake)

    def wake(self) -> None:
        """Have the thread write what was queued with wake=False."""
        with self._cv:
            if self._queue:
                self._start()
                self._cv.notify()

    def _put(self, lines: list[str] | None, rows: list | None = None, wake: bool = True) -> None:
        """Queue lines, or (lines None) rows the thread serializes."""
        if not lines and not rows:
            return
        with self._cv:
            if self._fh is None or self._closing or self.error is not None:
                return
            if len(self._queue) >= self.MAX_PENDING:
                self.dropped += len(lines) if lines else len(rows)
                return
            self._queue.append(("\n".join(lines) + "\n" if lines else None, rows))
            if wake:
                self._start()
                self._cv.notify()

    def _start(self) -> None:
        """The writer thread, started with the first line to write (called holding _cv)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpuscope-writer",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        fh = self._fh
        checked = 0.0  # when the file was last seen still linked (a deleted file: an error)
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    break
                batch = list(self._queue)  # everything queued: one write, one flush
                self._queue.clear()
            parts = [(rows, encode_rows(rows) if text is None else text.encode())
                     for text, rows in batch]
            try:
                fh.write(b"".join([data for _, data in parts]))
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
                self._end_columns(remove=True)
                return
            for rows, data in parts:
                self._add_columns(rows, data)
        self._write_chunk()  # closing: the last chunk

    def _add_columns(self, rows: list | None, data: bytes) -> None:
        """The batch joins the current chunk, once the batch itself is in the record file."""
        chunk = self._chunk
        if self._cols is None or chunk is None:
            return
        try:
            fits = chunk.add_rows(rows, data) if rows is not None else chunk.add_side(data)
        except Exception:  # noqa: BLE001 - only ever an optimisation: never the thread's end
            fits = False
        if fits is False:
            self._end_columns(remove=True)
            return
        if chunk.full:
            self._write_chunk()

    def _write_chunk(self) -> None:
        chunk = self._chunk
        if self._cols is None or chunk is None or not chunk.lines:
            return
        try:
            self._cols.write(chunk.to_bytes())
            self._cols.flush()
        except (OSError, ValueError):
            self._end_columns(remove=True)
            return
        self._chunk = Chunk(chunk.offset + chunk.length)

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
            if end is not None and self._has_header and self.error is None:
                self._queue.append((_dumps({"end": end}) + "\n", None))
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
