"""The recorder's rows, unchanged by its rebuilding (issue 42): record files of the test
workloads reduced to what does not depend on timing (scripts/golden_rows.py: per row its step,
sync flag, samples and parts; per run each collective's calls, the header's fixed facts, the
side records' kinds and all-to-all rows) against the same made by the recorder before
(tests/fixtures/golden_rows.json, at f43949c). The suite runs the workloads whose rows differ
most in shape; `python scripts/golden_rows.py --out FILE` compares all ten by hand."""

import json
import os

import pytest

from helpers import script

pytestmark = pytest.mark.slow
golden_rows = script("golden_rows")
GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden_rows.json")
#: DDP's tail, accumulation with no_sync, FSDP2's functional collectives, the loop's own
#: all-reduces, experts' all-to-all rows
IN_THE_SUITE = ("ddp", "no_sync", "fsdp2", "allreduce", "experts")


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
