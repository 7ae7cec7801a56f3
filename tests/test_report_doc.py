"""docs/report.md describes the JSON report as it is: every key a report writes is documented
in the row of its section, and the units the doc gives hold in the figures (shares in % except
verdict_share and time_by_label, fractions; a rank's <part>_ms is its <part>_pct of step_ms)."""

import os
import re

import pytest

import gpuscope

ROOT = os.path.join(os.path.dirname(__file__), "..")
SAMPLES = os.path.join(ROOT, "sample_traces")
RUNS = sorted(os.path.relpath(os.path.join(top, d), SAMPLES)
              for top, dirs, _ in os.walk(SAMPLES) if "external" not in top
              for d in dirs if d in ("record", "kineto"))


def _rows() -> dict[str, str]:
    """Each documented top-level key -> the text of its row in the JSON table."""
    with open(os.path.join(ROOT, "docs", "report.md")) as fh:
        text = fh.read().split("## JSON", 1)[1]
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        keys, meaning = line.split(" | ", 1)
        for k in re.findall(r"`([a-z_]+)(?:\[\])?`", re.sub(r"\([^)]*\)", "", keys)):
            rows[k] = meaning
    return rows


DOC = _rows()


@pytest.fixture(scope="module", params=RUNS)
def report(request):
    return gpuscope.analyze(os.path.join(SAMPLES, request.param)).to_dict()


def _named(text: str) -> set[str]:
    """The keys a row names: `key`, `forward_ms`/`_pct` (both), and `<part>_ms` for each part
    the row names."""
    names = set(re.findall(r"`([A-Za-z_0-9]+)(?:\[\])?`", text))
    names |= {m + "_pct" for m in re.findall(r"`([a-z_]+)_ms`/`_pct`", text)}
    for suffix in re.findall(r"`<part>(_[a-z]+)`", text):
        names |= {n + suffix for n in list(names)}
    return names


def test_every_key_of_a_report_is_documented_in_its_row(report):
    for key, value in report.items():
        assert key in DOC, f"docs/report.md has no row for `{key}`"
        if key in ("knobs", "thresholds", "time_by_label"):
            continue  # open-ended maps: knob names, thresholds, labels
        missing = _keys(value) - _named(DOC[key])
        assert not missing, f"`{key}` row of docs/report.md lacks {sorted(missing)}"


#: maps whose keys are names from the run, not fields: collective kinds, mesh dimensions, ...
OPEN_MAPS = {"comm_by_kind", "by_dim", "phases_pct", "throttle", "kinds_ms", "types_us"}


def _keys(value) -> set[str]:
    """Every field name inside a section, at any depth (open-ended maps' own keys aside)."""
    out: set[str] = set()
    for item in (value if isinstance(value, list) else [value]):
        if isinstance(item, dict):
            for k, v in item.items():
                out.add(k)
                if k in OPEN_MAPS and isinstance(v, dict):
                    for inner in v.values():
                        out |= _keys(inner)
                else:
                    out |= _keys(v)
    return out


def test_the_units_the_doc_gives_hold(report):
    assert 0 <= report["verdict_share"] <= 1  # a fraction, as the doc says
    shares = report["time_by_label"]
    assert all(0 <= v <= 1 for v in shares.values()) and sum(shares.values()) == \
        pytest.approx(1, abs=0.02)
    for r in report["ranks"]:
        for key, v in r.items():
            if key.endswith("_pct") and v is not None:
                assert -0.5 <= v <= 100.5, (key, v)  # in %
        for part in ("data", "compute", "comm", "comm_exposed", "wait", "other"):
            assert r[f"{part}_ms"] == pytest.approx(r[f"{part}_pct"] * r["step_ms"] / 100,
                                                    rel=0.01, abs=0.02), part
    for s in report["steps"]:
        for key, v in s.items():
            if key.endswith("_pct") and v is not None:
                assert -0.5 <= v <= 100.5, (key, v)


def test_the_doc_rows_name_no_key_a_report_never_writes():
    """A documented top-level key that no sample report writes is one of the 'only when' keys."""
    seen = set()
    for run in RUNS:
        seen |= set(gpuscope.analyze(os.path.join(SAMPLES, run)).to_dict())
    for key in set(DOC) - seen:
        assert "only" in DOC[key][:60], f"`{key}`: documented, never written, never 'only when'"
