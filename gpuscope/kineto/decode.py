"""Decodes one Kineto (Chrome trace) JSON file, keeping only the fields gpuscope uses.

A typed msgspec decoder materializes just ph/cat/name/pid/tid/ts/dur and a handful of args;
every other key (shapes, call stacks, occupancy ...) is skipped while parsing, never built.
"""

from __future__ import annotations

import gzip
import os
import zlib

import msgspec

from ..errors import TraceFormatError

Scalar = int | float | str | None


class Args(msgspec.Struct, gc=False):
    correlation: Scalar = None
    stream: Scalar = None
    external_id: Scalar = msgspec.field(default=None, name="External id")
    collective: Scalar = msgspec.field(default=None, name="Collective name")
    pg_name: Scalar = msgspec.field(default=None, name="Process Group Name")
    name: Scalar = None  # metadata events ("M"): process / thread names


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: Scalar = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: Scalar = None
    dur: Scalar = None
    args: Args | None = None


class TraceDoc(msgspec.Struct, gc=False):
    traceEvents: list[Event] | None = None
    distributedInfo: msgspec.Raw | None = None
    deviceProperties: msgspec.Raw | None = None
    displayTimeUnit: Scalar = None


_typed = msgspec.json.Decoder(TraceDoc)


def read_bytes(path: str) -> bytes:
    """The file's JSON text; .gz is decompressed. Truncated archives give a clear error."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                return gzip.decompress(fh.read())
            return fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{path}: cannot read trace ({exc}); the file may be truncated") \
            from None


def decode_trace(path: str) -> TraceDoc:
    """Decode one trace file; raises TraceFormatError with a one-line reason on bad input."""
    blob = read_bytes(path)
    if not blob.strip():
        raise TraceFormatError(f"{path}: empty file")
    try:
        doc = _typed.decode(blob)
    except msgspec.ValidationError as exc:
        doc = _decode_loose(path, blob, exc)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc}); truncated or corrupt trace") \
            from None
    if doc.traceEvents is None:
        raise TraceFormatError(f"{path}: JSON without 'traceEvents': not a torch.profiler trace")
    return doc


def _decode_loose(path: str, blob: bytes, first_error) -> TraceDoc:
    """Slow path for traces whose fields have unexpected types: decode untyped, then convert
    field by field, dropping values that do not fit."""
    try:
        raw = msgspec.json.decode(blob)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(raw, list):  # the bare-array form of the Chrome trace format
        raw = {"traceEvents": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: JSON without a 'traceEvents' list: not a torch.profiler "
                               f"trace ({first_error})")
    scalar = (int, float, str)
    events = []
    for e in raw["traceEvents"]:
        if not isinstance(e, dict):
            continue
        a = e.get("args") if isinstance(e.get("args"), dict) else None
        args = None
        if a is not None:
            pick = lambda k: a.get(k) if isinstance(a.get(k), scalar) else None  # noqa: E731
            args = Args(pick("correlation"), pick("stream"), pick("External id"),
                        pick("Collective name"), pick("Process Group Name"), pick("name"))
        get = lambda k: e.get(k) if isinstance(e.get(k), scalar) else None  # noqa: E731
        events.append(Event(str(e.get("ph", "")), get("cat"), get("name"), get("pid"), get("tid"),
                            get("ts"), get("dur"), args))
    dist = raw.get("distributedInfo")
    return TraceDoc(events, msgspec.Raw(msgspec.json.encode(dist)) if dist is not None else None)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
