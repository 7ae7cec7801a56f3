"""Decodes one Kineto (Chrome trace) JSON file, keeping only the fields gpuscope uses.

A typed msgspec decoder materializes just ph/cat/name/pid/tid/ts/dur and a handful of args;
every other key (shapes, call stacks, occupancy ...) is skipped while parsing, never built.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib

import msgspec

from ...errors import TraceFormatError
from .text import text_buffer

class Args(msgspec.Struct, gc=False):
    correlation: int = -1
    stream: int = -1
    collective: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    #: a collective's message (kernels and record_param_comms carry them, PyTorch >= 2.1):
    #: element counts in and out, the ranks in its group, the element type ("Float", "BFloat16")
    in_nelems: int | float | str | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | float | str | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | float | str | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event ("ph": "X"), the only phase gpuscope reads. Times in µs."""

    cat: str = ""
    name: str = ""
    tid: int | str = 0
    ts: float | None = None
    dur: float = 0.0
    args: Args | None = None


#: what profile_memory=True writes on each allocation's "[memory]" instant
MemArgs = msgspec.defstruct("MemArgs", [
    ("allocated", float, msgspec.field(default=-1.0, name="Total Allocated")),
    ("reserved", float, msgspec.field(default=-1.0, name="Total Reserved")),
    ("device_type", float, msgspec.field(default=-1.0, name="Device Type"))], gc=False)


MEMORY_EVENT = "[memory]"


class Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    """An instant event ("ph": "i"): gpuscope reads the allocator's "[memory]" ones."""

    name: str = ""
    ts: float | None = None
    args: MemArgs | None = None


# Every other Chrome-trace phase decodes to an empty object: its fields are skipped unread.
# (Metadata and flow events are most of a big trace: this keeps them from costing memory.)
_OTHER_PHASES = ("B", "E", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M",
                 "V", "v", "R", "c", "(", ")")
_Other = tuple(msgspec.defstruct(f"Skip{i}", [], tag_field="ph", tag=ph, gc=False)
               for i, ph in enumerate(_OTHER_PHASES))
AnyEvent = Event | Instant | _Other[0] | _Other[1] | _Other[2] | _Other[3] | _Other[4] | \
    _Other[5] | _Other[6] | _Other[7] | _Other[8] | _Other[9] | _Other[10] | _Other[11] | \
    _Other[12] | _Other[13] | _Other[14] | _Other[15] | _Other[16] | _Other[17] | _Other[18] | \
    _Other[19] | _Other[20]


class TraceDoc(msgspec.Struct, gc=False):
    """First pass: the events stay raw (slices of the file's text, validated JSON)."""

    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")  # parsed as JSON on its own, later


class SmallDoc(msgspec.Struct, gc=False):
    """Small files: events decoded to objects in one pass (the memory is small anyway)."""

    traceEvents: list[AnyEvent] | None = None  # type: ignore[valid-type]
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")


SMALL = 8 << 20  # bytes of JSON below which one typed pass beats two
_outline = msgspec.json.Decoder(TraceDoc)
_small = msgspec.json.Decoder(SmallDoc)
_batch = msgspec.json.Decoder(list[AnyEvent])  # type: ignore[valid-type]
BATCH = 4096  # events decoded to objects at a time: bounds the memory held in Python objects


def read_bytes(path: str):
    """The file's JSON text (bytes-like); .gz is decompressed. Truncated archives give a clear
    error.

    A gzip member ends with its uncompressed size (mod 4 GiB): the text is inflated in 512 KiB
    pieces straight into a buffer of that size, so it exists once, never as pieces plus a join.
    """
    try:
        with open(path, "rb") as fh:
            data = text_buffer(os.fstat(fh.fileno()).st_size)  # mutable: see split_events
            if len(data):
                fh.readinto(data)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read trace ({exc})") from None
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return _gunzip_in_place(data)
    except (_NotSimple, zlib.error):
        pass
    try:
        return gzip.decompress(data)  # multi-member archives: gzip's own loop
    except (OSError, EOFError, zlib.error) as exc:
        text = _gunzip_prefix(data)  # cut or damaged: what inflates before the damage
        if not text.strip():
            raise TraceFormatError(f"{path}: cannot read trace ({exc}); the file may be "
                                   "truncated") from None
        return text


