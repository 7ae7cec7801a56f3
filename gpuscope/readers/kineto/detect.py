"""Finds torch.profiler trace files in a folder (or accepts a single file)."""

from __future__ import annotations

import os

SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz")


def find_trace_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path] if path.endswith(SUFFIXES) else []
    out = []
    for root, _dirs, files in os.walk(path):
        for f in files:
            if f.endswith(SUFFIXES) and not f.startswith("."):
                out.append(os.path.join(root, f))
    return sorted(out)
