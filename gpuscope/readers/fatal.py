"""A rank's fatal-signal trace (record/fatal.py: faulthandler's output beside its record file):
which signal ended the process, and where its training thread was."""

from __future__ import annotations

import os
import re

from ..run_format import FATAL_SUFFIX, beside
from .flight_recorder import is_library

#: faulthandler's first line: "Fatal Python error: Aborted" (Segmentation fault, Bus error,
#: Floating point exception, Illegal instruction)
_HEAD = re.compile(r"Fatal Python error: (.+)")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')
_SIGNALS = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
            "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
#: a collective's function in torch.distributed, as its frame names it
_COLLECTIVE = re.compile(r"/torch/distributed/distributed_c10d\.py$")
MAX_BYTES = 1 << 20


def read_fatal(record_path: str) -> dict | None:
    """{"signal", "error", "frames": [{file, line, func}] of the training thread (the one running
    the program's main module), "at": its innermost frame of the user's code, "collective": the
    torch.distributed call it was in}; None where the file is absent or empty."""
    path = beside(record_path, FATAL_SUFFIX)
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    head = _HEAD.search(text)
    if not head:
        return None
    error = head.group(1).strip()
    threads, cur = [], None
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            cur = []
            threads.append(cur)
        elif cur is not None:
            m = _FRAME.match(line)
            if m:
                cur.append({"file": m.group(1), "line": int(m.group(2)), "func": m.group(3)})
            elif not line.strip():
                cur = None
    main = next((t for t in threads if any(f["func"] == "<module>" for f in t)),
                threads[-1] if threads else [])
    out = {"signal": _SIGNALS.get(error, error), "error": error, "frames": main[:16]}
    user = next((f for f in main if not is_library(f["file"])), None)
    if user:
        out["at"] = f"{os.path.basename(user['file'])}:{user['line']} ({user['func']})"
    call = next((f["func"] for f in main if _COLLECTIVE.search(f["file"])), None)
    if call:
        out["collective"] = call
    return out