def _gunzip_prefix(data) -> bytearray:
    """The text a damaged or cut gzip archive inflates to up to where the damage starts (its
    JSON is then incomplete, and read event by event)."""
    inflate = zlib.decompressobj(wbits=31)
    out = bytearray()
    view = memoryview(data)
    try:
        for i in range(0, len(data), 1 << 16):
            out += inflate.decompress(view[i:i + (1 << 16)])
            if inflate.eof:
                break
    except zlib.error:
        pass
    return out


class _NotSimple(Exception):
    """The archive is not one gzip member whose size the trailer gives."""


#: deflate expands at most ~1032:1; a trailer claiming more is not a size (a truncated file ends
#: mid-stream, and its last four bytes are arbitrary)
MAX_DEFLATE_RATIO = 1032


def _gunzip_in_place(data):
    size = int.from_bytes(data[-4:], "little") if len(data) >= 18 else 0
    if size > MAX_DEFLATE_RATIO * len(data):
        raise _NotSimple
    out = text_buffer(size)
    view = memoryview(out)
    inflate = zlib.decompressobj(wbits=31)
    pos, tail = 0, data
    while not inflate.eof:
        piece = inflate.decompress(tail, 1 << 19)
        if pos + len(piece) > size:
            raise _NotSimple
        view[pos:pos + len(piece)] = piece
        pos += len(piece)
        tail = inflate.unconsumed_tail
        if not piece and not tail:
            break
    if not inflate.eof:
        raise zlib.error("the archive ends early: truncated file")
    if pos != size or inflate.unused_data:
        raise _NotSimple
    view.release()
    return out


class _Skeleton(msgspec.Struct, gc=False):
    """The document with `traceEvents` skipped over as one raw span (parsed, not built)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"null")
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")


_skeleton = msgspec.json.Decoder(_Skeleton)
_BOUNDARY = re.compile(rb"\}\s*,(\s+)\{")


def split_events(blob, parts: int = 2):
    """Cut the `traceEvents` array of a document (a writable buffer: read_bytes' bytearray or
    text buffer) into `parts` pieces of about equal size at event boundaries, in place.

    Returns (distributedInfo, [piece, ...], [(start, end), ...]): each piece is a memoryview of
    `blob` that is a JSON array of events (the separator at each cut is overwritten with "]" and
    "[" - no copy), the spans say where each lies in `blob` (text.let_go). None
    when the document does not lend itself to it; callers then decode it the usual way. A cut
    that fell inside a string would leave a piece invalid JSON, which its own decoding reports.
    """
    try:
        doc = _skeleton.decode(blob)
        info = msgspec.json.decode(doc.distributedInfo)
    except msgspec.DecodeError:
        return None
    with memoryview(doc.traceEvents) as rv:
        size = rv.nbytes
        head, tail = bytes(rv[:64]), bytes(rv[-64:])
    del doc
    start = blob.find(b"[", blob.find(b'"traceEvents"'))
    if size < 4096 or start < 0 or blob[start:start + 64] != head \
            or blob[start + size - 64:start + size] != tail:
        return None
    cuts = []  # (comma, space) of each cut, in order
    for k in range(1, max(parts, 2)):
        lo = max(start + size * k // parts, cuts[-1][1] + 1 if cuts else start)
        match = _BOUNDARY.search(blob, lo, start + size - 1)
        if match is None:
            break
        cuts.append((match.start() + match.group(0).index(b","), match.start(1)))
    if not cuts:
        return None
    view = memoryview(blob)
    spans, begin = [], start
    for comma, space in cuts:
        blob[comma] = ord("]")
        blob[space] = ord("[")
        spans.append((begin, comma + 1))
        begin = space
    spans.append((begin, start + size))
    return info, [view[a:b] for a, b in spans], spans


def events_of(text) -> list:
    """The raw events (list of msgspec.Raw) of a JSON array of events, for `batches()`."""
    return msgspec.json.decode(text, type=list[msgspec.Raw])


def decode_trace(path: str, blob=None):
    """(events, parsed `distributedInfo` or None) for one trace file, where events is a list of
    raw slices of the file's text (validated JSON, no objects yet) to pass to `batches()`.

    Raises TraceFormatError with a one-line reason on bad input.
    """
    if blob is None:
        blob = read_bytes(path)
    if not bytes(blob[:4096]).strip() and not bytes(blob).strip():
        raise TraceFormatError(f"{path}: empty file")
    try:
        doc = (_small if len(blob) < SMALL else _outline).decode(blob)
    except msgspec.ValidationError:
        try:
            raw = _loose_doc(path, blob)
        except TraceFormatError:
            return salvage(path, blob)
        return _loose_events(raw["traceEvents"]), raw.get("distributedInfo")
    except msgspec.DecodeError:
        return salvage(path, blob)
    finally:
        del blob
    if doc.traceEvents is None:
        from .what import looks_like

        raise TraceFormatError(looks_like(path))
    try:
        info = msgspec.json.decode(doc.distributedInfo)
    except msgspec.DecodeError:
        info = "invalid"
    doc.distributedInfo = msgspec.Raw(b"null")  # a Raw would keep the whole text alive
    return doc.traceEvents, info


def batches(raws: list):
    """Decode BATCH raw events at a time into typed events: only one batch of Python objects
    is alive while the caller turns them into numbers. The list is emptied as it goes: each
    batch's raw slices are let go as it is taken (a slice object a event, ~50 bytes: a fifth
    of a generated trace's text, held whole until the end before)."""
    if raws and not isinstance(raws[0], msgspec.Raw):  # already decoded (small file, loose path)
        yield raws
        return
    gone = [None] * BATCH
    for i in range(0, len(raws), BATCH):
        chunk = raws[i:i + BATCH]
        raws[i:i + BATCH] = gone[:len(chunk)]
        text = b"[" + b",".join(chunk) + b"]"
        try:
            yield _batch.decode(text)
        except msgspec.ValidationError:  # unexpected field types: convert field by field
            try:
                yield _loose_events(msgspec.json.decode(text))
            except msgspec.DecodeError:
                yield _one_by_one(chunk)
        except msgspec.DecodeError:  # e.g. invalid UTF-8 inside a string: event by event
            yield _one_by_one(chunk)
    raws.clear()


