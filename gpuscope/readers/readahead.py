"""Files asked of the disk before they are read: a run dir read file after file waits on the
disk for each one in turn (one request in flight), where the disk would serve several at once.

`Ahead(paths).before(i)` tells the kernel (posix_fadvise WILLNEED: it starts reading them into
the page cache and returns) about the files after the i-th, up to AHEAD_BYTES ahead of it, so
that they are being read while the i-th is decoded. Nothing is read into this process: a file
already cached costs one system call; where the call does not exist (not POSIX) or fails, it is
skipped. Measured on this project's 10,000 ranks x 10,000 steps run dir read from a cold cache
(benchmarks/bench_scale.py, docs/performance.md).
"""

from __future__ import annotations

import os
from typing import Callable

from ..run_format import columns_path
from .record_file import HEAD_BYTES, TAIL_BYTES, unchanged_since_side
from .speed import bulk

#: how far ahead of the file being read the disk is asked for files, in bytes: enough to keep
#: several requests in flight, little against the memory a run dir's analysis takes
AHEAD_BYTES = 32 << 20

_ADVISE = getattr(os, "posix_fadvise", None)
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


def advise(path: str, length: int = 0, tail: int = 0) -> None:
    """Ask the kernel to start reading `path` (its first `length` bytes and its last `tail`;
    length 0: all of it) into the page cache (and return at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        _ADVISE(fd, 0, length, _WILLNEED)
        if length and tail:
            _ADVISE(fd, max(os.fstat(fd).st_size - tail, length), tail, _WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def advise_record(path: str) -> None:
    """A record file and its side file, as the reader will read them: where the side file may
    stand for the record file (record_file.py), the side file and the record file's head and
    tail; else both whole."""
    side = columns_path(path)
    if bulk() and unchanged_since_side(path):
        advise(side)
        advise(path, HEAD_BYTES, TAIL_BYTES)
    else:
        advise(path)
        advise(side)


def _each(paths: tuple[str, ...]) -> None:
    for path in paths:
        advise(path)


class Ahead:
    """The items of `paths` (each the paths read together, asked for by `ask`; by default a
    tuple of paths, each asked whole), with `sizes` (bytes per item), asked for `ahead` bytes
    (AHEAD_BYTES) ahead of the one read."""

    def __init__(self, paths: list, sizes: list[int], ahead: int | None = None,
                 ask: Callable | None = None):
        ahead = AHEAD_BYTES if ahead is None else ahead
        self.paths, self.sizes, self.ahead = paths, sizes, ahead
        self.ask = _each if ask is None else ask  # asks the disk for one item
        self.asked = 0  # items asked for so far: [0, asked)
        self.bytes_asked = 0  # their bytes past the item being read
        self.on = _ADVISE is not None and _WILLNEED is not None and ahead > 0

    def before(self, i: int) -> None:
        """Item i is about to be read: the ones after it are asked for, up to `ahead` bytes."""
        if not self.on:
            return
        if self.asked <= i:  # caught up (the first item, or items larger than `ahead`)
            self.asked, self.bytes_asked = i + 1, 0
        else:
            self.bytes_asked -= self.sizes[i]
        while self.asked < len(self.paths) and self.bytes_asked < self.ahead:
            self.ask(self.paths[self.asked])
            self.bytes_asked += self.sizes[self.asked]
            self.asked += 1
