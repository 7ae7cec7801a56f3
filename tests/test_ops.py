"""The op and kernel views (readers/kineto/ops.py, analyze/ops.py): pinned on hand-built traces
worked out by hand, checked against HTA's own kernel breakdown of its shared traces (made by HTA,
tests/fixtures/hta_kernel_breakdown.json), and against the message sizes the corpus traces write
in their own args."""

import glob
import gzip
import json
import os

import numpy as np
import pytest

import gpuscope
from gpuscope.analyze.compare import compare
from gpuscope.analyze.ops import bus_factor, link_peak
from gpuscope.readers import read_path
from gpuscope.readers.kineto.ops import DTYPE_BYTES
from gpuscope.render import terminal
from helpers import FakeCuda, X, kernel, launch

US = 1000
HERE = os.path.dirname(__file__)
SHARED = os.path.join(HERE, "..", "..", "shared", "traces")
FIXTURE = os.path.join(HERE, "fixtures", "hta_kernel_breakdown.json")


def _shared(path: str) -> None:
    """Skip where the shared traces are not beside the checkout; CI requires them."""
    if not os.path.isdir(path):
        assert os.environ.get("GPUSCOPE_REQUIRE_SHARED") != "1", f"{path} is missing"
        pytest.skip("the shared traces are not here")


ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MSG = {"Collective name": "allreduce", "In msg nelems": 1_000_000, "Out msg nelems": 1_000_000,
       "Group size": 2, "dtype": "Float", "Process Group Name": "0"}
STEPS = 6  # the last is left out (its work may be cut off, as HTA does): 5 analysed


def rank_trace(rank: int, svd: bool) -> list:
    """Each step of 10 ms: aten::linear (aten::addmm inside it) launches a 2 ms gemm; with
    `svd`, aten::linalg_svd launches a 4 ms kernel after it; an all-reduce of 1e6 floats
    (4 MB) then runs on its own stream: 2 ms on the rank that arrives last (the one with the
    extra work), 5 ms on the other, which waits for it. "## forward ##" is a record_function
    range around the linear."""
    ev = []
    corr = 0
    for i in range(STEPS):
        b = i * 10_000
        ev += [X(f"ProfilerStep#{i}", b, 10_000, cat="user_annotation"),
               X("## forward ##", b + 50, 600, cat="user_annotation"),
               X("aten::linear", b + 100, 500), X("aten::addmm", b + 150, 400),
               launch(b + 200, corr + 1), kernel("gemm_kernel", b + 1000, 2000, corr + 1)]
        if svd:
            ev += [X("aten::linalg_svd", b + 700, 200), launch(b + 750, corr + 2),
                   kernel("svd_kernel", b + 3000, 4000, corr + 2)]
        ar = (b + 7000, 2000) if svd else (b + 3000, 5000)
        ev += [X("record_param_comms", b + 940, 30, **MSG), launch(b + 950, corr + 3),
               kernel(ALLREDUCE, *ar, corr + 3, stream=9, **MSG)]
        corr += 3
    return ev


def write_run(folder, extra_rank: int | None):
    os.makedirs(folder, exist_ok=True)
    for r in (0, 1):
        doc = {"distributedInfo": {"rank": r, "world_size": 2, "backend": "nccl"},
               "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
               "traceEvents": rank_trace(r, r == extra_rank)}
        with open(os.path.join(folder, f"rank-{r}.pt.trace.json"), "w") as fh:
            json.dump(doc, fh)
    return str(folder)


def _row(rows, name):
    return next(r for r in rows if r["name"] == name)


