"""What a value read from a file may be, and a tally of what was skipped.

Readers meet files that crashed jobs, old versions and other tools wrote. Each value is checked
where it is read; what does not fit is skipped and counted per kind, and each kind becomes one
warning (how many, which file, the first line or event). Only a file with nothing usable is an
error.
"""

from __future__ import annotations

import math

from ..run_format import KNOBS

#: largest duration or count accepted, in ns (~13 days per step): larger is corruption, and the
#: bound keeps sums over a million steps inside int64
MAX_NS = 1 << 50
#: largest unix-epoch timestamp accepted in ns (year 2112)
MAX_UNIX_NS = 1 << 62
MAX_STEP = 1 << 40
#: largest rank number (and world size) accepted: 1M ranks
MAX_RANKS = 1 << 20


def column_bounds(col: str) -> tuple[int, int]:
    """A step row column's range: -1 means unknown in `synced` (which is 0 or 1 otherwise) and
    in `data_cpu_ns` (not measured); every other column is a count or a time, 0 or more."""
    lo = -1 if col in ("synced", "data_cpu_ns") else 0
    hi = MAX_STEP if col == "step" else MAX_UNIX_NS if col == "start_ns" else \
        1 if col == "synced" else MAX_NS
    return lo, hi


def is_int(v, lo: int = 0, hi: int = MAX_NS) -> bool:
    return type(v) is int and lo <= v <= hi


def is_num(v, lo: float = 0.0, hi: float = float(MAX_NS)) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and lo <= v <= hi)


def _count(v) -> bool:
    return is_int(v, 0, 1 << 53)


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float, bool)) and not (isinstance(v, float)
                                                          and not math.isfinite(v))


#: a checker for each knob type of run_format.KNOBS
KNOB_TYPES = {
    "count": _count,
    "flag": lambda v: isinstance(v, bool),
    "text": lambda v: isinstance(v, str),
    "number": lambda v: is_num(v, 0.0, 1e30),
    "fraction": lambda v: is_num(v, 0.0, 1.0),
    "scalar": _scalar,
    "layers": lambda v: isinstance(v, list) and all(
        isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and _count(x[1])
        for x in v),
    "process_groups": lambda v: isinstance(v, dict) and all(
        isinstance(r, list) and all(is_int(x, 0, 1 << 31) for x in r) for r in v.values()),
    "mesh_dims": lambda v: isinstance(v, dict) and len(v) <= 4096 and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
    "windows": lambda v: isinstance(v, list) and len(v) <= 64 and all(
        isinstance(w, list) and len(w) == 2 and all(_count(x) for x in w) and w[0] <= w[1]
        for w in v),
    "steps": lambda v: isinstance(v, list) and len(v) <= 64 and all(_count(x) for x in v),
    "flops_by_dtype": lambda v: isinstance(v, dict) and 0 < len(v) <= 16 and all(
        isinstance(k, str) and is_int(x, 0, 1 << 62) for k, x in v.items()),
    "texts": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def _knob_ok(key: str, v) -> bool:
    """A knob's value has its declared type (run_format.KNOBS; None: not known); one not
    declared is kept when it is a JSON scalar (shown as it is, read by no analysis)."""
    if v is None:
        return True
    kind = KNOBS.get(key)
    return KNOB_TYPES[kind](v) if kind is not None else _scalar(v)


def clean_knobs(knobs) -> tuple[dict, int]:
    """(knobs whose values have the type the analysis expects, how many were dropped)."""
    if not isinstance(knobs, dict):
        return {}, 1
    out, bad = {}, 0
    for k, v in knobs.items():
        if _knob_ok(k, v):
            out[k] = v
        else:
            bad += 1
    return out, bad


class Tally:
    """Counts skipped items per kind for one file; `warnings()` gives one line per kind."""

    def __init__(self, name: str, unit: str = "line"):
        self.name, self.unit = name, unit
        self.kinds: dict[str, list] = {}  # kind -> [count, first position]

    def add(self, kind: str, where, n: int = 1) -> None:
        seen = self.kinds.get(kind)
        if seen is None:
            self.kinds[kind] = [n, where]
        else:
            seen[0] += n

    def warnings(self) -> list[str]:
        return [f"{self.name}: {n} {kind} skipped (first at {self.unit} {where})"
                for kind, (n, where) in self.kinds.items()]


def finite(x, default: float = 0.0) -> float:
    """x as a finite float (for report fields computed from data)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) else default
