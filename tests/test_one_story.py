"""Every report of the samples and the corpus tells one story (tests/story.py): no rank named
late beside 'no rank is late', one figure per quantity, no share over the step, a verdict with
its fix or the reason there is none. The checker itself is tested on a report made to
contradict itself."""

import copy
import glob
import os

import pytest

import gpuscope
from story import contradictions

ROOT = os.path.join(os.path.dirname(__file__), "..")
SHARED = os.environ.get("GPUSCOPE_HTA_TRACES") or os.path.join(ROOT, "..", "shared", "traces",
                                                               "hta")


def _inputs() -> list[str]:
    samples = sorted(glob.glob(os.path.join(ROOT, "sample_traces", "**", "record"), recursive=True)
                     + glob.glob(os.path.join(ROOT, "sample_traces", "**", "kineto"),
                                 recursive=True)
                     + glob.glob(os.path.join(ROOT, "sample_traces", "external", "*", "")))
    shared = os.path.dirname(os.path.abspath(SHARED))
    corpus = sorted(glob.glob(os.path.join(shared, "external", "*", ""))
                    + glob.glob(os.path.join(shared, "hta", "*", "")))
    return [p.rstrip(os.sep) for p in samples + corpus]


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_report_tells_one_story(path):
    try:
        report = gpuscope.analyze(path)
    except gpuscope.GpuscopeError:
        pytest.skip("not an input gpuscope reads on its own (a folder of several parts)")
    assert contradictions(report) == []


def test_the_checker_finds_a_report_that_contradicts_itself():
    report = gpuscope.analyze(os.path.join(ROOT, "sample_traces", "imbalanced", "record"))
    assert report.stragglers and contradictions(report) == []
    bad = copy.deepcopy(report)
    fix = next(s for s in bad.suggestions if s.knob == "straggler")
    fix.why += "; no rank is late step after step; it spends +22.3 ms more per step in compute"
    bad.stragglers[0].excess_ns += 5_000_000
    found = contradictions(bad)
    assert any("beside 'no rank is late'" in f for f in found)
    assert any("not the one its suggestion gives" in f for f in found)
    assert any("a second figure" in f for f in found)
