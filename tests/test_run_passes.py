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


def test_the_passes_order_holds_what_each_declares_it_reads():
    from gpuscope.analyze.passes import out_of_order

    assert out_of_order(run.PASSES) == []
    # the check sees a pass moved before what it reads: ops needs the stragglers
    moved = (run.prepare, run.add_up, run.classify, run.ops, run.stragglers) + run.PASSES[5:]
    assert out_of_order(moved) == ["ops reads stragglers before any pass writes it"]
    # every field of the shared state is an input or some pass's
    import dataclasses

    from gpuscope.analyze.passes import INPUTS

    written = set(INPUTS).union(*(p.writes for p in run.PASSES))
    assert {f.name for f in dataclasses.fields(run.Analysis)} - written == set()


def _touched(table) -> dict:
    """{pass name: (fields read, fields set)} of one analysis of `table`, watched field by field."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(run.Analysis)}
    log: dict = {}

    class Watched(run.Analysis):
        def __getattribute__(self, k):
            now = object.__getattribute__(self, "__dict__").get("_pass")
            if now and k in fields:
                log.setdefault(now, (set(), set()))[0].add(k)
            return object.__getattribute__(self, k)

        def __setattr__(self, k, v):
            now = self.__dict__.get("_pass")
            if now and k in fields:
                log.setdefault(now, (set(), set()))[1].add(k)
            object.__setattr__(self, k, v)

    a = Watched(table, TH0.for_source(table.source), list(table.warnings))
    for p in run.PASSES:
        object.__setattr__(a, "_pass", p.__name__)
        p(a)
    return log


@pytest.mark.parametrize("case", ["balanced", "data", "comm", "stalled", "kineto", "modules"])
def test_each_pass_reads_and_writes_only_what_it_declares(case):
    """The declarations are true: on inputs of every kind (a recorded run with collectives and
    memory, a stalled one, profiler traces with ops, CUDA module timings), each pass touches
    only the fields it declares (reading what it wrote itself is its own business)."""
    import os

    from gpuscope.readers import read_path

    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    paths = {"data": "old_recorder/data/record", "comm": "old_recorder/comm/record",
             "stalled": "stalled", "kineto": "jitter/kineto", "modules": "cuda_modules/record"}
    table = (table_from_rows(balanced(6, 2, data=30, compute=10)) if case == "balanced"
             else read_path(os.path.join(fixtures, paths[case])))
    log = _touched(table)
    for p in run.PASSES:
        read, wrote = log.get(p.__name__, (set(), set()))
        assert wrote <= p.writes, (p.__name__, wrote - p.writes)
        assert read <= p.reads | p.writes, (p.__name__, read - p.reads - p.writes)
