"""The committed sample traces (real 2-rank runs, scripts/make_samples.py) get the verdict each
was built for, from the gpuscope record and from the torch.profiler traces of the same run."""

import json
import os

import pytest

import gpuscope

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
MANIFEST = json.load(open(os.path.join(SAMPLES, "MANIFEST.json")))["scenarios"]


@pytest.mark.parametrize("source", ["record", "kineto"])
@pytest.mark.parametrize("scenario", sorted(MANIFEST))
def test_sample_gets_its_verdict(scenario, source):
    d = gpuscope.analyze(os.path.join(SAMPLES, scenario, source)).to_dict()
    assert d["source"] == source
    assert d["verdict"] == MANIFEST[scenario]["expected"], d["time_by_label"]
    assert d["ranks_analysed"] == 2
    if scenario == "imbalanced":
        assert d["stragglers"] == [1]
    else:
        assert d["stragglers"] == []


def test_samples_are_small():
    for root, _, files in os.walk(SAMPLES):
        for f in files:
            assert os.path.getsize(os.path.join(root, f)) < 1_000_000, f


def test_kineto_sample_has_two_profiler_cycles_per_rank():
    from gpuscope.readers import read_path as load_table

    t = load_table(os.path.join(SAMPLES, "compute", "kineto"))
    assert all(len(info.meta["files"]) == 2 for info in t.ranks.values())
    assert t.frame.groupby("rank")["step"].nunique().min() >= 8
