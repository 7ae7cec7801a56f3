"""The one serializer of a report's results: each result class declares, field by field, how its
JSON report carries it (`JSON`: a tuple of `Col`, as Ray's `state_column` puts a column's format
on its field), and `dump` / `load` read those declarations for every class alike.

A `Col` says the JSON key, the field it holds, the unit the key is written in and from what
(inside, times are ns and shares fractions; the JSON has ms and %, DESIGN.md keys), its
rounding, and when it is left out. A column can instead be made from the object (`write`: a
figure derived from others, written and not read back), spread over several keys (`spread`:
one phase's ms and % per compute phase; a nested result's keys at the top level, as the
verdict's), or hold a nested result (`kind`: a class with `JSON`, a plain dataclass, or a typed
section of sections.py, checked as it is read).

The keys come out in the order declared, which is the report's key order (DESIGN.md); `load`
of `dump` gives back an equal object (a derived column is not read back).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any, Callable, NamedTuple

from .vocab import MS


class Unit(NamedTuple):
    """What a key's value is in, and how it is made from the field's value: over `per` and
    times `times` (ms of ns: over 1e6; % of a share: times 100), or `cast`; back the other way."""

    name: str                    # "ms", "%", "" (a count, a name, a value as it is)
    per: float = 1.0
    times: float = 1.0
    cast: Callable[[Any], Any] | None = None

    def to(self, value):
        if self.cast is not None:
            return self.cast(value)
        return value if self.per == self.times == 1.0 else value / self.per * self.times

    def back(self, value):
        if self.cast is not None:
            return self.cast(value)
        return value if self.per == self.times == 1.0 else value * self.per / self.times


AS_IS = Unit("")
WHOLE = Unit("", cast=int)               # a count
MS_OF_NS = Unit("ms", per=MS)            # ns inside, ms in the JSON
IN_MS = Unit("ms")                       # ms inside too
PCT_OF_SHARE = Unit("%", times=100.0)    # a fraction inside, % in the JSON
IN_PCT = Unit("%")                       # % inside too


def empty(value) -> bool:
    """Left out when empty, zero or None."""
    return not value


def none(value) -> bool:
    """Left out when None."""
    return value is None


class Col(NamedTuple):
    """One JSON key of a result: where its value comes from, in what unit, to how many digits,
    when it is left out."""

    key: str
    attr: str = ""               # the field it holds ("": the key's own name)
    unit: Unit = AS_IS
    digits: int | None = None    # rounded to (a float then); None: as it is
    omit: Callable[[Any], bool] | None = None   # left out when this holds of the field's value
    #: a nested result, or a list of them: a class, or the name of a typed section of
    #: sections.py (msgspec loads only where a report holds one)
    kind: type | str | None = None
    #: made from the object and the keys written so far (not read back); with `spread`, a dict
    #: of keys to add
    write: Callable[[Any, dict], Any] | None = None
    #: with `spread`: the fields read from the whole JSON object, as a dict
    read: Callable[[dict], dict] | None = None
    spread: bool = False

    @property
    def field(self) -> str:
        return self.attr or self.key


def _figure(col: Col):
    """The column's value made into its JSON unit and rounding (one number); None: as it is."""
    unit, digits = col.unit, col.digits
    if unit == AS_IS and digits is None:
        return None
    if digits is None:
        return unit.to
    return lambda v: round(float(unit.to(v)), digits)


def _nested_out(value):
    if hasattr(type(value), "JSON"):
        return dump(value)
    if hasattr(value, "__struct_fields__"):  # a typed section (msgspec)
        return value.to_dict()
    if is_dataclass(value):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(value).items()}
    return value


def _writer(col: Col, annotation: str):
    """The column as a function that adds it to a JSON object (made once per class: a report
    of 100,000 ranks writes each rank's columns)."""
    key, attr, omit, make = col.key, col.field, col.omit, col.write
    number = annotation in ("int", "float")
    if make is not None:
        def write(obj, d):
            v = make(obj, d)
            if omit is None or not omit(v):
                if col.spread:
                    d.update(v)
                else:
                    d[key] = v
        return write
    if col.spread:
        def write(obj, d):
            v = getattr(obj, attr)
            if omit is None or not omit(v):
                d.update(dump(v))
        return write
    one = _nested_out if col.kind is not None else _figure(col)
    if number and omit is None and col.digits is not None and col.unit.cast is None:
        per, times, digits = col.unit.per, col.unit.times, col.digits

        def write(obj, d):  # the common case, without a call per figure
            d[key] = round(float(getattr(obj, attr) / per * times), digits)
        return write
    if annotation in ("int | None", "float | None") and omit is none and col.digits is not None \
            and col.unit.cast is None:
        per, times, digits = col.unit.per, col.unit.times, col.digits

        def write(obj, d):  # ... and where it may be unknown (left out then)
            v = getattr(obj, attr)
            if v is not None:
                d[key] = round(float(v / per * times), digits)
        return write

    def write(obj, d):
        v = getattr(obj, attr)
        if omit is not None and omit(v):
            return
        if v is None or isinstance(v, str):
            d[key] = v
        elif one is None:  # as it is (a tuple as the list JSON has)
            d[key] = list(v) if isinstance(v, tuple) else v
        elif isinstance(v, (list, tuple)):
            d[key] = [None if x is None else one(x) for x in v]
        elif isinstance(v, dict) and col.kind is None:
            d[key] = {k: one(x) for k, x in v.items()}
        else:
            d[key] = one(v)
    return write


