"""Report: typed fields, `from_dict` reads back exactly what `to_dict` wrote, and a saved report
renders like the one it came from."""

import json
import os

import pytest

import gpuscope
from gpuscope import Report
from gpuscope.errors import InputError
from gpuscope.render import html, terminal

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
HTA = os.environ.get("GPUSCOPE_HTA_TRACES",
                     os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces", "hta"))
INPUTS = [os.path.join(SAMPLES, s, k) for s in ("data", "comm", "imbalanced", "compute")
          for k in ("record", "kineto")]
HTA_INPUTS = ["trace_filter", "nccl_parser_config", "cpu_only", "rank_unavailable"]


def _inputs():
    out = list(INPUTS)
    out += [os.path.join(HTA, f) for f in HTA_INPUTS]
    return out


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: "/".join(p.split(os.sep)[-2:]))
def test_from_dict_reads_back_what_to_dict_wrote(path, tmp_path):
    if not os.path.exists(path):
        pytest.skip(f"{path} missing")
    report = gpuscope.analyze(path)
    d = report.to_dict()
    back = Report.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d
    assert Report.from_dict(back.to_dict()) == back  # at JSON precision, a fixed point
    report.write_json(tmp_path / "a.json")
    Report.read_json(tmp_path / "a.json").write_json(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert terminal.render(back, width=120) == terminal.render(report, width=120)


def test_typed_fields_carry_the_findings():
    report = gpuscope.analyze(os.path.join(SAMPLES, "imbalanced", "record"))
    assert report.verdict.label == "imbalanced" and report.straggler_ranks == [1]
    (s,) = report.stragglers
    assert s.cause == "compute" and s.excess_ns > 0
    r1 = next(r for r in report.ranks if r.rank == 1)
    assert r1.compute_pct > 50 and r1.part_pct("compute") == r1.compute_pct
    assert report.early_ranks == [0]  # rank 0 waits for rank 1 every step
    assert all(st.label in ("imbalanced", "compute-bound") for st in report.steps)
    assert report.suggestions[0].knob == "straggler"
    traces = gpuscope.analyze(os.path.join(HTA, "trace_filter")) if os.path.isdir(HTA) else None
    if traces is not None:
        assert traces.ranks[0].gpu_breakdown.idle_pct == pytest.approx(53.56, abs=0.5)


def test_a_saved_report_renders_without_its_table(tmp_path):
    report = gpuscope.analyze(os.path.join(SAMPLES, "imbalanced", "record"))
    report.write_json(tmp_path / "r.json")
    saved = Report.read_json(tmp_path / "r.json")
    assert saved.table is None
    page = html.render(saved, plotlyjs="plotly.min.js")
    assert 'id="panel-steps"' in page and 'id="panel-ranks"' in page
    assert 'id="panel-heatmap"' not in page  # needs every rank's steps
    assert "read from a saved JSON report" in page and "Straggler" in page


@pytest.mark.parametrize("bad,match", [({"schema": "other/1"}, "not a gpuscope.report/1"),
                                       ([1, 2], "not a gpuscope.report/1"),
                                       ({"schema": "gpuscope.report/1", "steps": []},
                                        "missing or malformed")])
def test_from_dict_refuses_what_is_not_a_report(bad, match):
    with pytest.raises(InputError, match=match):
        Report.from_dict(bad)


def test_write_and_print(tmp_path, capsys):
    report = gpuscope.analyze(os.path.join(SAMPLES, "data", "record"))
    report.write_html(tmp_path / "sub" / "r.html", plotlyjs="plotly.min.js")
    assert (tmp_path / "sub" / "r.html").read_text().startswith("<!DOCTYPE html>")
    report.print()
    out = capsys.readouterr().out
    assert "Verdict: DATA-BOUND" in out and "\x1b[" not in out  # no colour when not a terminal


@pytest.mark.parametrize("width", [60, 80, 100])
def test_wrapped_lines_keep_figures_whole_and_end_without_spaces(width):
    """A narrow terminal: no line ends with spaces, and no figure is split across two lines
    ("35.9" at a line's end and "ms" at the next one's start; "2 x 30 x" and "2 = 120")."""
    import os
    import re

    import gpuscope
    from gpuscope.render.terminal import render

    root = os.path.join(os.path.dirname(__file__), "..", "sample_traces")
    for name in ("comm", "data", "imbalanced"):
        text = render(gpuscope.analyze(os.path.join(root, name, "record")), width=width)
        lines = text.splitlines()
        assert not [x for x in lines if x.endswith(" ")]
        in_suggestions = lines[next(i for i, x in enumerate(lines)
                                    if x.startswith("Suggestions")):]
        for a, b in zip(in_suggestions, in_suggestions[1:]):
            if b.startswith("thresholds"):
                break
            split = (re.search(r"[\d%)]$", a) and re.match(r"\s*(ms|%|x\b|\()", b)) or (
                re.search(r"\d [x=]$", a))
            assert not split, (a, b)


def test_rates_carry_their_multiplier_on_the_number():
    from gpuscope.render.terminal import throughput_line
    from gpuscope.sections import RankRate, Throughput

    rows = [RankRate(rank=r, steps_per_s=9.18, samples_per_s=37_600.0) for r in (0, 1)]
    line = throughput_line(Throughput(per_rank=rows, steps_per_s=9.18, samples_per_s=75_200.0,
                                      tokens_per_s=3_100_000.0, assumes=[]))
    assert "75.2k samples/s (37.6k per rank)" in line and "3.1M tokens/s" in line
    assert "ksamples" not in line and "kper" not in line


def test_a_narrow_terminal_says_which_columns_it_left_out():
    import os

    import gpuscope
    from gpuscope.render.terminal import render

    rep = gpuscope.analyze(os.path.join(os.path.dirname(__file__), "..", "sample_traces",
                                        "imbalanced", "record"))
    assert "columns are too narrow" not in render(rep, width=200)
    narrow = render(rep, width=80)
    assert "fwd / bwd / opt left out: 80 columns are too narrow" in narrow
