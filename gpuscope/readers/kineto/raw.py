"""A trace file's events as they are (every key kept), for exports that merge the ranks' own
events (render/perfetto.py takes this function from the command line: a renderer opens no
input of its own)."""

from __future__ import annotations

import gzip

import msgspec


def raw_trace(path: str) -> dict:
    """The trace document at `path` ({"traceEvents": [...], ...}); ValueError, OSError or
    msgspec.DecodeError when it is not one."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:2] == b"\x1f\x8b":
        blob = gzip.decompress(blob)
    doc = msgspec.json.decode(blob)
    if isinstance(doc, list):  # the JSON array form of the format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("no traceEvents list")
    return doc
