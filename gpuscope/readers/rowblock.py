"""One shared block for every rank's step columns, written in place by the processes that read
the files.

Reading 10,000 record files, each file's columns used to be built in an array of its own, then
copied into the run's frame (and the forked reader's copied once more through shared memory):
every byte of the frame was written three times into memory touched for the first time, and on
a virtual machine a first touch costs more than the copy. Here the run's block (BLOCK_ROWS x
rows, column-major, as the frame keeps it) is mapped once, shared, before the fork; each
process owns a region of it sized by an upper bound of its files' rows, and writes each file's
columns straight into the next free columns of its region. The first region (the forked
reader's) fills from its right end, its files taken last to first, and the second from its left
end: the two meet at their border with no gap, and the frame is a view of the block (no column
moved; regions that do not meet are closed up by one memmove per column).

A file whose rows do not fit its region (the bound is the side file's when there is one, and
the JSON it falls back to may hold more) gets an array of its own, as before; the frame is then
copied together as before. Nothing here decides what is read: only where it lands.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from ..run_format import STEP_COLUMNS, columns_path
from .fork import shared_memory
from .record_body import BLOCK_ROWS

_ROWS = len(BLOCK_ROWS)
_WIDTH = len(STEP_COLUMNS)
MIN_JSON_ROW = 2 * _WIDTH + 2  # bytes of the shortest JSON row: "[0,0,...,0]\n"


def rows_bound(name: str) -> int:
    """At most this many step rows come out of record file `name`: its side file's words over a
    row's (the side file is read when it accounts for the file), else the JSON's bytes over the
    shortest row's."""
    side = side_rows_bound(name)
    if side is not None:
        return side
    try:
        return os.path.getsize(name) // MIN_JSON_ROW + 1
    except OSError:
        return 0


def side_rows_bound(name: str) -> int | None:
    """rows_bound from the side file of record file `name` (None without one): about 1.3x the
    rows of a DDP run, where the JSON's bound may be 5x."""
    try:
        return os.path.getsize(columns_path(name)) // (8 * (_WIDTH + 1)) + 1
    except OSError:
        return None


#: the analysis's peak memory per rank-step of a run dir, in bytes: benchmarks/results/
#: scale_large.json measured 309-336 at 2,048 to 10,000 ranks (the table, its collectives and
#: the passes' temporaries together)
PEAK_BYTES_PER_ROW = 300


