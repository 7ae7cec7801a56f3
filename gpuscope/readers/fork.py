"""Work in a forked process: the readers use a second core for half of a big input."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager


def _can_fork() -> bool:
    return (hasattr(os, "fork") and (os.cpu_count() or 1) >= 2
            and threading.active_count() == 1)  # never fork a threaded host (TensorBoard)


@contextmanager
def _in_child(work):
    """Run `work()` in a forked process (it sees this process's memory as it is now); yields a
    function that returns ("ok", value) or ("error", reason). On leaving the block the child is
    gone on every path: joined when it delivered, terminated (then killed) when the parent
    stopped listening early, e.g. because its own half raised."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def target():
        try:
            send.send(("ok", work()))
        except BaseException as exc:  # reported; the parent then does the work itself
            try:
                send.send(("error", repr(exc)))
            except OSError:  # the parent stopped listening
                pass
        finally:
            send.close()

    child = ctx.Process(target=target, daemon=True)
    child.start()
    send.close()

    delivered = []

    def collect():
        try:
            out = recv.recv()
        except (EOFError, OSError) as exc:
            out = "error", repr(exc)
        delivered.append(True)
        return out

    try:
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
