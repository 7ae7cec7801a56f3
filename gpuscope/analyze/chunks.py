"""Steps x ranks tables taken some rows (or columns) at a time: the temporaries of a row-wise
statistic stay a few MB whatever the table's size, and where the table is big and two cores
are there, two threads share the chunks (numpy's sorts and partitions let go of the GIL)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

#: values of a table taken at a time
CHUNK_VALUES = 1 << 18
#: tables from this many values have their chunks shared by two threads
THREADS_MIN_VALUES = 4 << 20


def row_chunks(table) -> list[slice]:
    """Slices of whole rows of `table`, about CHUNK_VALUES values each."""
    rows = max(1, CHUNK_VALUES // max(table.shape[1], 1))
    return [slice(i, i + rows) for i in range(0, table.shape[0], rows)]


def col_chunks(table) -> list[slice]:
    """Slices of whole columns of `table`, about CHUNK_VALUES values each."""
    cols = max(1, CHUNK_VALUES // max(table.shape[0], 1))
    return [slice(i, i + cols) for i in range(0, table.shape[1], cols)]


def each_chunk(work, chunks: list, values: int) -> list:
    """[work(chunk) for chunk in chunks], in their order: on two threads where the table
    (`values`) is big and the process may use two cores, else on this one. The threads are
    gone when this returns (the readers fork only a process without other threads)."""
    if values < THREADS_MIN_VALUES or len(chunks) < 2 or _cores() < 2:
        return [work(c) for c in chunks]
    with ThreadPoolExecutor(2, thread_name_prefix="gpuscope-chunks") as pool:
        return list(pool.map(work, chunks))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