def test_time_per_step_by_op_range_and_kernel(tmp_path):
    rep = gpuscope.analyze(write_run(tmp_path / "run", 1))
    ops = rep.ops
    assert [r["rank"] for r in ops.ranks] == [0, 1]
    r1 = ops.ranks[1]
    # top-level ops only (aten::addmm is inside aten::linear), charged the device time of the
    # kernels each launched: this rank ran a GPU
    assert {o["name"] for o in r1["ops"]} == {"aten::linear", "aten::linalg_svd",
                                              "record_param_comms"}
    svd = _row(r1["ops"], "aten::linalg_svd")
    assert (svd["per_step_ms"], svd["gpu_ms"], svd["host_ms"], svd["count_per_step"]) == \
        (4.0, 4.0, 0.2, 1.0)
    assert _row(r1["ops"], "aten::linear")["per_step_ms"] == 2.0
    assert _row(r1["ops"], "record_param_comms")["per_step_ms"] == 2.0  # its all-reduce
    assert r1["ops_total_ms"] == 8.0 and r1["ops_other_ms"] == 0.0
    rng = _row(r1["ranges"], "## forward ##")
    assert (rng["gpu_ms"], rng["host_ms"]) == (2.0, 0.6)
    kernels = {k["name"]: k for k in r1["kernels"]}
    assert kernels["svd_kernel"]["per_step_ms"] == 4.0
    assert kernels[ALLREDUCE]["per_step_ms"] == 2.0
    assert kernels[ALLREDUCE]["type"] == "communication"
    assert r1["kernels_total_ms"] == 8.0  # what the ops launched, every kernel accounted for
    assert _row(ops.ranks[0]["kernels"], ALLREDUCE)["per_step_ms"] == 5.0
    # across ranks: the mean of the ranks (a rank without the op counts zero)
    run = _row(ops.run["ops"], "aten::linalg_svd")
    assert (run["per_step_ms"], run["ranks"]) == (2.0, 1)


def test_a_straggler_s_excess_is_named_down_to_the_op(tmp_path):
    rep = gpuscope.analyze(write_run(tmp_path / "run", 1))
    s = next(s for s in rep.stragglers if s.rank == 1)
    top = s.ops[0]
    assert top["name"] in ("aten::linalg_svd", "svd_kernel")
    by_name = {o["name"]: o for o in s.ops}
    svd = by_name["aten::linalg_svd"]
    assert (svd["excess_ms"], svd["rank_ms"], svd["peers_ms"], svd["only_here"]) == \
        (4.0, 4.0, 0.0, True)
    assert by_name["svd_kernel"]["only_here"]
    # the waiting rank's longer all-reduce is not the straggler's excess
    assert ALLREDUCE not in by_name
    d = rep.to_dict()["straggler_details"][0]
    assert d["ops"][0]["name"] == top["name"]
    out = terminal.render(rep, width=200)
    assert "+4.0 ms per step in aten::linalg_svd (not run by its peers)" in out
    sug = next(x for x in rep.suggestions if x.knob == "straggler")
    assert "aten::linalg_svd runs on this rank alone" in sug.why


def test_collective_size_and_bus_bandwidth(tmp_path):
    rep = gpuscope.analyze(write_run(tmp_path / "run", 1))
    (c,) = rep.ops.collectives
    assert (c["collective"], c["bytes"], c["group_size"], c["dtype"]) == \
        ("all_reduce", 4_000_000, 2, "Float")
    # the shortest of the two ranks' durations: 2 ms (the other waited 3 ms of its 5)
    assert c["time_us"] == 2000.0 and c["ranks_seen"] == 2 and c["instances"] == STEPS
    assert c["algbw_gbps"] == 2.0 and c["busbw_gbps"] == 2.0  # 4 MB / 2 ms; x 2(2-1)/2
    assert c["per_step_ms"] == 3.5  # mean over the ranks of each one's own time
    assert c["link_peak_gbps"] == 450.0 and c["of_link_pct"] == round(100 * 2 / 450, 1)


def test_bus_bandwidth_factors_and_links():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("reduce_scatter", 4) == 3 / 4
    assert bus_factor("all_to_all", 4) == 3 / 4
    assert bus_factor("broadcast", 8) == 1.0
    assert link_peak("NVIDIA A100-PG509-200")[0] == 300.0
    assert link_peak("NVIDIA A100-PCIE-40GB")[0] == 32.0
    assert link_peak("Tesla V100-SXM2-32GB")[0] == 150.0
    assert link_peak("some accelerator")[0] is None


