"""The analysis driver (analyze/run.py): one ordered list of passes of one signature, each
runnable alone on a hand-built table, in order or with a pass of one's own added."""

import pytest

from gpuscope.analyze import run
from gpuscope.analyze.prepare import prepare
from gpuscope.errors import InputError
from gpuscope.thresholds import Thresholds
from helpers import balanced, table_from_rows

TH0 = Thresholds(warmup_steps=0)


def _state(rows, **kw):
    table = table_from_rows(rows, **kw)
    return run.Analysis(table, TH0.for_source(table.source), list(table.warnings))


def test_the_passes_run_in_the_documented_order():
    names = [p.__name__ for p in run.PASSES]
    assert names == ["prepare", "add_up", "classify", "stragglers", "ops", "telemetry",
                     "memory", "throughput", "energy", "suggest_all", "bound", "report", "check"]
    doc = run.__doc__
    # the module's docstring lists them in that order
    words = ("prepare", "add_up", "classify", "stragglers", "ops", "telemetry", "memory",
             "throughput", "energy", "suggest", "bound", "report", "check")
    at = [doc.find(f"\n    {w} ") for w in words]
    assert -1 not in at and at == sorted(at)


def test_prepare_alone_drops_empty_steps_and_the_warm_up():
    rows = balanced(5, 2, data=30, compute=10) + [{"rank": 0, "step": 9, "step_ms": 0}]
    a = _state(rows)
    a.th = Thresholds(warmup_steps=1).for_source("record")
    prepare(a)
    assert sorted(a.frame["step"].unique().tolist()) == [1, 2, 3, 4]
    assert any("of no length" in w for w in a.warnings)
    assert a.mapping is None and "wait_ns" in a.frame
    with pytest.raises(InputError, match="no steps"):
        prepare(_state([{"rank": 0, "step": 1, "step_ms": 0}]))


def test_classify_runs_on_a_prepared_table_without_a_report():
    a = _state(balanced(6, 2, data=30, compute=10))
    for p in (run.prepare, run.add_up, run.classify):
        p(a)
    assert a.verdict.label == "data-bound" and a.report is None
    assert len(a.steps) == 6 and set(a.steps["label"]) == {"data-bound"}


def test_a_pass_of_ones_own_sees_what_the_others_found():
    seen = {}

    def count_labels(a):  # e.g. a memory pass, added after the classification
        seen.update(a.steps["label"].value_counts().to_dict())
        a.warnings.append("counted")

    passes = run.PASSES[:3] + (count_labels,) + run.PASSES[3:]
    rep = run.analyze_table(table_from_rows(balanced(6, 2, data=30, compute=10)), TH0,
                            passes=passes)
    assert seen == {"data-bound": 6} and "counted" in rep.warnings
    # and the same table through the plain driver gives the same report, less that warning
    plain = run.analyze_table(table_from_rows(balanced(6, 2, data=30, compute=10)), TH0)
    assert plain.to_dict()["verdict"] == rep.to_dict()["verdict"]
    assert "counted" not in plain.warnings


def test_the_check_pass_costs_confidence_when_a_rule_is_broken():
    # a hand-built row whose parts sum past its step: add_up clips it and says so, check makes
    # the confidence pay for it (one rank: nothing else caps it)
    rows = balanced(6, 1, data=30, compute=10)
    clean = run.analyze_table(table_from_rows(rows), TH0)
    rows[0] = {**rows[0], "step_ms": 20}
    broken = run.analyze_table(table_from_rows(rows), TH0)
    assert clean.verdict.confidence == "high" and clean.verdict.evidence == ()
    assert broken.verdict.label == clean.verdict.label == "data-bound"
    assert broken.verdict.confidence == "medium"
    assert sum("did not add up" in w for w in broken.warnings) == 2
    assert broken.verdict.evidence == ("2 rule(s) of the report did not add up and were clipped",)