class Damaged(list):
    """Events decoded one by one; `damaged` counts those that did not parse (skipped)."""

    damaged: int = 0


def _one_by_one(chunk) -> Damaged:
    out = Damaged()
    for raw in chunk:
        e = _one(raw)
        if e is _BAD:
            out.damaged += 1
        elif e is not None:
            out.append(e)
    return out


_BAD = object()


def _one(raw) -> object:
    """One raw event decoded: an event, None (valid JSON but not an event we read), or _BAD."""
    try:
        found = _batch.decode(b"[" + bytes(raw) + b"]")
        return found[0] if len(found) == 1 else None if not found else _BAD
    except msgspec.ValidationError:
        try:
            found = _loose_events([msgspec.json.decode(raw)])
        except msgspec.DecodeError:
            return _BAD
        return found[0] if found else None
    except msgspec.DecodeError:
        return _BAD


class Salvaged(list):
    """Events read from a file that is not valid JSON as a whole, event by event."""

    damaged: int = 0
    reason: str = ""


_EVENT_SEP = re.compile(rb"\}\s*,\s*\{")
_FACTS = re.compile(rb'"gpuscope"\s*:\s*(\{[^{}]*\})')
FACTS_HEAD = 1 << 16  # torch.profiler writes its metadata before the events


def head_facts(path: str) -> dict:
    """What gpuscope.record (or gpuscope.host_facts()) told the profiler: the flat JSON object
    under the trace's top-level "gpuscope" key, read from the file's head only; {} without one
    or on any damage (a trace is read the same way with or without it). The name of the
    trace's first device (deviceProperties), where written, under DEVICE_KEY."""
    try:
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "rb") as fh:
                head = fh.read(FACTS_HEAD)
        else:
            with open(path, "rb") as fh:
                head = fh.read(FACTS_HEAD)
        cut = head.find(b'"traceEvents"')
        m = _FACTS.search(head, 0, cut if cut >= 0 else len(head))
        got = msgspec.json.decode(m.group(1)) if m else {}
        dev = _DEVICE.search(head, 0, cut if cut >= 0 else len(head))
    except (OSError, EOFError, msgspec.DecodeError, ValueError):
        return {}
    out = {k: v for k, v in got.items() if isinstance(k, str)
           and isinstance(v, (bool, int, float, str))} if isinstance(got, dict) else {}
    if dev:  # the first device's name (torch.profiler writes every visible device's)
        out[DEVICE_KEY] = dev.group(1).decode("utf-8", "replace")
    return out
