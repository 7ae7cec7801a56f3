"""The accuracy corpus: every folder of real traces from other projects gets what is known of it
(sample_traces/external/known.json, from each folder's README), every report adds up, and no
confidence "high" comes with a wrong answer. The checks themselves live in scripts/accuracy.py,
which also writes the table of docs/accuracy.md."""

import os

import pytest

from helpers import script

ROOT = os.path.join(os.path.dirname(__file__), "..")
accuracy = script("accuracy")

FOLDERS = accuracy.folders()
KNOWN = accuracy.known()
REQUIRE_SHARED = os.environ.get("GPUSCOPE_REQUIRE_SHARED") == "1"


def test_every_folder_has_its_known_facts_and_every_fact_a_folder():
    if not any(n.startswith("shared/") for n in FOLDERS):
        assert not REQUIRE_SHARED, "../shared/traces is missing"
        pytest.skip("../shared/traces is not beside the repository")
    assert sorted(FOLDERS) == sorted(KNOWN)
    assert len([n for n in FOLDERS if n.startswith("external/")]) >= 5


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_a_corpus_folder_gets_what_is_known_of_it(name):
    import gpuscope

    if name not in FOLDERS:
        assert not REQUIRE_SHARED, f"{name} is missing"
        pytest.skip(f"{name} is not here (../shared/traces beside the repository)")
    report = gpuscope.analyze(FOLDERS[name])
    failed = [(k, got) for k, ok, got in accuracy.check(FOLDERS[name], KNOWN[name]["checks"],
                                                        report) if not ok]
    assert failed == [], (KNOWN[name]["known"], failed)


def test_a_failed_fact_fails_the_case():
    # the checks can fail: a made-up fact about a real folder is caught
    import gpuscope

    name = "external/tracelens_h100_qwen"
    report = gpuscope.analyze(FOLDERS[name])
    wrong = {"verdict_in": ["comm-bound"], "rank_pct": {"compute": [0, 10]}, "ranks": 3,
             "confidence_at_most": "low"}
    got = {k: ok for k, ok, _ in accuracy.check(FOLDERS[name], wrong, report)}
    assert got == {"verdict_in": False, "compute%": False, "ranks": False,
                   "confidence_at_most": True, "adds up": True}


SAMPLE_DIRS = sorted(os.path.relpath(dp, os.path.join(ROOT, "sample_traces"))
                     for dp, dirs, files in os.walk(os.path.join(ROOT, "sample_traces"))
                     if not dirs and any(f.endswith((".jsonl", ".json.gz")) for f in files)
                     and os.sep + "external" not in os.sep + os.path.relpath(
                         dp, os.path.join(ROOT, "sample_traces")))


@pytest.mark.parametrize("rel", SAMPLE_DIRS)
def test_every_sample_report_adds_up(rel):
    import gpuscope
    from gpuscope.analyze.invariants import violations

    report = gpuscope.analyze(os.path.join(ROOT, "sample_traces", rel))
    assert violations(report) == []
    assert not [w for w in report.warnings if "did not add up" in w or "can recover" in w]
    assert len(SAMPLE_DIRS) >= 12
