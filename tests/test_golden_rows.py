"""The recorder's rows, unchanged by its rebuilding (issue 42): record files of the test
workloads reduced to what does not depend on timing (scripts/golden_rows.py: per row its step,
sync flag, samples and parts; per run each collective's calls, the header's fixed facts, the
side records' kinds and all-to-all rows) against the same made by the recorder before
(tests/fixtures/golden_rows.json, at f43949c): what the hooks log in a live run. The exact rows
of every workload's logged events are checked in the fast suite, on both row paths
(tests/test_golden_cases.py); here two torchrun workloads keep checking that the hooks still
log what they did; `python scripts/golden_rows.py --out FILE` compares all ten by hand."""

import json
import os

import pytest

from helpers import script

pytestmark = pytest.mark.slow
golden_rows = script("golden_rows")
GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden_rows.json")
#: FSDP2's functional collectives, experts' all-to-all rows (with DDP-style gradients)
IN_THE_SUITE = ("fsdp2", "experts")


def test_every_workload_has_a_golden_shape():
    with open(GOLDEN) as fh:
        golden = json.load(fh)["workloads"]
    assert sorted(golden) == sorted(golden_rows.WORKLOADS)
    assert all("error" not in v for v in golden.values())


@pytest.mark.parametrize("name", IN_THE_SUITE)
def test_the_rows_are_those_of_the_recorder_before(name, tmp_path):
    with open(GOLDEN) as fh:
        want = json.load(fh)["workloads"][name]
    got = golden_rows.shape(golden_rows.run(name, str(tmp_path)))
    assert got == want