_WRITERS: dict[type, tuple] = {}
_READERS: dict[type, tuple] = {}


def dump(obj) -> dict:
    """An object's JSON form, by its class's `JSON` columns."""
    cls = type(obj)
    plan = _WRITERS.get(cls)
    if plan is None:
        types = _annotations(cls)
        plan = _WRITERS[cls] = tuple(_writer(c, types.get(c.field, "")) for c in cls.JSON)
    d: dict = {}
    for write in plan:
        write(obj, d)
    return d


def _nested_in(kind: type | str, value, key: str):
    if isinstance(kind, str):
        from .sections import load as load_section, named

        return load_section(named(kind), value, key)
    if hasattr(kind, "JSON"):
        return load(kind, value)
    return kind(**value)


def _reader(col: Col, annotation: str):
    """The column as a function that reads its field from a JSON object into `kw`."""
    key, attr, kind = col.key, col.field, col.kind
    if col.spread:
        if kind is not None:
            return lambda d, kw: kw.__setitem__(attr, load(kind, d))
        return lambda d, kw: kw.update(col.read(d))
    if col.write is not None:  # derived: not read back
        return lambda d, kw: None
    many = annotation.startswith(("list", "tuple"))
    whole, back = annotation == "int", col.unit.back
    if annotation in ("int", "float") and kind is None and col.unit.cast is None:
        per, times = col.unit.per, col.unit.times
        if per == times == 1.0:
            def read(d, kw):  # the common cases, without a call per figure
                if key in d:
                    kw[attr] = d[key]
        elif whole:
            def read(d, kw):
                if key in d:
                    kw[attr] = int(round(d[key] * per / times))
        else:
            def read(d, kw):
                if key in d:
                    kw[attr] = d[key] * per / times
        return read

    def read(d, kw):
        if key not in d:
            return
        v = d[key]
        if v is None or isinstance(v, str):
            kw[attr] = v
            return
        if kind is not None:
            if many and not isinstance(v, list):
                raise TypeError(f"the report's {key!r} section is not a list")
            v = [_nested_in(kind, x, key) for x in v] if many else _nested_in(kind, v, key)
        elif isinstance(v, dict):
            v = {k: back(x) for k, x in v.items()}
        elif isinstance(v, list):
            v = [back(x) for x in v]
        else:
            v = back(v)
            if whole and isinstance(v, float):
                v = int(round(v))
        kw[attr] = tuple(v) if annotation.startswith("tuple") else v
    return read


def _annotations(cls: type) -> dict[str, str]:
    """Each field's type as written ("int", "tuple[str, ...]", "float | None")."""
    return {f.name: (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
            .strip("'\"") for f in fields(cls)}


def _required(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.init and f.default is MISSING
                 and f.default_factory is MISSING)


def load(cls: type, d: dict):
    """An object of `cls` from its JSON form (`dump`'s): a key that is absent leaves the
    field's default; a field without one that is absent is a KeyError."""
    if not isinstance(d, dict):
        raise TypeError(f"{cls.__name__} is a JSON object, not {type(d).__name__}")
    plan = _READERS.get(cls)
    if plan is None:
        types = _annotations(cls)
        plan = _READERS[cls] = (tuple(_reader(c, types.get(c.field, "")) for c in cls.JSON),
                                _required(cls))
    kw: dict = {}
    for read in plan[0]:
        read(d, kw)
    missing = [name for name in plan[1] if name not in kw]
    if missing:
        raise KeyError(f"{cls.__name__}: no {', '.join(missing)}")
    return cls(**kw)


def keys(cls: type) -> list[str]:
    """The keys a class's JSON form can hold, in order: a spread nested result's own (the
    verdict's); a spread column of its own is named for what it adds (the key, or the family:
    RankResult's "phases")."""
    return [k for c in cls.JSON for k in (keys(c.kind) if c.spread and c.kind else [c.key])]


def units(cls: type) -> dict[str, str]:
    """Each plain key of a class's JSON form and the unit it is written in ("" for none)."""
    return {c.key: c.unit.name for c in cls.JSON if not c.spread and c.kind is None}


class Jsonable:
    """A result whose JSON form its `JSON` columns declare."""

    JSON: tuple[Col, ...] = ()

    def to_dict(self) -> dict:
        return dump(self)

    @classmethod
    def from_dict(cls, d: dict):
        return load(cls, d)
