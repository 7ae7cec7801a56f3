"""Scaling across world sizes: efficiency and where adding ranks stops paying."""

import json
import subprocess
import sys

import pytest

from gpuscope.errors import InputError
from gpuscope.analyze.run import analyze_table
from gpuscope.analyze.scaling import scaling_dict, scaling_points
from gpuscope.thresholds import Thresholds
from helpers import table_from_rows


def _run(world: int, compute: float, comm: float, batch: int = 32):
    rows = [{"rank": r, "step": s, "compute": compute, "comm": comm, "comm_exposed": comm}
            for r in range(world) for s in range(5)]
    t = table_from_rows(rows, knobs={"batch_size": batch}, world=world)
    t.path = f"run{world}"
    return analyze_table(t, Thresholds(warmup_steps=0))


def test_efficiency_and_where_it_stops_paying():
    # communication grows with the world: 100 ms compute, +2 / +10 / +60 / +200 ms exposed comm
    reports = [_run(8, 100, 60), _run(2, 100, 2), _run(4, 100, 10), _run(16, 100, 200)]
    points = scaling_points(reports)
    assert [p.world_size for p in points] == [2, 4, 8, 16]
    assert points[0].efficiency == 1.0
    assert points[1].efficiency == pytest.approx(102 / 110, abs=1e-3)
    d = scaling_dict(points)
    # 4 -> 8 ranks: 8*32/0.160 over 4*32/0.110 = 1.375x, under half the ideal 2x gain
    assert d["stops_paying_at"] == 8
    assert "1.37x instead of 2x" in d["why"]
    assert "exposed communication grows from 9% to 38%" in d["why"], d["why"]


def test_waiting_is_counted_once_in_the_table_and_the_sentence():
    """Waiting is part of exposed communication: the sentence gives exposed (waiting inside it,
    said as its part), the table transfer and wait, disjoint; neither adds the two (the demo's
    'grow from 12% to 71%' was exposed 55 + wait 16)."""
    from gpuscope.analyze.scaling import ScalePoint, stops_paying
    from gpuscope.render.scaling import render

    points = [ScalePoint("a", 1, 15.0, 32, 2133.0, 1.0, 12.0, 0.0, 0.0, "compute-bound"),
              ScalePoint("b", 2, 38.8, 32, 1650.0, 0.39, 55.0, 16.0, 0.0, "comm-bound")]
    at, why = stops_paying(points)
    assert at == 2 and "exposed communication grows from 12% to 55% of the step" in why, why
    assert "71%" not in why and "16%" in why
    text = render(points, at, why, width=120)
    row = next(x for x in text.splitlines() if "comm-bound" in x)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[4:6] == ["39", "16"], cells  # transfer 39 + wait 16 = exposed 55


def test_one_world_size_or_mixed_batches_is_a_clear_error():
    with pytest.raises(InputError, match="different world sizes"):
        scaling_points([_run(2, 100, 2), _run(2, 100, 3)])
    with pytest.raises(InputError, match="per-rank batch"):
        scaling_points([_run(2, 100, 2), _run(4, 100, 3, batch=64)])


def test_cli_on_sample_runs_of_one_size_exits_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpuscope", "scaling", "sample_traces/data/record",
                          "sample_traces/comm/record"], capture_output=True, text=True)
    assert out.returncode == 2 and "different world sizes" in out.stderr


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_scaling_text_wraps_between_figures_and_ends_no_line_with_spaces(width):
    """At any width: no line ends with spaces (rich pads), the sentence never splits '14%' from
    'of' ... and one rank is 'rank', not 'ranks'."""
    import re

    from gpuscope.analyze.scaling import ScalePoint, stops_paying
    from gpuscope.render.scaling import render

    points = [ScalePoint("runs/comm1/record", 1, 15.0, 32, 2133.0, 1.0, 12.0, 0.0, 0.0,
                         "compute-bound"),
              ScalePoint("runs/comm2/record", 2, 38.8, 32, 1650.0, 0.39, 55.0, 16.0, 0.0,
                         "comm-bound")]
    at, why = stops_paying(points)
    lines = render(points, at, why, width=width).splitlines()
    assert not [x for x in lines if x.endswith(" ")]
    assert "1 rank: runs/comm1/record" in lines
    for a, b in zip(lines, lines[1:]):
        assert not (re.search(r"[\d%)]$", a) and re.match(r"\s*(ms|%|x\b|\()", b)), (a, b)
