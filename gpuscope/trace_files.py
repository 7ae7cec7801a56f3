"""Which files are torch.profiler traces: one rule, for the CLI (readers) and the TensorBoard tab.

`*.pt.trace.json[.gz]` (tensorboard_trace_handler's names) always are. Other `*.json[.gz]`
(`rank-0.json.gz`, HTA's test data, export_chrome_trace's own names) are too, unless the file is
small, parses as JSON, and is plainly something else (a MANIFEST, a config: a JSON object without
"traceEvents", or a list of anything but events). A damaged file is kept: reading it reports the
damage instead of the file being silently left out.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib

SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz")
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
SNIFF_MAX_BYTES = 64 << 10  # larger files are taken as traces unread (configs are small)


def is_trace_name(name: str) -> bool:
    return name.endswith(SUFFIXES) and not name.startswith(".")


def _plainly_not_a_trace(path: str) -> bool:
    try:
        if os.path.getsize(path) > SNIFF_MAX_BYTES:
            return False
        with open(path, "rb") as fh:
            blob = fh.read(SNIFF_MAX_BYTES + 1)
        if blob[:2] == b"\x1f\x8b":
            blob = gzip.decompress(blob)
        doc = json.loads(blob)
    except (OSError, EOFError, ValueError, zlib.error, RecursionError):
        return False  # unreadable: a damaged trace, to be reported by the reader
    if isinstance(doc, dict):
        return "traceEvents" not in doc
    if isinstance(doc, list):
        return not any(isinstance(e, dict) and "ph" in e for e in doc[:100])
    return True


def is_trace_file(path: str) -> bool:
    name = os.path.basename(path)
    if not is_trace_name(name):
        return False
    return name.endswith(TRACE_SUFFIXES) or not _plainly_not_a_trace(path)


def find_trace_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path] if is_trace_name(os.path.basename(path)) else []
    out = []
    for root, _dirs, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            if is_trace_file(full):
                out.append(full)
    return sorted(out)


def file_size(path: str) -> int:
    """Size in bytes, 0 for a file that cannot be read."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
