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
    collective: Scalar = msgspec.field(default=None, name="Collective name")
    pg_name: Scalar = msgspec.field(default=None, name="Process Group Name")


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event ("ph": "X"), the only phase gpuscope reads."""

    cat: Scalar = None
    name: Scalar = None
    tid: Scalar = None
    ts: Scalar = None
    dur: Scalar = None
    args: Args | None = None


# Every other Chrome-trace phase decodes to an empty object: its fields are skipped unread.
# (Metadata and flow events are most of a big trace: this keeps them from costing memory.)
_OTHER_PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M",
                 "V", "v", "R", "c", "(", ")")
_Other = tuple(msgspec.defstruct(f"Skip{i}", [], tag_field="ph", tag=ph, gc=False)
               for i, ph in enumerate(_OTHER_PHASES))
AnyEvent = Event | _Other[0] | _Other[1] | _Other[2] | _Other[3] | _Other[4] | _Other[5] | \
    _Other[6] | _Other[7] | _Other[8] | _Other[9] | _Other[10] | _Other[11] | _Other[12] | \
    _Other[13] | _Other[14] | _Other[15] | _Other[16] | _Other[17] | _Other[18] | _Other[19] | \
    _Other[20] | _Other[21]


class TraceDoc(msgspec.Struct, gc=False):
    traceEvents: list[AnyEvent] | None = None  # type: ignore[valid-type]
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")  # parsed as JSON on its own, later



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


def decode_trace(path: str) -> tuple[list, object]:
    """Events and the parsed `distributedInfo` (None when absent) of one trace file.

    Raises TraceFormatError with a one-line reason on bad input.
    """
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
    finally:
        del blob  # the raw text is the biggest thing held: free it before sorting events
    if doc.traceEvents is None:
        raise TraceFormatError(f"{path}: JSON without 'traceEvents': not a torch.profiler trace")
    try:  # decoded now: a Raw would keep the whole file's text alive
        info = msgspec.json.decode(doc.distributedInfo)
    except msgspec.DecodeError:
        info = "invalid"
    return doc.traceEvents, info


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
            args = Args(pick("correlation"), pick("stream"), pick("Collective name"),
                        pick("Process Group Name"))
        if e.get("ph") != "X":
            continue
        get = lambda k: e.get(k) if isinstance(e.get(k), scalar) else None  # noqa: E731
        events.append(Event(get("cat"), get("name"), get("tid"), get("ts"), get("dur"), args))
    return TraceDoc(events, msgspec.Raw(msgspec.json.encode(raw.get("distributedInfo"))))


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