def test_compare_names_the_op_that_appeared(tmp_path):
    before = gpuscope.analyze(write_run(tmp_path / "before", None))
    after = gpuscope.analyze(write_run(tmp_path / "after", 1))
    c = compare(before, after)
    names = {o["name"]: o for o in c.ops}
    svd = names["aten::linalg_svd"]
    assert (svd["change"], svd["before_ms"], svd["after_ms"]) == ("appeared", 0.0, 2.0)
    assert names["svd_kernel"]["change"] == "appeared"
    assert c.ops[0]["name"] in ("aten::linalg_svd", "svd_kernel")
    back = compare(after, before)
    assert {o["name"]: o["change"] for o in back.ops}["aten::linalg_svd"] == "vanished"
    # a saved report diffs the same
    path = tmp_path / "after.json"
    after.write_json(path)
    again = compare(before, gpuscope.Report.read_json(path))
    assert again.ops == c.ops


def _hta():
    with open(FIXTURE) as fh:
        return json.load(fh)


@pytest.mark.parametrize("folder", sorted(
    f for f, v in _hta()["folders"].items() if "error" not in v))
def test_kernel_breakdown_agrees_with_hta(folder):
    """Every kernel HTA 0.5 lists, per rank and name: count (via the mean), sum, max, min; and
    the kernel-type times with their overlaps, summed over ranks as HTA does."""
    ref = _hta()["folders"][folder]
    path = os.path.join(SHARED, "hta", folder)
    _shared(path)
    t = read_path(path)
    kb = t.kernel_breakdown
    if not ref["kernels"]:
        assert kb is None or kb.empty
        return
    got = {(int(r.rank), r.name): r for r in kb.itertuples(index=False)}
    assert len(got) == len(ref["kernels"])
    for k in ref["kernels"]:
        r = got[(k["rank"], k["name"])]
        assert r.sum_ns / US == pytest.approx(k["sum_us"], abs=1e-6)
        assert r.max_ns / US == pytest.approx(k["max_us"], abs=1e-6)
        assert r.min_ns / US == pytest.approx(k["min_us"], abs=1e-6)
        assert r.sum_ns / r.count / US == pytest.approx(k["mean_us"], abs=1e-6)
        assert r.type.upper()[:4] == k["type"][:4]  # COMPUTATION / COMMUNICATION / MEMORY
    types: dict = {}
    for per_rank in t.kernel_types.values():
        for label, ns in per_rank.items():
            types[label] = types.get(label, 0) + ns / US
    assert types == pytest.approx(ref["types"], abs=1e-6)


CORPUS_WITH_ARGS = ["hta/nccl_parser_config", "external/tracelens_b200_eager_trace",
                    "external/tracelens_mi300_resnet_act_checkpoint"]


@pytest.mark.parametrize("folder", CORPUS_WITH_ARGS)
def test_collective_sizes_are_the_trace_s_own_args(folder):
    """Each communication kernel's size and group as its own args say (element count times the
    dtype's size), its duration the kernel's: checked against the file read with json."""
    path = os.path.join(SHARED, folder)
    _shared(path)
    (f,) = glob.glob(os.path.join(path, "*.json.gz"))
    with gzip.open(f) as fh:
        events = json.load(fh)["traceEvents"]
    want = sorted(
        (max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"])
         * DTYPE_BYTES[e["args"]["dtype"]], e["args"]["Group size"], round(e["dur"] * US))
        for e in events if e.get("cat") == "kernel" and "In msg nelems" in e.get("args", {}))
    assert want
    m = read_path(path).messages
    got = sorted(zip(m["bytes"].tolist(), m["group_size"].tolist(), m["dur_ns"].tolist()))
    assert got == want
    rep = gpuscope.analyze(path)
    for c in rep.ops.collectives:
        mine = m[(m["bytes"] == c["bytes"]) & (m["collective"].astype(str) == c["collective"])
                 & (m["group"].astype(str) == c["group"])]
        assert c["instances"] == len(mine)
        # one rank's trace: each instance's own duration (bytes per ns = GB/s), the median
        assert c["algbw_gbps"] == pytest.approx(
            float(np.median(c["bytes"] / mine["dur_ns"].to_numpy(float))), rel=1e-3)
        assert c["busbw_gbps"] == pytest.approx(
            c["algbw_gbps"] * bus_factor(c["collective"], c["group_size"]), rel=0.02)
        assert "lower bound" in c["basis"]


EXTRA_OP = os.path.join(HERE, "workloads", "extra_op.py")


def _profiled_run(out, extra_rank: int, *more: str) -> str:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         EXTRA_OP, "--out", str(out), "--extra-rank", str(extra_rank), *more],
        capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out)


