"""Writes one rank's record file: a header, then lines appended and flushed at once."""

from __future__ import annotations

import json
import os
import threading

from ..record_format import rank_file_name

MAX_RECORDINGS = 10_000


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)


def create_rank_file(run_dir: str, rank: int):
    """Open a new record file for `rank` in `run_dir`, never one a recording already wrote:
    the first recording gets rank-00000.gpuscope.jsonl, a later one rank-00000-2..., created
    exclusively so two processes cannot share one. Returns (path, recording number, file)."""
    os.makedirs(run_dir, exist_ok=True)
    for n in range(1, MAX_RECORDINGS):
        path = os.path.join(run_dir, rank_file_name(rank, n))
        try:
            return path, n, open(path, "x", encoding="utf-8")
        except FileExistsError:
            continue
    raise OSError(f"{run_dir}: {MAX_RECORDINGS} recordings of rank {rank} already; use a new run dir")


class RecordWriter:
    """One rank file: created at once (so an unwritable run dir is known before anything is
    hooked into training), then a header, then lines appended and flushed to the OS as they
    come (the recorder batches rows every `flush_rows` steps or `flush_s` seconds), so a killed
    run loses only its last few steps. Thread-safe; `close` is idempotent."""

    def __init__(self, run_dir: str, rank: int):
        self.path, self.recording, self._fh = create_rank_file(run_dir, rank)
        self._lock = threading.Lock()
        self._has_header = False

    def write_header(self, header: dict) -> None:
        self._write([_dumps(header)])
        self._has_header = True

    def add_rows(self, rows: list[list]) -> None:
        self._write([_dumps(r) for r in rows])

    def add_meta(self, obj: dict) -> None:
        self._write([_dumps(obj)])

    def _write(self, lines: list[str]) -> None:
        with self._lock:
            if self._fh is None or not lines:
                return
            self._fh.write("\n".join(lines) + "\n")
            self._fh.flush()

    def close(self, end: dict | None = None) -> None:
        """Write the end record (when given) and close; a file that never got its header (setup
        failed) is removed rather than left behind empty."""
        with self._lock:
            fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            if end is not None and self._has_header:
                fh.write(_dumps({"end": end}) + "\n")
        finally:
            fh.close()
            if not self._has_header:
                try:
                    os.remove(self.path)
                except OSError:
                    pass
