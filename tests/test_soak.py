"""A few of scripts/soak.py's killed runs, in CI: 2 ranks SIGKILLed together at the first step,
mid-run and while TensorBoard scalars are written; each run dir analyses (or says no step was
recorded), reports the cut, and lost at most one flush interval of steps."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import soak  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["first-step", "mid-run", "tensorboard"])
def test_killed_runs_analyse(tmp_path, kind):
    r = soak.soak_once(kind, seed=11, where=str(tmp_path))
    assert r["ok"], r
    assert max(r["lost"]) <= soak.FLUSH_ROWS
    if kind != "first-step":
        assert r["steps_analysed"] > 0 and min(r["on_disk"]) >= 5
