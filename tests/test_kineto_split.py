"""Cutting one big trace in two for two processes gives exactly what one process gives."""

import json
import mmap
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


def _ns_trace():
    path = os.path.join(HTA, "ns_resolution_trace", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    if not os.path.exists(path):
        pytest.skip("shared HTA traces not present")
    return path


def test_let_go_hands_back_whole_pages_only():
    from gpuscope.readers.kineto.text import RELEASE_MIN_BYTES, let_go, text_buffer

    page = mmap.PAGESIZE
    text = text_buffer(RELEASE_MIN_BYTES)
    assert isinstance(text, mmap.mmap)  # memory whose pages can be handed back
    text[:] = b"x" * len(text)
    let_go(text, page // 2, 3 * page + 7)  # pages 1 and 2 lie wholly inside
    assert text[:page] == b"x" * page  # partly inside: kept
    assert text[page:3 * page] == bytes(2 * page)  # handed back: zero-filled when read again
    assert text[3 * page:4 * page] == b"x" * page
    small = text_buffer(16)
    assert isinstance(small, bytearray)
    small[:] = b"y" * 16
    let_go(small, 0, 16)  # another kind of buffer: untouched
    assert small == b"y" * 16


def test_pieces_are_let_go_of_as_they_are_decoded_and_give_the_same_events():
    path = _ns_trace()
    text = parse.read_bytes(path)
    assert isinstance(text, mmap.mmap)  # 15 MB of JSON
    info, pieces, spans = parse.split_events(text, 6)
    assert len(pieces) == 6 and spans[0][0] < spans[-1][1] <= len(text)
    ev = parse._sorted(pieces, text, spans)
    page = mmap.PAGESIZE
    for lo, hi in spans:  # every whole page of every piece was handed back
        lo, hi = -(-lo // page) * page, hi // page * page
        assert text[lo:hi] == bytes(hi - lo)
    whole = parse.parse_file(path, split=False)
    assert _same(ev, whole[2]) and info == whole[1]


def test_a_split_parse_lets_go_of_the_other_half_in_each_process(small_cut, monkeypatch):
    path = _ns_trace()
    texts, released = [], []
    real_read, real_let_go = parse.read_bytes, parse.let_go
    monkeypatch.setattr(parse, "read_bytes", lambda p: texts.append(real_read(p)) or texts[-1])
    monkeypatch.setattr(parse, "let_go", lambda t, lo, hi: released.append((lo, hi))
                        or real_let_go(t, lo, hi))
    split = parse.parse_file(path, split=True)
    text, = texts
    # the parent handed back the child's half whole, then each of its own pieces
    middle, end = released[0]
    assert end == len(text) and 0 < middle < end
    assert all(hi <= middle for _, hi in released[1:])
    assert _same(split[2], parse.parse_file(path, split=False)[2])
