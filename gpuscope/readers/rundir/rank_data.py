"""RankFile: one rank file, read (rank_file.py reads it; the side records' handlers, the parallel
load and the grouping into recordings take it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..record_body import BLOCK_ROWS, block_columns
from ..validate import MAX_UNIX_NS, Tally, is_int

@dataclass


class RankFile:
    """One rank file, read: header (knobs merged), step rows, side records, end record."""

    path: str
    header: dict
    rows: list
    end: dict
    device: list = field(default_factory=list)
    nvml: list = field(default_factory=list)
    dataparallel: dict = field(default_factory=dict)  # the latest DataParallel totals
    memory: list = field(default_factory=list)  # memory records (memory_records.py)
    routing: list = field(default_factory=list)  # all-to-all rows (routing_records.py)
    modules: list = field(default_factory=list)  # module forward times (module_records.py)
    stalls: list = field(default_factory=list)  # the stall watcher's records (stall.py)
    stall_ends: list = field(default_factory=list)  # ... and when steps resumed after each
    warnings: list[str] = field(default_factory=list)
    row_lines: list[int] = field(default_factory=list)  # line number of each row
    tally: Tally | None = None  # what was skipped while reading
    frame: pd.DataFrame | None = None  # the step rows as read (built; then rows keeps only
    comm: tuple | None = None          # the first and the last row) and their collectives
    n_rows: int = 0
    block: np.ndarray | None = None  # record_body.BLOCK_ROWS x rows: frame's columns are its rows
    warm: dict | None = None  # its first rows, set apart from frame and block (warm_split.py)

    def __getstate__(self) -> dict:
        """Pickled (the Ray engine's tasks) without the frame's views of the block: they would
        travel as copies of it."""
        state = dict(self.__dict__)
        if self.block is not None and self.frame is not None:
            state["frame"] = {k: v for k, v in self.frame.items() if k not in BLOCK_ROWS}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self.block, np.ndarray) and self.frame is not None:
            self.frame = {**block_columns(self.block), **self.frame}

    @property
    def rank(self) -> int:
        return int(self.header.get("rank", -1))

    @property
    def run_id(self) -> str:
        rid = self.header.get("run_id")
        return rid if isinstance(rid, str) else ""

    def span(self) -> tuple[int, int]:
        """[start, end] of the recording on this rank, unix ns."""
        start = self.header.get("start_unix_ns")
        if not is_int(start, 0, MAX_UNIX_NS):
            first = self.rows[0] if self.rows else None
            start = first[1] if first and len(first) > 1 and is_int(first[1], 0, MAX_UNIX_NS) else 0
        ends = [start]
        if isinstance(self.end.get("end_unix_ns"), int):
            ends.append(self.end["end_unix_ns"])
        last = self.rows[-1] if self.rows else None
        if last and len(last) > 2 and is_int(last[1], 0, MAX_UNIX_NS) and is_int(last[2]):
            ends.append(last[1] + last[2])
        return start, max(ends)
