"""Property-based tests (hypothesis): whatever a record or trace file holds, the readers skip what
does not fit and analyse the rest; reports stay finite, valid JSON. Bounded: a few dozen
examples per property (scripts/fuzz.py runs the long campaign)."""

import json
import math
import os
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuscope
from gpuscope.errors import GpuscopeError
from gpuscope.readers import read_path

HERE = os.path.dirname(__file__)
RECORD = os.path.join(HERE, "..", "sample_traces", "comm", "record")

SETTINGS = settings(max_examples=int(os.environ.get("GPUSCOPE_HYPOTHESIS_EXAMPLES", 40)),
                    deadline=None, derandomize=not os.environ.get("GPUSCOPE_HYPOTHESIS_EXAMPLES"),
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)


def _finite(obj) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_finite(v) for v in obj)
    return True


def _analyse(path):
    """The report's dict, or None when gpuscope said the input is unusable (its own error)."""
    try:
        rep = gpuscope.analyze(path)
    except GpuscopeError:
        return None
    d = rep.to_dict()
    assert _finite(d), "NaN or inf in the report"
    json.dumps(d, allow_nan=False)
    rep.print(file=open(os.devnull, "w"), width=100)
    return d


@SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 20), json_values),
                      min_size=1, max_size=4),
       extra=st.lists(json_values, max_size=3))
def test_any_edit_of_rank0s_file_leaves_rank1_whole(tmp_path_factory, edits, extra):
    run = tmp_path_factory.mktemp("rec") / "run"
    shutil.copytree(RECORD, run)
    p = run / "rank-00000.gpuscope.jsonl"
    lines = p.read_text().split("\n")
    for line_no, pos, value in edits:
        i = line_no % len(lines)
        try:
            obj = json.loads(lines[i])
        except ValueError:
            continue
        if isinstance(obj, list) and obj:
            obj[pos % len(obj)] = value
        elif isinstance(obj, dict) and obj:
            obj[sorted(obj)[pos % len(obj)]] = value
        lines[i] = json.dumps(obj)
    lines[1:1] = [json.dumps(v) for v in extra]
    p.write_text("\n".join(lines))
    try:
        table = read_path(run)
    except GpuscopeError:
        return
    full = read_path(RECORD).frame
    assert (table.frame["rank"] == 1).sum() == (full["rank"] == 1).sum()
    assert (table.frame["rank"] == 0).sum() <= (full["rank"] == 0).sum()
    _analyse(run)


names = st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#x",
                         "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                         "gloo:all_reduce", "nccl:all_reduce", "ncclKernel_AllReduce_RING",
                         "aten::mm", "Optimizer.step#SGD.step", "cudaLaunchKernel",
                         "autograd::engine::evaluate_function: MmBackward0", "FSDP::all_gather",
                         "Forward 1", "[bold]x[/bold]", "<b>x</b>"]) | st.text(max_size=12)
cats = st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "user_annotation", "gpu_memcpy",
                        "python_function", "", "Trace"])
numbers = (st.floats(min_value=-1e6, max_value=1e7) | st.integers(-(2 ** 66), 2 ** 66)
           | st.floats(allow_nan=True, allow_infinity=True) | st.none() | st.text(max_size=3))
event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "X", "i", "M", "B", "E"]) | st.integers()},
    optional={"name": names, "cat": cats, "ts": numbers, "dur": numbers,
              "tid": st.integers(-(2 ** 65), 2 ** 65) | st.text(max_size=5),
              "pid": st.integers(0, 10),
              "args": st.fixed_dictionaries({}, optional={
                  "correlation": st.integers(-(2 ** 66), 2 ** 66) | st.text(max_size=3),
                  "stream": st.integers(-(2 ** 66), 2 ** 66) | st.none(),
                  "Collective name": st.text(max_size=8) | st.integers(),
                  "Process Group Name": st.text(max_size=8)})})
info = st.none() | st.fixed_dictionaries({}, optional={
    "rank": st.integers(-3, 2 ** 40) | st.text(max_size=3), "world_size": st.integers(-1, 9),
    "backend": st.text(max_size=5) | st.integers()})


@SETTINGS
@given(events=st.lists(event, max_size=60), info=info, cut=st.none() | st.integers(0, 4000))
def test_any_trace_reads_or_is_one_error(tmp_path_factory, events, info, cut):
    doc = {"traceEvents": events}
    if info is not None:
        doc["distributedInfo"] = info
    text = json.dumps(doc).encode()  # NaN and Infinity come out as bare tokens (not JSON)
    if cut is not None:
        text = text[:cut]
    p = tmp_path_factory.mktemp("k") / "rank-0.pt.trace.json"
    p.write_bytes(text)
    _analyse(p)
