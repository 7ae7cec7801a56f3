"""SIGTERM while recording. A launcher stops the other ranks with SIGTERM when one dies (torchrun
does), and by default that ends Python without its exit handlers: the last rows would be lost.
Where nobody handles SIGTERM yet (the default action), the guard takes it: the recording is
closed first (end record `terminated`), then the default action is taken as before. A handler of
the user's own is left alone; so are forked children (DataLoader workers).

Python runs a signal's handler on the main thread only, between bytecodes: a training thread
blocked in native code (a collective that never completes) would hold off the signal until the
launcher's SIGKILL. A wakeup fd (where nobody has one) lets the stall watcher see that it came
(`came`), which then ends the process itself (stall.StallWatch.sigterm).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

#: the wakeup fds a guard set; a forked child (a DataLoader worker) lets go of them at once: a
#: SIGTERM to the child must not read as the parent's
_OUR_WAKEUP_FDS: set = set()
_forks_watched = False


def _watch_forks() -> None:
    global _forks_watched
    if not _forks_watched:
        _forks_watched = True
        os.register_at_fork(after_in_child=_forget_wakeup_in_child)


def _forget_wakeup_in_child() -> None:
    if not _OUR_WAKEUP_FDS:
        return
    try:
        old = signal.set_wakeup_fd(-1)
        if old not in _OUR_WAKEUP_FDS | {-1}:
            signal.set_wakeup_fd(old)  # not ours: put back
    except (ValueError, OSError):
        pass
    for fd in list(_OUR_WAKEUP_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _OUR_WAKEUP_FDS.clear()


class SigtermGuard:
    """Takes SIGTERM for a recording. `closing()`: whether the recording is being closed (the
    signal then waits for the close: `pending`, which the close takes once done);
    `terminate(frame)`: close the recording as the signal came at `frame` (then the default
    action ends the process)."""

    def __init__(self, closing: Callable[[], bool], terminate: Callable[[object], None]):
        self._closing, self._terminate = closing, terminate
        self.handler = None       # ours, while installed
        self.wakeup: tuple[int, int] | None = None  # (read, write) fds, where we set one
        self.pending = False      # a SIGTERM came while closing: taken once closed

    def install(self) -> None:
        """Take SIGTERM where its action is the default (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return
            pid = os.getpid()

            def on_sigterm(signum, frame):
                if os.getpid() == pid and self._closing():
                    # the recording is being closed (training raised, or the loop ended) and
                    # the signal interrupted that: let the close finish, it then takes it
                    self.pending = True
                    return
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if os.getpid() == pid:
                    self._terminate(frame)
                os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_sigterm)
            self.handler = on_sigterm
            self._set_wakeup()
        except (ValueError, OSError):
            pass

    def _set_wakeup(self) -> None:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            old = None
        if old != -1:  # someone else's (an event loop's), or none could be set: left alone
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self.wakeup = (r, w)
        _watch_forks()
        _OUR_WAKEUP_FDS.update((r, w))

    def came(self) -> bool:
        """A SIGTERM reached the process since the last look (the wakeup fd's bytes)."""
        if self.wakeup is None:
            return False
        try:
            got = os.read(self.wakeup[0], 512)
        except (BlockingIOError, OSError):
            return False
        return signal.SIGTERM in got

    def release(self) -> None:
        """SIGTERM's default action back (where ours is still in place) and the wakeup fd let
        go of; a SIGTERM that came while closing is then taken."""
        handler, self.handler = self.handler, None
        if handler is not None and threading.current_thread() is threading.main_thread():
            wakeup, self.wakeup = self.wakeup, None
            if wakeup is not None:
                try:
                    now = signal.set_wakeup_fd(-1)
                    if now != wakeup[1]:  # replaced by someone since: theirs stays
                        signal.set_wakeup_fd(now)
                except (ValueError, OSError):
                    pass
                for fd in wakeup:
                    _OUR_WAKEUP_FDS.discard(fd)
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            try:
                if signal.getsignal(signal.SIGTERM) is handler:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
            except (ValueError, OSError):
                pass

    def take_pending(self) -> None:
        """The SIGTERM that came while closing, now that the close is done."""
        if self.pending:
            self.pending = False
            os.kill(os.getpid(), signal.SIGTERM)