@pytest.mark.slow
def test_a_real_run_s_extra_op_is_named_with_its_time_and_compare_finds_it(tmp_path):
    """2 ranks, gloo, DDP, torch.profiler: rank 1 runs torch.linalg.svd once a step, timed with
    perf_counter around the call. The report names rank 1 and the op with its time per step;
    compare against the same run without it names the op."""
    with_op = _profiled_run(tmp_path / "with", 1)
    without = _profiled_run(tmp_path / "without", -1)
    rep = gpuscope.analyze(os.path.join(with_op, "kineto"))
    with open(os.path.join(with_op, "extra-rank1.json")) as fh:
        own_ms = 1e3 * float(np.mean(json.load(fh)["extra_s"]))  # as per_step_ms: a mean
    # the profiler times the op on rank 1 alone, as perf_counter does around the same call
    r1 = next(r for r in rep.ops.ranks if r["rank"] == 1)
    svd = _row(r1["ops"], "aten::linalg_svd")
    assert svd["count_per_step"] == 1.0
    assert abs(svd["per_step_ms"] - own_ms) <= max(0.25 * own_ms, 1.0), (svd, own_ms)
    assert not any(o["name"] == "aten::linalg_svd"
                   for o in next(r for r in rep.ops.ranks if r["rank"] == 0).get("ops", []))
    # the others wait for it: rank 1 is the straggler (or the probable one, with few steps),
    # and its excess is that op
    s = next(s for s in rep.stragglers if s.rank == 1)
    top = s.ops[0]
    assert top["name"] == "aten::linalg_svd" and top["only_here"]
    assert abs(top["excess_ms"] - own_ms) <= max(0.25 * own_ms, 1.0)
    c = compare(gpuscope.analyze(os.path.join(without, "kineto")), rep)
    assert c.ops[0]["name"] == "aten::linalg_svd" and c.ops[0]["change"] == "appeared"


def test_the_dashboard_shows_the_ops_and_the_straggler_s_op(tmp_path):
    from gpuscope.render import html

    rep = gpuscope.analyze(write_run(tmp_path / "run", 1))
    page = html.render(rep, plotlyjs="plotly.js")
    ops_table = page.split('<table id="ops-run-ops">', 1)[1].split("</table>", 1)[0]
    (row,) = [r for r in ops_table.split("<tr>") if "aten::linalg_svd" in r]
    assert "<td>2.000</td>" in row and "1 of 2" in row
    stragglers = page.split('<ul id="stragglers">', 1)[1].split("</ul>", 1)[0]
    assert "+4.0 ms per step in aten::linalg_svd (not run by its peers)" in stragglers
    coll = page.split('<table id="ops-collectives">', 1)[1].split("</table>", 1)[0]
    assert "4.0 MB" in coll and "2,000.0" in coll and "0.4% of H100 / H200 SXM" in coll


@pytest.mark.slow
def test_a_recorded_straggler_is_traced_to_its_module(tmp_path):
    """record(modules=True) on the same 2-rank DDP loop, the svd inside the model's `extra`
    module on rank 1: the straggler's excess is in that module, by the module's own forward
    time, which agrees with perf_counter around the op."""
    out = _profiled_run(tmp_path, 1, "--record")
    rep = gpuscope.analyze(os.path.join(out, "record"))
    with open(os.path.join(out, "extra-rank1.json")) as fh:
        own_ms = 1e3 * float(np.mean(json.load(fh)["extra_s"]))  # as per_step_ms: a mean
    mods = {m["name"]: m for m in next(r for r in rep.ops.ranks if r["rank"] == 1)["modules"]}
    assert set(mods) == {"body", "extra", "head"}
    # the module's forward is the op and its hooks: at least the op, a little more
    assert own_ms * 0.9 <= mods["extra"]["per_step_ms"] <= own_ms * 1.5 + 1.0
    s = next(s for s in rep.stragglers if s.rank == 1)
    top = s.ops[0]
    assert (top["kind"], top["name"]) == ("module", "extra")
    assert top["excess_ms"] >= 0.8 * own_ms and not top["only_here"]  # rank 0 runs it, empty


