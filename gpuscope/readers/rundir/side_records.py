"""A rank file's header and side records (run_format.SIDE_RECORDS): checked as they are read,
one handler per kind (SIDE_HANDLERS; tests/test_vocabulary.py checks they agree), what does not fit
counted in the file's Tally."""

from __future__ import annotations

import msgspec

from ...errors import TraceFormatError
from ...run_format import NVML_FIELDS, NVML_FIELDS_V1, SCHEMA, STEP_COLUMNS, parse_file_name
from ..memory_records import memory_ok
from ..module_records import modules_ok
from ..routing_records import routing_ok
from ..validate import MAX_RANKS, MAX_STEP, MAX_UNIX_NS, Tally, clean_knobs, is_int, is_num
from .rank_data import RankFile


_decode = msgspec.json.Decoder().decode


def read_header(path: str, line: bytes) -> dict:
    try:
        header = _decode(line)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: first line is not a gpuscope header ({exc})") from None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise TraceFormatError(f"{path}: not a {SCHEMA} file (schema={header.get('schema')!r})"
                               if isinstance(header, dict) else f"{path}: not a gpuscope file")
    return header


def check_header(header: dict, name: str, tally: Tally) -> None:
    """Fields of the header that do not fit are replaced by what can be known without them."""
    if not is_int(header.get("rank"), 0, MAX_RANKS - 1):
        parsed = parse_file_name(name)
        header["rank"] = parsed[0] if parsed else 0
        tally.add("header field(s) ('rank': taken from the file name)", 1)
    for key, lo, hi in (("world_size", 1, MAX_RANKS), ("start_unix_ns", 0, MAX_UNIX_NS),
                        ("pid", 0, 1 << 40), ("local_rank", 0, 1 << 31)):
        if key in header and header[key] is not None and not is_int(header[key], lo, hi):
            del header[key]
            tally.add(f"header field(s) ('{key}')", 1)
    for key in ("host", "run_id", "comm_timing", "placement_source", "comm_key"):
        if key in header and not isinstance(header[key], str):
            del header[key]
            tally.add(f"header field(s) ('{key}')", 1)
    cols = header.get("columns")
    if not (isinstance(cols, list) and cols and all(isinstance(c, str) for c in cols)
            and len(set(cols)) == len(cols) and cols[:3] == list(STEP_COLUMNS[:3])):
        if cols is not None:
            tally.add("header field(s) ('columns': the current layout assumed)", 1)
        header["columns"] = list(STEP_COLUMNS)


def _device_ok(item) -> bool:
    return (isinstance(item, dict) and is_int(item.get("step"), 0, MAX_STEP)
            and all(isinstance(k, str) and is_int(v) for k, v in item.items()))


def _nvml_ok(sample) -> bool:
    return (isinstance(sample, list) and len(sample) in (NVML_FIELDS_V1, len(NVML_FIELDS))
            and is_int(sample[0], 0, MAX_UNIX_NS)
            and all(v is None or is_num(v, 0.0, 1e18) for v in sample[1:]))


def _dataparallel_ok(d) -> bool:
    def ns_map(m):
        return m is None or (isinstance(m, dict) and all(is_int(v, 0, MAX_UNIX_NS)
                                                         for v in m.values()))

    return (isinstance(d, dict) and isinstance(d.get("devices", []), list)
            and all(isinstance(x, (str, int)) for x in d.get("devices", []))
            and (d.get("steps") is None or is_int(d.get("steps"), 0, MAX_STEP))
            and all(ns_map(d.get(k)) for k in ("forward_n", "forward_ns", "host_ns"))
            and (d.get("peak_bytes") is None or (isinstance(d["peak_bytes"], dict) and all(
                v is None or is_int(v, 0, 1 << 60) for v in d["peak_bytes"].values()))))


def _end_ok(end) -> bool:
    return (isinstance(end, dict)
            and all(is_int(end[k], 0, MAX_UNIX_NS) for k in ("steps", "end_unix_ns") if
                    end.get(k) is not None)
            and isinstance(end.get("warnings", []), list)
            and all(isinstance(end[k], str) for k in ("recorder_error", "comm_hook", "terminated",
                                                    "error")
                    if end.get(k) is not None))


def _stall_ok(x) -> bool:
    """A stall record (or its end): a dict with the step and times the watcher writes."""
    return isinstance(x, dict) and is_int(x.get("step"), 0, MAX_STEP) and all(
        is_int(x[k], 0, MAX_UNIX_NS) for k in ("since_unix_ns", "noticed_unix_ns",
                                                "resumed_unix_ns") if k in x)


def _knobs_record(value, out: "RankFile", knobs: dict, tally: Tally, at: int) -> None:
    clean, bad = clean_knobs(value)
    knobs.update(clean)
    if bad:
        tally.add("knob value(s) of the wrong type", at, bad)


def _end_record(value, out: "RankFile", knobs: dict, tally: Tally, at: int) -> None:
    if _end_ok(value):
        out.end = value
    else:
        tally.add("malformed end record(s)", at)


def _samples(attr: str, ok, what: str):
    """A record holding a list of samples: the good ones join `attr`, the rest are counted."""
    def handle(value, out, knobs, tally, at):
        items = value if isinstance(value, list) else [None]
        good = [x for x in items if ok(x)]
        getattr(out, attr).extend(good)
        if len(good) < len(items):
            tally.add(what, at, len(items) - len(good))
    return handle


def _one(attr: str, ok, what: str, replaces: bool = False):
    """A record that is one item: appended to `attr` (or replacing it), else counted."""
    def handle(value, out, knobs, tally, at):
        if not ok(value):
            tally.add(what, at)
        elif replaces:
            setattr(out, attr, value)
        else:
            getattr(out, attr).append(value)
    return handle


#: one handler for each of run_format.SIDE_RECORDS (tests/test_vocabulary.py checks they agree)
SIDE_HANDLERS = {
    "knobs": _knobs_record,
    "end": _end_record,
    "device": _samples("device", _device_ok, "malformed device time(s)"),
    "nvml": _samples("nvml", _nvml_ok, "malformed NVML sample(s)"),
    "memory": _one("memory", memory_ok, "malformed memory record(s)"),
    "routing": _one("routing", routing_ok, "malformed all-to-all row record(s)"),
    "modules": _one("modules", modules_ok, "malformed module time record(s)"),
    "dataparallel": _one("dataparallel", _dataparallel_ok, "malformed DataParallel record(s)",
                         replaces=True),
    "stall": _one("stalls", _stall_ok, "malformed stall record(s)"),
    "stall_end": _one("stall_ends", _stall_ok, "malformed stall_end record(s)"),
}


def side_record(obj: dict, out: "RankFile", knobs: dict, tally: Tally, at: int) -> None:
    """A side record (run_format.SIDE_RECORDS): its handler; keys it does not know are
    left (a newer recorder's)."""
    for key, value in obj.items():
        handle = SIDE_HANDLERS.get(key)
        if handle is not None:
            handle(value, out, knobs, tally, at)