_INFO = re.compile(rb'"distributedInfo"\s*:\s*(\{[^{}]*\})')
_DEVICE = re.compile(rb'"deviceProperties"\s*:\s*\[\s*\{[^{}]*?"name"\s*:\s*"([^"\\]{1,200})"')
#: the key under which head_facts gives the trace's device name (deviceProperties), not a knob
DEVICE_KEY = "__device__"


def salvage(path: str, blob) -> tuple[Salvaged, object]:
    """A trace that is not valid JSON (cut mid-write, bytes damaged): its events are cut apart
    at event boundaries and decoded one by one; the ones that parse are kept and the damaged
    ones counted. Only when none parses is the file an error."""
    try:
        msgspec.json.decode(blob)
        reason = "unexpected structure"
    except msgspec.DecodeError as exc:
        reason = str(exc)
    data = bytes(blob)
    key = data.find(b'"traceEvents"')
    start = data.find(b"[", key) if key >= 0 else -1
    if start < 0:
        raise TraceFormatError(f"{path}: not valid JSON ({reason}); truncated or corrupt trace, "
                               "and no 'traceEvents' to read") from None
    body = data[start + 1:]
    out, damaged = Salvaged(), 0
    pos = body.find(b"{")
    cuts = [m.start() for m in _EVENT_SEP.finditer(body)]
    bounds = []
    for c in cuts:
        bounds.append((pos, c + 1))
        pos = body.find(b"{", c + 1)
    if pos >= 0:
        end = body.rfind(b"}")
        bounds.append((pos, max(end + 1, pos)))
    for a, b in bounds:
        e = _one(body[a:b])
        if e is _BAD:
            damaged += 1
        elif e is not None:
            out.append(e)
    if not out:
        raise TraceFormatError(f"{path}: not valid JSON ({reason}); truncated or corrupt trace "
                               "with no event that parses") from None
    info = None
    m = _INFO.search(data)
    if m:
        try:
            info = msgspec.json.decode(m.group(1))
        except msgspec.DecodeError:
            info = "invalid"
    out.damaged, out.reason = damaged, reason
    return out, info


def _loose_doc(path: str, blob: bytes) -> dict:
    try:
        raw = msgspec.json.decode(blob)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(raw, list):  # the bare-array form of the Chrome trace format
        raw = {"traceEvents": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: JSON without a 'traceEvents' list: not a torch.profiler "
                               "trace")
    return raw


def _loose_events(items: list) -> list:
    """Events of unexpected shape, converted field by field; values that do not fit dropped."""
    def num(v, default):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default

    def integer(v):
        return v if type(v) is int and -(1 << 63) <= v < (1 << 63) else -1

    def text(v):
        return v if isinstance(v, str) else None

    events = []
    for e in items:
        if isinstance(e, dict) and e.get("ph") == "i" and e.get("name") == MEMORY_EVENT:
            a = e.get("args") if isinstance(e.get("args"), dict) else {}
            events.append(Instant(MEMORY_EVENT, num(e.get("ts"), None), MemArgs(
                num(a.get("Total Allocated"), -1.0), num(a.get("Total Reserved"), -1.0),
                num(a.get("Device Type"), -1.0))))
            continue
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        a = e.get("args") if isinstance(e.get("args"), dict) else None
        args = None if a is None else Args(
            integer(a.get("correlation")), integer(a.get("stream")), text(a.get("Collective name")),
            text(a.get("Process Group Name")), *(
                v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None
                for v in (a.get("In msg nelems"), a.get("Out msg nelems"), a.get("Group size"))),
            text(a.get("dtype")))
        tid = e.get("tid")
        events.append(Event(text(e.get("cat")) or "", text(e.get("name")) or "",
                            tid if type(tid) in (int, str) else 0, num(e.get("ts"), None),
                            num(e.get("dur"), 0.0), args))
    return events
