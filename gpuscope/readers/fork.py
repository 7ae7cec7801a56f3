"""Work in a forked process: the readers use a second core for half of a big input."""

from __future__ import annotations

import mmap
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


def can_fork() -> bool:
    return (hasattr(os, "fork") and (os.cpu_count() or 1) >= 2
            and threading.active_count() == 1)  # never fork a threaded host (TensorBoard)


def _die_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when the one that forked it dies (a parent
    killed outright leaves no one to stop it); elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before that took effect
            os._exit(1)
    except (OSError, AttributeError):
        pass


@contextmanager
def in_child(work, daemon: bool = True):
    """Run `work()` in a forked process (it sees this process's memory as it is now); yields a
    function that returns ("ok", value) or ("error", reason). On leaving the block the child is
    gone on every path: joined when it delivered, terminated (then killed) when the parent
    stopped listening early, e.g. because its own half raised. A child that forks children of
    its own must not be a daemon (multiprocessing forbids it).

    SIGTERM is held back from the fork until the block is entered: a process stopped by SIGTERM
    (a prefetch process, which then unwinds) between the fork and the block would otherwise
    never stop the child it had just forked."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    held = threading.current_thread() is threading.main_thread()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}) if held else None

    def target():
        if held:  # the child starts with the mask its parent had before the fork
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        # the fork gave the child its parent's end of the pipe too: holding it, the child would
        # block for ever on a full pipe once the parent is gone (killed outright, no block left
        # to stop it), orphaned; closed, its write fails and it exits
        recv.close()
        _die_with_parent()
        try:
            send.send(("ok", work()))
        except BaseException as exc:  # reported; the parent then does the work itself
            try:
                send.send(("error", repr(exc)))
            except OSError:  # the parent stopped listening
                pass
        finally:
            send.close()

    try:
        child = ctx.Process(target=target, daemon=daemon)
        child.start()
    except BaseException:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    send.close()

    delivered = []

    def collect(waiting=None):
        """The child's result; while it is not there, `waiting()` is called every 0.1 s."""
        try:
            while waiting is not None and not recv.poll(0.1):
                waiting()
            out = recv.recv()
        except (EOFError, OSError) as exc:
            out = "error", repr(exc)
        delivered.append(True)
        return out

    try:
        if held:  # a SIGTERM that came meanwhile is delivered here, inside the block
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        yield collect
    finally:
        recv.close()
        if delivered:  # it has sent: it is on its way out
            child.join(timeout=10)
        if child.exitcode is None:  # never listened to, or stuck: stop it
            child.terminate()
            child.join(timeout=5)
        if child.exitcode is None:
            child.kill()
            child.join()
        child.close()


NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if os.uname().sysname == "Linux" else 0)


def shared_memory(size: int, spill_dir: str | None = None, reserve: bool = False) -> mmap.mmap:
    """`size` bytes shared with the processes forked after this (pages taken as they are first
    written): anonymous memory, or with `spill_dir`, an unlinked file there, whose pages the
    kernel writes out and reads back under memory pressure (a table bigger than memory is then
    read and analysed, more slowly, instead of the process being stopped). The file is sparse;
    with `reserve` its disk is allocated first, so a full disk is an OSError here, never a
    SIGBUS when a page is written later (the forked reader's arena is not reserved: a child
    that dies so is read again by its parent)."""
    size = max(int(size), mmap.PAGESIZE)
    if spill_dir is None:
        return mmap.mmap(-1, size, flags=mmap.MAP_SHARED | NORESERVE)
    with tempfile.TemporaryFile(dir=spill_dir, prefix="gpuscope-spill-") as fh:
        fh.truncate(size)
        if reserve and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fh.fileno(), 0, size)
        return mmap.mmap(fh.fileno(), size, flags=mmap.MAP_SHARED)


@dataclass(frozen=True)
class _Slot:
    """Where an array lies in a SharedArena."""

    offset: int
    dtype: str
    shape: tuple


class SharedArena:
    """Shared memory (shared_memory) mapped before the fork. The child copies its result's arrays into
    it and sends only where they lie; the parent maps them as they are. Pickled through the
    pipe, every byte would be copied three more times (pickle, pipe, unpickle) while the parent
    waits. An array that does not fit (or holds objects) travels the usual way."""

    ALIGN = 64

    def __init__(self, capacity: int, spill_dir: str | None = None):
        self._mm = shared_memory(capacity, spill_dir)
        self._used = 0

    def put(self, arr):
        """In the child: the array's slot, or the array itself when it cannot go here."""
        if not isinstance(arr, np.ndarray) or arr.dtype.hasobject or not arr.size:
            return arr
        at = -(-self._used // self.ALIGN) * self.ALIGN
        if at + arr.nbytes > len(self._mm):
            return arr
        np.frombuffer(self._mm, arr.dtype, arr.size, at).reshape(arr.shape)[...] = arr
        self._used = at + arr.nbytes
        return _Slot(at, arr.dtype.str, arr.shape)

    def get(self, value):
        """In the parent: the array a slot points at (a view of the shared memory), else the
        value itself."""
        if not isinstance(value, _Slot):
            return value
        dtype = np.dtype(value.dtype)
        count = int(np.prod(value.shape))
        return np.frombuffer(self._mm, dtype, count, value.offset).reshape(value.shape)
