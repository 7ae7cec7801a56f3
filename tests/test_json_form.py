"""The one serializer (gpuscope/json_form.py): every result class declares its JSON columns, each
key says its unit, and dump / load agree, on tables (no analysis run)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest

from gpuscope import results
from gpuscope.json_form import (IN_PCT, MS_OF_NS, PCT_OF_SHARE, Col, Jsonable, dump, empty, keys,
                                load, units)

CLASSES = [c for c in vars(results).values()
           if isinstance(c, type) and issubclass(c, Jsonable) and c is not Jsonable]


def test_every_result_class_declares_its_columns():
    names = {c.__name__ for c in CLASSES}
    assert {"Verdict", "Jitter", "Straggler", "MinorStraggler", "StageResult", "PipelineResult",
            "Suggestion", "StepResult", "RankResult", "ReportData", "TelemetrySummary"} <= names
    for cls in CLASSES:
        assert cls.JSON, cls
        attrs = {f.name for f in fields(cls)}
        for col in cls.JSON:  # a column holds a field of its class, or is made / spread
            assert col.write or col.spread or col.field in attrs, (cls.__name__, col)
        assert len(keys(cls)) == len(set(keys(cls))), f"{cls.__name__}: a key written twice"


#: a key's name ends in its unit
SUFFIXES = {"_ms": "ms", "_ms_range": "ms", "_pct": "%", "_w": "W", "_mhz": "MHz", "_c": "C"}
#: keys that map names to figures in a unit (a collective kind -> its ms)
MAPS = {"comm_by_kind": "ms"}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_key_s_name_says_its_unit(cls):
    """Ray's state_column: the unit is on the column; a key named _ms is written in ms, one
    named _pct in %, ..., and a column with a unit is named for it."""
    for key, unit in units(cls).items():
        said = MAPS.get(key) or next((u for s, u in SUFFIXES.items() if key.endswith(s)), "")
        assert unit == said, (cls.__name__, key, unit)


@dataclass
class _Made(Jsonable):
    """A class of its own: each kind of column once."""

    wait_ns: int
    share: float
    pct: float
    tags: tuple = ()
    extra: dict = field(default_factory=dict)
    note: str | None = None

    JSON = (Col("wait_ms", "wait_ns", MS_OF_NS, 3), Col("share_pct", "share", PCT_OF_SHARE, 1),
            Col("pct", unit=IN_PCT, digits=2), Col("tags", omit=empty),
            Col("doubled_ms", write=lambda o, d: 2 * d["wait_ms"]),
            Col("extra", spread=True, write=lambda o, d: o.extra,
                read=lambda d: {"extra": {k: v for k, v in d.items() if k.startswith("x_")}}),
            Col("note"))


def test_dump_writes_units_rounding_omissions_and_derived_keys_in_order():
    d = dump(_Made(1_234_567, 0.12345, 7.777, ("a",), {"x_1": 5}))
    assert d == {"wait_ms": 1.235, "share_pct": 12.3, "pct": 7.78, "tags": ["a"],
                 "doubled_ms": 2.47, "x_1": 5, "note": None}
    assert list(d) == ["wait_ms", "share_pct", "pct", "tags", "doubled_ms", "x_1", "note"]
    assert "tags" not in dump(_Made(1, 0.5, 1.0))  # left out when empty


def test_load_gives_back_the_object_in_its_units_and_whole_ns():
    back = load(_Made, {"wait_ms": 1.235, "share_pct": 25.0, "pct": 7.78, "tags": ["a"],
                        "doubled_ms": 99.0, "x_1": 5, "note": "n"})
    assert back == _Made(1_235_000, 0.25, 7.78, ("a",), {"x_1": 5}, "n")  # not the derived
    assert isinstance(back.wait_ns, int) and isinstance(back.tags, tuple)
    with pytest.raises(KeyError, match="share"):  # a field without a default must be there
        load(_Made, {"wait_ms": 1.0, "pct": 1.0})


def test_a_real_report_reads_back_what_it_wrote():
    import os

    import gpuscope

    rep = gpuscope.analyze(os.path.join(os.path.dirname(__file__), "..", "sample_traces",
                                        "imbalanced", "record"))
    d = rep.to_dict()
    back = type(rep).from_dict(d)  # the figures as the JSON rounds them
    assert back.to_dict() == d and type(rep).from_dict(back.to_dict()) == back
    assert back.ranks[0].step_ns == pytest.approx(rep.ranks[0].step_ns, abs=500)
