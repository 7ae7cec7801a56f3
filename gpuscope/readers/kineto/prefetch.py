"""Trace files parsed by forked processes started before the analysis stack is imported.

`gpuscope analyze TRACES` would spend half a second importing pandas and the analysis before
reading a byte. The command line instead enters `prefetching(files)` first: one process per core
(at most one per file) parses the files, and works out the step rows of those that are their
process's only trace, while the command imports what it needs. The block gives the command the
Prefetch, which it hands to the reader (`read_path(path, parsed=ahead)`); the reader `take`s what
the processes delivered instead of parsing again. Nothing is kept in a global: a reader given no
Prefetch parses everything itself (the plain path, top to bottom). What did not come (a file that failed, a file changed since,
a process that died) the reader parses itself as usual, and reports its errors. On leaving the
block every process is gone, delivered or not.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
from contextlib import ExitStack, contextmanager

import gpuscope.progress as progress
from ..speed import forks
from ..fork import in_child
from .parse import alone_files, parse_file, prepared

def _stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _groups(files: list[str], k: int) -> list[list[int]]:
    """Indexes of `files` in k groups of about equal bytes (largest first, to the lightest)."""
    sizes = [(_stamp(f) or (0, 0))[0] for f in files]
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(files)), key=lambda i: -sizes[i]):
        g = load.index(min(load))
        groups[g].append(i)
        load[g] += sizes[i]
    return [g for g in groups if g]


def _unwind(signum, _frame):
    raise SystemExit(128 + signum)


class Prefetch:
    """The parse of `files` under way in forked processes (see the module's docstring)."""

    def __init__(self, files: list[str], stack: ExitStack, cores: int):
        self.files = list(files)
        self.stamps = [_stamp(f) for f in self.files]
        alone = alone_files(self.files)
        split = len(self.files) == 1  # one file: its text is cut in two (parse.parse_file)
        groups = _groups(self.files, cores)
        # bytes parsed so far by each process, for the progress bar while the reader waits
        self._done = mmap.mmap(-1, 8 * len(groups))  # shared with the processes forked below

        def work(slot, group):
            # stopped early (the command failed before it read): unwind, so that the child
            # this process may have forked for half a file is stopped too (fork.in_child)
            signal.signal(signal.SIGTERM, _unwind)
            out, done = [], 0
            for i in group:
                try:
                    item = parse_file(self.files[i], split=split)
                    out.append(prepared(item) if alone[i] else item)
                    done += (self.stamps[i] or (0, 0))[0]
                    struct.pack_into("q", self._done, 8 * slot, done)
                except Exception:  # noqa: BLE001 - the reader parses it again and reports it
                    out.append(None)
            return out

        # not daemons: a process with one file cuts it in two with a child of its own
        self._pending = [(group, stack.enter_context(in_child(lambda s=slot, g=group: work(s, g),
                                                               daemon=False)))
                         for slot, group in enumerate(groups)]

    def take(self, files: list[str]) -> dict[str, tuple]:
        """{path: parsed item} for those of `files` that were parsed and are unchanged since;
        the progress bar (when one is shown) follows the processes while they finish."""
        pending, self._pending = self._pending, []
        shown = [0]

        def tick(upto=None):
            now = sum(struct.unpack_from(f"{len(self._done) // 8}q", self._done))
            now = now if upto is None else upto
            progress.advance(now - shown[0])
            shown[0] = max(shown[0], now)

        wanted, out, size = set(files), {}, 0
        for group, collect in pending:
            status, value = collect(tick)
            if status != "ok":
                continue
            for i, item in zip(group, value):
                f = self.files[i]
                if item is not None and f in wanted and _stamp(f) == self.stamps[i]:
                    out[f] = item
                    size += self.stamps[i][0]
        tick(size)
        return out


@contextmanager
def prefetching(files: list[str]):
    """Parse `files` in forked processes while the block runs (see the module's docstring); the
    block gets the Prefetch to hand to the reader, or None where forking is not allowed or there
    is one core (the reader then parses everything itself)."""
    cores = os.cpu_count() or 1
    if not files or not forks() or cores < 2:
        yield None
        return
    with ExitStack() as stack:
        yield Prefetch(files, stack, min(cores, len(files)))