def test_module_times_on_cuda_events_are_read_once_complete_and_pooled():
    import torch
    from torch import nn

    from gpuscope.record.modules import ModuleTimer, resolve

    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    names, mods, warnings = resolve(net, ["0", "1", "missing"])
    assert names == ["0", "1"] and "no submodule 'missing'" in warnings[0]
    # step 0: linear 0->40, relu 40->50; step 1: linear 100->130, relu 130->135
    ev = FakeCuda([0, 40, 40, 50, 100, 130, 130, 135])
    t = ModuleTimer(names, mods, clock=None, events=ev)
    assert t.install()
    x = torch.zeros(1, 4)
    for step in (0, 1):
        net(x)
        t.step_end(step)
    ev.now = 60  # the device has done step 0 only: read without waiting
    first = t.meta(False)["modules"]
    assert (first["clock"], first["steps"], first["ns"], first["calls"]) == \
        ("cuda", [0], [[40, 10]], [[1, 1]])
    rest = t.meta(True)["modules"]  # at the end: one synchronize, the rest read
    assert (rest["steps"], rest["ns"]) == ([1], [[30, 5]])
    assert t.meta(True) is None and len(t.pool) == 8 and ev.created == 8
    t.remove()
    net(x)
    assert t.spans == []  # the hooks are gone


def test_module_times_on_the_host_clock_per_call_summed():
    from torch import nn

    from gpuscope.record.modules import ModuleTimer

    clock = iter([0, 7, 10, 13, 20, 24]).__next__
    net = nn.Sequential(nn.Identity())
    t = ModuleTimer(["0"], [net[0]], clock=clock)
    t.install()
    import torch
    for _ in range(2):
        net(torch.zeros(1))
    t.step_end(3)
    net(torch.zeros(1))
    t.step_end(4)
    t.step_end(5)  # no forward in it: no row
    m = t.meta(False)["modules"]
    assert (m["clock"], m["steps"], m["ns"], m["calls"]) == ("host", [3, 4], [[10], [4]], [[2], [1]])


def test_a_module_hook_that_fails_switches_timing_off_and_the_forward_goes_on():
    import torch
    from torch import nn

    from gpuscope.record.modules import ModuleTimer

    class Broken:
        def new_event(self):
            raise RuntimeError("CUDA error: an illegal memory access")

    net = nn.Sequential(nn.Linear(4, 4))
    t = ModuleTimer(["0"], [net[0]], clock=None, events=Broken())
    t.install()
    out = net(torch.ones(1, 4))  # the user's forward is not stopped
    assert out.shape == (1, 4) and t.handles == []  # the hooks took themselves out
    net(torch.ones(1, 4))
    assert t.meta(True) is None


def test_module_times_from_cuda_events_on_a_real_gpu_are_device_time():
    """A record made on an H200 (tests/fixtures/cuda_modules): the modules were timed with CUDA
    events, so the report gives their device time (gpu_ms), not a host time it never measured,
    and the straggler's excess is the `extra` module, as long as perf_counter between two
    synchronizes says the svd inside it took."""
    fix = os.path.join(HERE, "fixtures", "cuda_modules")
    rep = gpuscope.analyze(os.path.join(fix, "record"))
    with open(os.path.join(fix, "extra-rank1.json")) as fh:
        own_ms = 1e3 * float(np.mean(json.load(fh)["extra_s"]))
    mods = {m["name"]: m for m in next(r for r in rep.ops.ranks if r["rank"] == 1)["modules"]}
    assert set(mods) == {"body", "extra", "head"}
    assert all("gpu_ms" in m and "host_ms" not in m for m in mods.values()), mods
    assert own_ms * 0.9 <= mods["extra"]["gpu_ms"] <= own_ms * 1.1, (mods["extra"], own_ms)
    assert mods["body"]["gpu_ms"] < 0.05 * own_ms
    top = next(s for s in rep.stragglers if s.rank == 1).ops[0]
    assert (top["kind"], top["name"]) == ("module", "extra")


