"""The per-rank record file: one header line, then step rows; append-only JSON lines.

Layout of ``rank-00000.gpuscope.jsonl``::

    {"schema": "gpuscope.record/1", "rank": 0, ..., "columns": [...]}   header (object)
    [0, 1700000000000000000, 12000000, ...]                              one step row (array)
    {"knobs": {...}}                                                     knob update (object)
    {"end": {"steps": 100, ...}}                                         clean close (object)

Rows are arrays in the order of ``STEP_COLUMNS``; an optional trailing object holds named phases
that are not one of the fixed columns. All times are integer nanoseconds.
"""

from __future__ import annotations

import json
import os
import threading

SCHEMA = "gpuscope.record/1"
FILE_GLOB = "rank-*.gpuscope.jsonl"

STEP_COLUMNS = (
    "step",             # step index on this rank, from 0
    "start_ns",         # unix-epoch ns at the start of the step (aligned across ranks by host clocks)
    "step_ns",          # wall time of the step
    "data_ns",          # blocked waiting for the batch
    "compute_ns",       # forward + backward + optimizer, exposed communication excluded
    "comm_ns",          # time inside collectives (union of their intervals)
    "comm_exposed_ns",  # part of comm_ns the step was blocked on
    "other_ns",         # the rest: host overhead, Python, logging
    "forward_ns",
    "backward_ns",
    "optimizer_ns",
    "n_comm",           # collectives completed in the step
    "data_cpu_ns",      # CPU time of the training thread inside next(): ~data_ns when loading
                        # runs in-process and is CPU-bound, ~0 when it waits on I/O or workers
)


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.gpuscope.jsonl"


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)


class RecordWriter:
    """Appends lines to the rank file and flushes them to the OS at once (the recorder batches
    rows every `flush_rows` steps or `flush_s` seconds), so a killed run loses only its last few
    steps. Thread-safe."""

    def __init__(self, path: str, header: dict):
        self.path = path
        self._lock = threading.Lock()
        self._buf: list[str] = []
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")
        self._fh.write(_dumps(header) + "\n")
        self._fh.flush()

    def add_rows(self, rows: list[list]) -> None:
        """Append rows and write them out (the recorder batches them already)."""
        lines = [_dumps(r) for r in rows]
        with self._lock:
            self._buf.extend(lines)
            self._flush_locked()

    def add_meta(self, obj: dict) -> None:
        with self._lock:
            self._buf.append(_dumps(obj))
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._fh is None or not self._buf:
            return
        self._fh.write("\n".join(self._buf) + "\n")
        self._fh.flush()
        self._buf.clear()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self, end: dict | None = None) -> None:
        with self._lock:
            if end is not None:
                self._buf.append(_dumps({"end": end}))
            self._flush_locked()
            if self._fh is not None:
                self._fh.close()
                self._fh = None
