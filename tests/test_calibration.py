"""Calibration that stays (issue 69, 2.): what `gpuscope try` measured on a host is kept in one
small file and corrects the next estimates of the same knobs on that host, said on each; other
hosts, other knobs, a damaged file or GPUSCOPE_CALIBRATION=off leave the model's estimates."""

from __future__ import annotations

import json

import pytest

from gpuscope import calibration
from gpuscope.analyze.run import analyze_table
from gpuscope.thresholds import Thresholds
from helpers import balanced, table_from_rows

TH = Thresholds(warmup_steps=0)
KNOBS = {"num_workers": 0, "cpu_count": 8, "local_world_size": 2, "dataloader": True,
         "persistent_workers": True}


def _trial(host="host0", knob="num_workers", est=10.0, measured=15.0):
    return {"host": host, "knob": knob, "value": 4, "estimated_ms": est,
            "measured_ms": measured, "run": "runs/x"}


def _workers(monkeypatch, where):
    monkeypatch.setenv("GPUSCOPE_CALIBRATION", str(where))
    rep = analyze_table(table_from_rows(balanced(8, 2, data=30, compute=10, comm=0.5,
                                                 data_cpu=1), knobs=KNOBS), TH)
    return next(s for s in rep.suggestions if s.knob == "num_workers")


def test_trials_on_this_host_scale_the_next_estimate_of_their_knob(tmp_path, monkeypatch):
    """Two trials of num_workers on host0 (the table's ranks run on host0 and host1) measured
    1.4x and 1.6x the model: its estimate becomes 1.5x, its range reaches 1.4x its low end and
    1.6x its high end, its gain follows, and it says from what; a trial on another host or of
    another knob changes nothing."""
    plain = _workers(monkeypatch, tmp_path / "none.json")
    where = tmp_path / "cal.json"
    assert calibration.add([_trial(measured=14.0), _trial(measured=16.0),
                            _trial(host="elsewhere", measured=40.0),
                            _trial(knob="batch_size", measured=30.0)], str(where)) == str(where)
    got = _workers(monkeypatch, where)
    assert got.estimated_step_ms == pytest.approx(plain.estimated_step_ms * 1.5)
    lo, hi = plain.estimated_step_ms_range
    assert got.estimated_step_ms_range == pytest.approx((lo * 1.4, hi * 1.6))
    assert got.gain_pct < plain.gain_pct
    assert "calibrated on this host by 2 trial(s) of num_workers" in got.why
    assert "1.40-1.60x" in got.why and str(where) in got.why
    assert "calibrated" not in plain.why


def test_kept_trials_are_the_newest_per_host_and_knob_and_bad_files_are_ignored(tmp_path,
                                                                                monkeypatch):
    where = str(tmp_path / "deep" / "cal.json")
    for i in range(calibration.KEEP + 3):
        calibration.add([_trial(measured=10.0 + i)], where)
    kept = calibration.load(where)
    assert len(kept) == calibration.KEEP
    assert [t["measured_ms"] for t in kept] == [10.0 + i for i in range(3, calibration.KEEP + 3)]
    assert calibration.add([_trial(measured=500.0)], where) is None  # 50x: a trial gone wrong
    assert len(calibration.load(where)) == calibration.KEEP
    with open(where, "w") as fh:
        fh.write('{"trials": [{"host": 1}, ')
    assert calibration.load(where) == []
    plain = _workers(monkeypatch, tmp_path / "none.json")
    assert _workers(monkeypatch, where).estimated_step_ms == plain.estimated_step_ms
    with open(where, "w") as fh:
        json.dump({"trials": [_trial(), {"host": "host0", "knob": "num_workers",
                                         "estimated_ms": "ten", "measured_ms": 3}]}, fh)
    assert len(calibration.load(where)) == 1
    monkeypatch.setenv("GPUSCOPE_CALIBRATION", "off")
    assert calibration.path() is None and calibration.add([_trial()]) is None
    assert calibration.load() == []