def available_memory() -> int | None:
    """Bytes of memory this process can take without swapping or being stopped: Linux's
    MemAvailable, or less where its control group (a container's, a job's) allows less; None
    where neither is known."""
    known = [x for x in (_mem_available(), cgroup_room()) if x is not None]
    return min(known) if known else None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_room(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's memory control group has left: its limit less what it uses, the
    page cache (which the kernel reclaims first) not counted as used; None without a limit.
    cgroup v2 (memory.max, memory.current, memory.stat's file) and v1 (memory.limit_in_bytes,
    memory.usage_in_bytes, memory.stat's total_cache)."""
    def read(path: str) -> str:
        with open(path) as fh:
            return fh.read().strip()

    def stat(path: str, key: str) -> int:
        for line in read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
        return 0

    try:
        lines = read(proc).splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        try:
            if controllers == "":  # v2: one hierarchy
                base = os.path.join(root, path.lstrip("/"))
                limit = read(os.path.join(base, "memory.max"))
                if limit == "max":
                    continue
                used = int(read(os.path.join(base, "memory.current")))
                cache = stat(os.path.join(base, "memory.stat"), "file")
            elif "memory" in controllers.split(","):  # v1
                base = os.path.join(root, "memory", path.lstrip("/"))
                limit = read(os.path.join(base, "memory.limit_in_bytes"))
                if int(limit) >= 1 << 60:  # no limit set
                    continue
                used = int(read(os.path.join(base, "memory.usage_in_bytes")))
                cache = stat(os.path.join(base, "memory.stat"), "total_cache")
            else:
                continue
            return max(int(limit) - max(used - cache, 0), 0)
        except (OSError, ValueError):
            continue
    return None


def spill_dir() -> str:
    """Where a table too big for memory is kept: $GPUSCOPE_SPILL_DIR, else the temporary
    directory ($TMPDIR, /tmp)."""
    return os.environ.get("GPUSCOPE_SPILL_DIR") or tempfile.gettempdir()


def in_memory_fs(path: str, mounts: str = "/proc/mounts") -> bool:
    """Whether `path` lies on a file system held in memory (tmpfs, ramfs): a file there is no
    room outside memory."""
    real, best, kind = os.path.realpath(path), "", ""
    try:
        with open(mounts) as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return False
    return kind in ("tmpfs", "ramfs")


def free_disk(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


#: what a user can do when a run may still not fit
_ADVICE = ("if the analysis is stopped for memory, analyse fewer ranks' files at a time (a run "
           "dir with some of them) or use a machine with more memory")


def memory_plan(rows: int, available: int | None = None,
                shared: bool = True) -> tuple[str | None, str | None]:
    """(warning, spill directory) for analysing `rows` rank-steps at most (side_rows_bound's
    sum). When they may take more memory than is available, the row block goes to a file
    (RowBlock's spill_dir) where there is disk for it outside memory, and the warning says so;
    (None, None) when they fit or memory is not known. `shared`: the files are read into the
    shared row block (not by a reader in one process, whose tables stay in memory)."""
    available = available_memory() if available is None else available
    need = rows * PEAK_BYTES_PER_ROW
    if available is None or need <= available:
        return None, None
    head = (f"up to {rows:,} rank-steps to analyse: that may take about {need / 2**30:.1f} GB "
            f"of memory and {available / 2**30:.1f} GB is available")
    where, block = spill_dir(), rows * 8 * (_ROWS + 1)
    why = _no_spill(where, block) if shared else (
        "read by one process here (one core, or other threads running), its tables stay in "
        "memory")
    if why:
        return f"{head}; {why}: {_ADVICE}", None
    tail = (f"; the step table ({block / 2**30:.1f} GB) and the collectives' are kept in files "
            f"under {where} that the system pages in and out (slower; $GPUSCOPE_SPILL_DIR "
            "chooses where)")
    rest = rows * (PEAK_BYTES_PER_ROW - 8 * (_ROWS + 1))
    if rest > available:
        tail += f", and the rest ({rest / 2**30:.1f} GB) may still not fit: {_ADVICE}"
    return head + tail, where


def _no_spill(where: str, block: int) -> str:
    """Why a step table of `block` bytes cannot be kept in a file under `where`, or ""."""
    free = free_disk(where) if os.path.isdir(where) else None
    why = ("no such directory" if not os.path.isdir(where) else
           "it is held in memory (tmpfs)" if in_memory_fs(where) else
           f"it has {(free or 0) / 2**30:.1f} GB free of the {block / 2**30:.1f} GB needed"
           if free is None or free < 1.2 * block else "")
    return why and (f"the step table cannot be kept on disk under {where} ({why}; "
                    "$GPUSCOPE_SPILL_DIR chooses where)")


@dataclass(frozen=True)
class InBlock:
    """Where a file's columns lie in the shared block (sent from the child instead of them)."""

    start: int
    n: int


class Region:
    """The columns [start, start + capacity) of the block, filled from the left, or from the
    right (`downward`: the files are then read last to first, so that they still lie in order)."""

    def __init__(self, block: "RowBlock", start: int, capacity: int, downward: bool = False):
        self.block, self.start, self.capacity, self.used = block, start, capacity, 0
        self.downward = downward

    @property
    def first(self) -> int:
        """The block's column of the region's first used column."""
        return self.start + self.capacity - self.used if self.downward else self.start

    def _at(self, n: int) -> int:
        return self.first - n if self.downward else self.start + self.used

    def place(self, n: int) -> np.ndarray:
        """Where the next file's n rows go: a view of the block when they fit, else an array of
        their own. Taken only when commit()ed (a file that falls back to its JSON asks again)."""
        if self.used + n <= self.capacity:
            at = self._at(n)
            return self.block.array[:_ROWS, at:at + n]
        return np.empty((_ROWS, n), np.int64)

    def commit(self, got: np.ndarray | None) -> None:
        """The file's columns were kept in `got` (what place() gave, or None)."""
        if got is not None and self.block.holds(got) and \
                self.block.offset_of(got) == self._at(got.shape[1]):
            self.used += got.shape[1]


class RowBlock:
    """The shared block: BLOCK_ROWS and wait_ns (zeros, filled by the analysis) x capacity
    int64, mapped before the fork (its pages touched only as rows are written); in memory, or
    in a file under `spill_dir` (fork.shared_memory)."""

    def __init__(self, capacity: int, spill_dir: str | None = None):
        self.capacity = max(int(capacity), 1)
        self.spill_dir = spill_dir
        size = (_ROWS + 1) * self.capacity * 8
        self._mm = shared_memory(size, spill_dir, reserve=True)
        self.array = np.frombuffer(self._mm, np.int64, (_ROWS + 1) * self.capacity).reshape(
            _ROWS + 1, self.capacity)
        self._base = self.array.ctypes.data

    def holds(self, arr) -> bool:
        return (isinstance(arr, np.ndarray) and arr.ndim == 2 and arr.shape[0] == _ROWS
                and arr.strides == self.array.strides
                and self._base <= arr.ctypes.data < self._base + 8 * self.capacity)

    def offset_of(self, arr: np.ndarray) -> int:
        return (arr.ctypes.data - self._base) // 8

    def marker(self, arr):
        """In the child: a block in here travels as where it lies."""
        return InBlock(self.offset_of(arr), arr.shape[1]) if self.holds(arr) else arr

    def view(self, value):
        """In the parent: the block a marker points at; anything else as it is."""
        if isinstance(value, InBlock):
            return self.array[:_ROWS, value.start:value.start + value.n]
        return value

    def joined(self, blocks: list, regions: list[Region]) -> np.ndarray | None:
        """The frame's block (BLOCK_ROWS and wait_ns x rows, a view of this one) when `blocks`, in order,
        are the regions' committed columns in order; the regions are closed up in place. None
        when they are not (a file skipped, one of its own, another order): copy them."""
        spans = [(r.first, r.used) for r in regions if r.used]
        at = iter(spans)
        start, left = next(at, (0, 0))
        pos = start
        for b in blocks:
            if not self.holds(b) or self.offset_of(b) != pos or b.shape[1] > left:
                return None
            pos += b.shape[1]
            left -= b.shape[1]
            if not left:
                start, left = next(at, (0, 0))
                pos = start
        if left or next(at, None) is not None:
            return None
        first = end = spans[0][0] if spans else 0
        for start, used in spans:  # close up where regions do not meet (memmove: overlap safe)
            if start != end:
                for row in self.array:
                    ctypes.memmove(row.ctypes.data + 8 * end, row.ctypes.data + 8 * start,
                                   8 * used)
            end += used
        return self.array[:, first:end]
