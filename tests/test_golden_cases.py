"""Golden cases as folders (scripts/golden_cases.py makes them from this checkout's code; a new
case is a folder, not code):

- tests/fixtures/golden/rows/<workload>/: the micro-steps a real torchrun run's hooks logged
  (events.json, each flush rank by rank) and what the recorder made of them (rows.json): both
  row paths must give exactly those rows, all-to-all rows and forward counts;
- tests/fixtures/golden/reports/<case>/: an input (case.json) and its expected JSON report and
  terminal report at a fixed width: the analysis and the renderer must give exactly those.

A difference means a changed behaviour: if it is meant, remake the case with the script and
review its diff."""

import glob
import json
import os

import pytest

from gpuscope.record.rows import PATHS, build
from helpers import script

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")
ROW_CASES = sorted(glob.glob(os.path.join(GOLDEN, "rows", "*")))
REPORT_CASES = sorted(glob.glob(os.path.join(GOLDEN, "reports", "*")))
golden_cases = script("golden_cases")
snapshot_reports = script("snapshot_reports")


def _tuples(item: list) -> tuple:
    """A micro-step read back from JSON as StepLog.take hands it over (tuples in lists)."""
    phases, data, tails, rare, step, start, end, sync = item
    return ([tuple(x) for x in phases], [tuple(x) for x in data], [tuple(x) for x in tails],
            [tuple(x) for x in rare], step, start, end, sync)


def _load(folder: str, name: str):
    with open(os.path.join(folder, name)) as fh:
        return json.load(fh)


def test_there_are_golden_cases_of_both_kinds():
    assert len(ROW_CASES) >= 8 and len(REPORT_CASES) >= 6


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("folder", ROW_CASES, ids=os.path.basename)
def test_the_rows_of_a_real_run_s_events(folder, path):
    events, want = _load(folder, "events.json"), _load(folder, "rows.json")
    assert sorted(events["ranks"]) == sorted(want)
    n = 0
    for rank, flushes in events["ranks"].items():
        assert len(flushes) == len(want[rank])
        for flush, expected in zip(flushes, want[rank]):
            got = build([_tuples(it) for it in flush["items"]], flush["shift"], path)
            assert json.loads(json.dumps(got._asdict())) == expected, (rank, flush["shift"])
            n += len(got.rows)
    assert n > 0


@pytest.mark.parametrize("folder", REPORT_CASES, ids=os.path.basename)
def test_the_report_of_a_case(folder):
    data, text = golden_cases.report_case(folder)
    # where they differ, key by key (snapshot_reports.diff: floats to 1e-9 relative)
    assert snapshot_reports.diff(_load(folder, "expected.json"), data)[:10] == []
    with open(os.path.join(folder, "report.txt")) as fh:
        assert text == fh.read()