def _rank_tables_by_frame(per, types, gpu_ranks):
    """The per-rank tables as they were made before they were made on arrays: a frame per rank
    and kind, pandas' sort (the reference the array version must give exactly)."""
    from gpuscope.analyze.ops import KINDS, TOP, _r

    def row(r, kind, gpu):
        d = {"name": r.name, "per_step_ms": _r(r.time_ms), "count_per_step": _r(r.calls, 2)}
        if kind == "module":
            d["gpu_ms" if r.gpu_ms > 0 else "host_ms"] = _r(r.time_ms)
        elif kind != "kernel":
            d["host_ms"] = _r(r.host_ms)
            if gpu:
                d["gpu_ms"] = _r(r.gpu_ms)
        return d

    out = []
    for rank, mine in per.groupby("rank", sort=True):
        gpu = int(rank) in gpu_ranks
        entry = {"rank": int(rank)}
        for kind, key in KINDS:
            k = mine[mine["kind"] == kind].sort_values("time_ms", ascending=False)
            if k.empty:
                continue
            top = k.head(TOP)
            rows = [row(r, kind, gpu) for r in top.itertuples(index=False)]
            if kind == "kernel":
                for d, t in zip(rows, top["name"]):
                    d["type"] = types.get(t, "")
            entry[key] = rows
            entry[f"{key}_total_ms"] = _r(k["time_ms"].sum())
            entry[f"{key}_other_ms"] = _r(k["time_ms"].iloc[TOP:].sum())
        if gpu and "kernels_total_ms" in entry:
            entry["kernels_outside_ops_ms"] = _r(max(
                entry["kernels_total_ms"] - entry.get("ops_total_ms", 0.0), 0.0))
        out.append(entry)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_rank_tables_on_arrays_are_the_frames_exactly(seed):
    """rank_tables and hta_breakdown made on arrays (a slice per rank and kind: 10,000 ranks'
    traces spent minutes in a frame per rank) give what the frames gave, value for value, in
    the same order: ties of time (many, and in groups past numpy's 16-element insertion sort),
    ranks in any order, kinds the table does not show, ranks with one kind only."""
    import pandas as pd

    from gpuscope.analyze.ops import hta_breakdown, rank_tables

    rng = np.random.default_rng(seed)
    n = 3000
    kinds = np.array(["op", "range", "module", "kernel", "other"])
    per = pd.DataFrame({
        "rank": rng.integers(0, 40, n), "kind": kinds[rng.integers(0, 5, n)],
        "name": [f"n{i}" for i in rng.integers(0, 60, n)],
        "calls": rng.integers(1, 5, n) / 2,
        "host_ms": rng.integers(0, 6, n) / 8, "gpu_ms": rng.integers(0, 6, n) / 8})
    per["time_ms"] = np.where(rng.random(n) < 0.5, per["gpu_ms"], per["host_ms"])
    per = per[~((per["rank"] == 7) & (per["kind"] != "op"))]  # a rank with ops only
    types = {f"n{i}": ("COMM" if i % 3 else "COMPUTE") for i in range(60)}
    gpu = set(range(0, 40, 3))
    assert rank_tables(per, types, gpu) == _rank_tables_by_frame(per, types, gpu)

    kb = pd.DataFrame({"rank": rng.integers(0, 30, n), "name": [f"k{i}" for i in range(n)],
                       "type": kinds[rng.integers(0, 4, n)],
                       "count": rng.integers(1, 9, n), "sum_ns": rng.integers(1, 40, n) * 1000,
                       "max_ns": rng.integers(1, 9, n) * 1000, "min_ns": rng.integers(1, 9, n)})
    kb["name"] = kb["name"].astype("category")
    got = hta_breakdown(kb, {3: {"COMPUTATION": 5e6}})
    want = []
    for rank, g in kb.groupby("rank", sort=True):
        g = g.sort_values("sum_ns", ascending=False)
        want.append({"rank": int(rank), "kernels_total": len(g),
                     "names": [str(x) for x in g["name"].head(12)],
                     "mean_us": [round(s / c / 1e3, 1) for s, c in
                                 zip(g["sum_ns"].head(12), g["count"].head(12))]})
    assert [{"rank": r["rank"], "kernels_total": r["kernels_total"],
             "names": [k["name"] for k in r["kernels"]],
             "mean_us": [k["mean_us"] for k in r["kernels"]]} for r in got["ranks"]] == want
    assert got["ranks"][3]["types_us"] == {"COMPUTATION": 5000.0}
