"""Where a fatal signal ended the process: SIGABRT (a C++ library aborting it: gloo on some
collective mismatches, NCCL on an error), SIGSEGV, SIGBUS, SIGFPE, SIGILL. Python's own
faulthandler writes every thread's stack into a file beside the record
(rank-N.gpuscope.fatal), where nobody has faulthandler on already (theirs is left alone); the
file is removed when the recording closes without one. Nothing runs per step."""

from __future__ import annotations

import faulthandler
import os

from ..run_format import FATAL_SUFFIX, beside


def fatal_path(record_path: str) -> str:
    return beside(record_path, FATAL_SUFFIX)


def watch_fatal(record_path: str):
    """Turn faulthandler on into the file beside the record; returns what turns it off again
    (and removes the file when nothing was written), or None where it is someone else's."""
    if faulthandler.is_enabled():
        return None
    path = fatal_path(record_path)
    fh = open(path, "w")
    try:
        faulthandler.enable(file=fh, all_threads=True)
    except Exception:
        fh.close()
        os.remove(path)
        raise

    def close():
        try:
            faulthandler.disable()
        finally:
            fh.close()
            drop_if_empty(record_path)

    return close


def drop_if_empty(record_path: str | None) -> None:
    """The trace file goes where no fatal signal wrote into it."""
    try:
        path = fatal_path(record_path)
        if os.path.getsize(path) == 0:
            os.remove(path)
    except (OSError, TypeError, AttributeError):
        pass
