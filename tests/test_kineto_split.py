"""Cutting one big trace in two for two processes gives exactly what one process gives."""

import json
import os

import numpy as np
import pytest

from gpuscope.readers.kineto import parse, summary

HTA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces", "hta")
FIELDS = ("host_kind", "host_start", "host_end", "host_tid", "step_id", "dev_kind", "dev_start",
          "dev_end", "dev_corr", "launch_corr", "launch_ts")


def _same(a, b):
    return all(np.array_equal(np.sort(getattr(a, f)), np.sort(getattr(b, f))) for f in FIELDS)


@pytest.fixture
def small_cut(monkeypatch):
    monkeypatch.setattr(parse, "SPLIT_TEXT_BYTES", 64 << 10)
    if not parse.forks():
        pytest.skip("needs fork and two cores")


def test_split_equals_one_process_on_a_real_trace(small_cut, monkeypatch):
    path = os.path.join(HTA, "ns_resolution_trace", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    if not os.path.exists(path):
        pytest.skip("shared HTA traces not present")
    calls = []
    real = parse.decode_trace
    monkeypatch.setattr(parse, "decode_trace", lambda p, b=None: calls.append(p) or real(p, b))
    split = parse.parse_file(path, split=True)
    assert calls == []  # really cut in two
    whole = parse.parse_file(path, split=False)
    assert split[1] == whole[1]  # distributedInfo
    assert _same(split[2], whole[2])


def test_a_cut_inside_a_string_falls_back_to_one_process(small_cut, tmp_path, monkeypatch):
    # every event name holds the very separator the cut looks for
    events = [{"ph": "X", "cat": "cpu_op", "name": "op},  {trick" + str(i), "pid": 1,
               "tid": 1, "ts": 1000 + 10 * i, "dur": 5} for i in range(4000)]
    events.insert(0, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
                      "tid": 1, "ts": 999, "dur": 50000})
    path = tmp_path / "rank-0.pt.trace.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events},
                               indent=1))
    calls = []
    real = parse.decode_trace
    monkeypatch.setattr(parse, "decode_trace", lambda p, b=None: calls.append(p) or real(p, b))
    split = parse.parse_file(str(path), split=True)
    assert calls == [str(path)]  # the cut was refused and the file decoded in one piece
    whole = parse.parse_file(str(path), split=False)
    assert _same(split[2], whole[2])
    assert split[2].host_kind.size == 4001


def test_two_processes_work_out_the_rows_of_their_own_files(tmp_path, monkeypatch):
    """Two traces, one per rank: each process decodes one and works out its rank's step rows;
    the table is the one a single process makes."""
    import shutil

    from gpuscope.readers import read_path

    if not parse.forks():
        pytest.skip("needs fork and two cores")
    src = os.path.join(os.path.dirname(__file__), "..", "sample_traces", "imbalanced", "kineto")
    from helpers import trace_of_rank

    for name in (trace_of_rank(src, 0)[0], trace_of_rank(src, 1)[0]):  # a cycle of each rank
        shutil.copy(os.path.join(src, name), tmp_path / name)
    calls = []
    real = parse.prepared
    monkeypatch.setattr(parse, "prepared", lambda item: calls.append(1) or real(item))
    used = []
    real_rows = summary.rank_rows  # beside the parse, or in the table when not done there
    monkeypatch.setattr(summary, "rank_rows", lambda *a: used.append(a[1]) or real_rows(*a))
    two = read_path(str(tmp_path))
    assert len(calls) == 1  # the parent's file here; the child's in the child
    assert len(used) == 1  # the parent's file, beside the child; none left for the table
    monkeypatch.setattr(parse, "forks", lambda: False)
    one = read_path(str(tmp_path))
    assert sorted(two.frame["rank"].unique()) == [0, 1]
    assert two.frame.equals(one.frame) and two.warnings == one.warnings
    assert two.gpu_breakdown == one.gpu_breakdown
