"""Parallelism on a DeviceMesh: DTensor / tensor-parallel collectives timed by the recorder
(functional collectives), communication by process group named by its mesh dimension, the
trace's pg_config mesh names; a real 2D run (FSDP2 over dp x TP over tp, 4 ranks, gloo)."""

import os
import subprocess
import sys

import pytest

import gpuscope
from gpuscope.analyze.comm_groups import groups_section
from gpuscope.analyze.layout import Layout
from gpuscope.readers import read_path
from gpuscope.readers.kineto.rank import identify
from helpers import table_from_rows

HERE = os.path.dirname(__file__)


def test_groups_are_named_by_their_mesh_dimension_and_ordered_by_exposed_time():
    t = table_from_rows([{"rank": r, "step": 0, "compute": 10} for r in range(4)])
    for info in t.ranks.values():
        info.knobs["mesh_dims"] = {"1": "dp", "3": "tp"}
    t.ranks[3].knobs["mesh_dims"] = {"2": "dp", "4": "tp"}  # each rank knows its own groups
    comm = {0: {"1": 30e6, "3": 10e6}, 1: {"2": 20e6, "3": 12e6}, 2: {"1": 30e6, "4": 11e6},
            3: {"2": 22e6, "4": 9e6}}
    exposed = {r: {g: v / 2 for g, v in per.items()} for r, per in comm.items()}
    kinds = {"1": {"all_gather"}, "2": {"all_gather"}, "3": {"all_reduce"}, "4": {"all_reduce"}}
    layout = Layout([0, 1, 2, 3], {"1": [0, 2], "2": [1, 3], "3": [0, 1], "4": [2, 3]})
    out = groups_section(t, comm, exposed, kinds, layout)
    assert [(g.group, g.dim) for g in out] == [("1", "dp"), ("2", "dp"), ("3", "tp"),
                                               ("4", "tp")]
    assert out[0].comm_ms == pytest.approx(30) and out[0].exposed_ms == pytest.approx(15)
    assert out[0].ranks == [0, 2] and out[2].kinds == ["all_reduce"]
    assert groups_section(t, {0: {"": 1e6}}, {}, {}, layout) == []  # no group named: nothing


def test_a_traces_device_mesh_groups_name_their_dimension():
    info = {"rank": 0, "world_size": 4, "pg_config": [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]},
        {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1]},
        {"pg_name": "9", "pg_desc": 5, "ranks": [0]}]}  # a desc of the wrong type: ignored
    rid, _ = identify("rank0.pt.trace.json", info)
    assert rid.mesh_dims == {"1": "dp", "3": "tp"}
    assert identify("rank0.json", {"rank": 0, "pg_config": 7})[0].mesh_dims is None


def _run(out, workload: str, nproc: int, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(nproc), os.path.join(HERE, "workloads", workload), "--out", str(out), *args,
         "--profile"], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]


def _comm_agrees(out, bound: float = 0.2) -> None:
    """Record and traces of one run on communication over the steps the profiler captured, all
    ranks together, within `bound` (the issue's 20%; seen within -7% and +6% on these loops
    with one core kept busy, scripts in the commit that set it)."""
    k = read_path(str(out / "kineto")).frame
    r = read_path(str(out / "record")).frame
    r = r[r["step"].isin(set(k["step"]))]
    ours, theirs = float(r["comm_ns"].sum()), float(k["comm_ns"].sum())
    assert len(r) == len(k) and abs(ours - theirs) <= bound * theirs, (ours / 1e6, theirs / 1e6)


def _kinds_by_dim(rep) -> dict:
    dims: dict = {}
    for g in rep.comm_by_group:
        dims.setdefault(g.dim, set()).update(g.kinds)
    return dims


@pytest.mark.slow
def test_real_2d_run_fsdp_over_dp_and_tensor_parallel_over_tp(tmp_path):
    """The shape of pytorch/examples' fsdp_tp_example on 4 CPU ranks: the recorder times the
    tensor-parallel all-reduces DTensor issues (functional collectives) beside FSDP2's
    all-gathers and reduce-scatters, names each group by its mesh dimension, and agrees with
    the same run's torch.profiler traces on communication within 20% (before the functional
    collectives were timed, the recorder saw none of TP's)."""
    _run(tmp_path, "mesh.py", 4, "--steps", "10")
    rec = gpuscope.analyze(str(tmp_path / "record"))
    assert _kinds_by_dim(rec) == {"dp": {"all_gather", "reduce_scatter"}, "tp": {"all_reduce"}}, \
        rec.comm_by_group
    by_dim = {g.dim: g for g in rec.comm_by_group}
    mesh = rec.layout.mesh
    assert set(mesh.by_dim) == {"dp", "tp"}
    top = max(mesh.by_dim, key=lambda k: mesh.by_dim[k].exposed_ms)
    assert mesh.holds_back in (top, None)  # named when it holds 15% of the step or more
    assert sorted(len(g.ranks) for g in rec.comm_by_group) == [2, 2, 2, 2]
    assert by_dim["tp"].comm_ms > 0 and by_dim["dp"].comm_ms > 0
    kin = gpuscope.analyze(str(tmp_path / "kineto"))
    _comm_agrees(tmp_path)
    assert set(kin.knobs["mesh_dims"].values()) == {"dp", "tp"}


@pytest.mark.slow
def test_real_sequence_parallel_run_sees_its_gathers_and_scatters(tmp_path):
    """The example's Llama plan with sequence parallel (mesh.py --model block, 4 ranks): the
    norms' sequence shards gathered before attention and feed-forward and reduce-scattered
    after, through torch 2.13's all_gather_single / reduce_scatter_single (untimed before,
    counted as compute: record and trace then differed by 2x). Both on tp, timed, agreeing with
    the traces within 20%; the verdict names the dimension with the most exposed time."""
    _run(tmp_path, "mesh.py", 4, "--model", "block", "--steps", "8")
    rec = gpuscope.analyze(str(tmp_path / "record"))
    kinds = _kinds_by_dim(rec)
    assert kinds["dp"] == {"all_gather", "reduce_scatter"}, rec.comm_by_group
    assert {"all_gather", "reduce_scatter"} <= kinds["tp"], rec.comm_by_group
    mesh = rec.layout.mesh
    top = max(mesh.by_dim, key=lambda k: mesh.by_dim[k].exposed_ms)
    assert mesh.holds_back in (top, None)
    _comm_agrees(tmp_path)
    kin = gpuscope.analyze(str(tmp_path / "kineto"))
    assert any("carry no process group" in w for w in kin.warnings)


def test_exposed_tensor_parallel_communication_gets_its_suggestion():
    from gpuscope.analyze.bottlenecks.mesh import heaviest, suggest_mesh

    from msgspec.structs import replace

    from gpuscope.sections import CommGroup

    groups = [CommGroup(group="3", dim="tp", ranks=[0, 1], comm_ms=30.0, exposed_ms=25.0,
                        kinds=["all_reduce"]),
              CommGroup(group="1", dim="dp", ranks=[0, 2], comm_ms=20.0, exposed_ms=5.0,
                        kinds=["all_gather"])]
    assert heaviest(groups, 100.0)[0] == "tp"
    (s,) = suggest_mesh(groups, 100e6)
    assert s.knob == "tensor_parallel" and s.estimated_step_ms == pytest.approx(87.5)
    assert s.estimated_step_ms_range == pytest.approx((75.0, 100.0))
    assert "sequence parallel" in s.why and "NVLink" in s.why
    groups[0] = replace(groups[0], wait_ms=15.0)  # most of it waits for a slow member: only
    (s,) = suggest_mesh(groups, 100e6)  # the transfer is the links' to recover
    assert s.estimated_step_ms == pytest.approx(95.0)
    assert s.estimated_step_ms_range == pytest.approx((90.0, 100.0))
    assert "15.0 ms of it waiting for the group's slowest member" in s.why
    groups[0] = replace(groups[0], wait_ms=24.0)  # all but 1 ms waiting: nothing for the links
    assert suggest_mesh(groups, 100e6) == []
    groups[0] = replace(groups[0], wait_ms=None)
    cp = [replace(groups[0], dim="cp", kinds=["send", "recv"])]
    (c,) = suggest_mesh(cp, 100e6)
    assert c.knob == "context_parallel" and "ring" in c.why
    ep = [replace(groups[0], dim="ep", kinds=["all_to_all"])]
    assert suggest_mesh(ep, 100e6)[0].knob == "expert_parallel"
    groups[0] = replace(groups[0], exposed_ms=10.0)  # 10% of the step: under the comm threshold
    assert heaviest(groups, 100.0) is None and suggest_mesh(groups, 100e6) == []
    # dp holds it: comm's suggestions
    groups = [replace(groups[0], exposed_ms=5.0), replace(groups[1], exposed_ms=40.0)]
    assert heaviest(groups, 100.0)[0] == "dp" and suggest_mesh(groups, 100e6) == []


@pytest.mark.slow
def test_real_expert_parallel_run_names_the_rank_whose_expert_gets_most_tokens(tmp_path):
    """2 ranks, one expert each; 80% of every rank's tokens routed to rank 1's expert through
    the functional all_to_all_single (with autograd: its backward all-to-all is timed on its
    autograd node). Rank 1 is named from both sources, the suggestion points at routing, and
    the two agree on communication over the profiled steps."""
    _run(tmp_path, "experts.py", 2, "--steps", "14")
    import json

    tokens = [json.loads((tmp_path / f"tokens-rank{r}.json").read_text())[-1] for r in range(2)]
    assert tokens[1] >= 3.9 * tokens[0]  # the loop's own count: rank 1's expert gets ~80%
    rec = gpuscope.analyze(str(tmp_path / "record"))
    # the recorder's rows of the dispatch all-to-all are the loop's own token counts (the same
    # every step), and the busiest rank is named with its share
    assert rec.routing.rows_by_rank == {"0": tokens[0], "1": tokens[1]}, rec.routing
    assert rec.routing.busiest_rank == 1 and rec.routing.uneven
    assert rec.routing.busiest_share == pytest.approx(tokens[1] / sum(tokens), abs=1e-4)
    assert "rank 1 receives 80% of the rows" in rec.suggestions[0].why
    for src in ("record", "kineto"):
        rep = gpuscope.analyze(str(tmp_path / src))
        assert rep.verdict.label == "imbalanced" and rep.straggler_ranks == [1], src
        top = rep.suggestions[0]
        assert top.knob == "straggler" and "all-to-all" in top.why and "tokens" in top.why, src
    _comm_agrees(tmp_path)


MESH2D = os.path.join(HERE, "..", "sample_traces", "parallel", "mesh2d")
MESH2D_WANT = __import__("json").load(open(os.path.join(HERE, "..", "sample_traces", "parallel",
                                                        "MANIFEST.json")))["samples"]["mesh2d"]


def test_2d_sample_splits_each_dimension_into_wait_and_transfer():
    """sample_traces/parallel/mesh2d (scripts/make_parallel_samples.py): FSDP2 over dp, TP + SP
    over tp on 4 ranks. Every group's exposed time is its wait plus its transfer, the SP
    all-gathers and reduce-scatters are on tp, and the dimension named as holding the step back
    is the one with the most exposed communication."""
    rep = gpuscope.analyze(os.path.join(MESH2D, "record"))
    assert rep.verdict.label in MESH2D_WANT["expected"]
    assert rep.verdict.label == MESH2D_WANT["record"]["verdict"]
    kinds = {}
    for g in rep.comm_by_group:
        kinds.setdefault(g.dim, set()).update(g.kinds)
        assert 0 <= g.wait_ms <= g.exposed_ms <= g.comm_ms + 1e-3, g
        assert g.wait_ms + g.transfer_ms == pytest.approx(g.exposed_ms, abs=2e-3)
    assert kinds["dp"] == {"all_gather", "reduce_scatter"}
    assert {"all_gather", "reduce_scatter"} <= kinds["tp"]  # sequence parallel's pair
    mesh = rep.layout.mesh
    top = max(mesh.by_dim, key=lambda d: mesh.by_dim[d].exposed_ms)
    assert mesh.holds_back == top == MESH2D_WANT["record"]["holds_back"]
    for d in mesh.by_dim.values():
        assert d.wait_ms + d.transfer_ms == pytest.approx(d.exposed_ms, abs=2e-3)
    # one sentence for it, made once: the terminal and the HTML show the same words
    from gpuscope.render import html, terminal

    said = terminal.holds_back_words(rep.layout)
    assert said.startswith(f"The {top!r} dimension holds the step back: ")
    assert said in " ".join(terminal.render(rep, width=400).split())
    assert f'<p id="mesh-holds-back"><b>{html.esc(said)}</b></p>' in html.render(rep)


def test_2d_sample_traces_say_why_they_have_no_split():
    """CPU (gloo) traces name the mesh (pg_config) but not the group of each collective: the
    split is left out, and the report says so rather than guessing."""
    rep = gpuscope.analyze(os.path.join(MESH2D, "kineto"))
    assert rep.verdict.label == MESH2D_WANT["kineto"]["verdict"]
    assert rep.comm_by_group == [] and (rep.layout is None or rep.layout.mesh is None)
    assert any("carry no process group" in w and "dp, tp" in w for w in rep.warnings)


def test_2d_sample_views_show_each_dimension(tmp_path):
    """Parquet columns, the HTML table and panel, the Perfetto tracks: per dimension, and the
    Parquet columns add up to the report's means."""
    from gpuscope.render.html import figures, render
    from gpuscope.render.parquet import step_table

    rep = gpuscope.analyze(os.path.join(MESH2D, "record"))
    t = step_table(rep)
    by_dim = rep.layout.mesh.by_dim
    for dim in ("dp", "tp"):
        assert t[f"comm_{dim}_ms"].mean() == pytest.approx(by_dim[dim].comm_ms, rel=1e-3)
        assert t[f"comm_exposed_{dim}_ms"].mean() == pytest.approx(by_dim[dim].exposed_ms,
                                                                   rel=1e-3)
        assert t[f"wait_{dim}_ms"].mean() == pytest.approx(by_dim[dim].wait_ms, rel=1e-3)
    # a rank's dimensions never hold more communication than its step does
    assert (t["comm_dp_ms"] + t["comm_tp_ms"] <= t["comm_ms"] * 2 + 1e-6).all()
    page = render(rep, plotlyjs="plotly.js")
    assert 'id="mesh"' in page and "<td>tp</td>" in page and "<td>dp</td>" in page
    fig = dict(figures(rep))["panel-mesh"]
    # the panel's bars are the same means: per dimension, over its ranks, wait + transfer is the
    # exposed time and the three parts the comm
    bars = {tr.name: dict(zip(zip(*tr.x), tr.y)) for tr in fig.data}
    for dim in ("dp", "tp"):
        keys = [k for k in bars["wait"] if k[0] == dim]
        mean = lambda part: sum(bars[part][k] for k in keys) / len(keys)  # noqa: E731
        assert mean("wait") + mean("transfer") == pytest.approx(by_dim[dim].exposed_ms,
                                                               abs=2e-3)
        assert mean("wait") == pytest.approx(by_dim[dim].wait_ms, abs=2e-3)
    out = tmp_path / "t.json"
    from gpuscope.cli import main

    assert main(["export", os.path.join(MESH2D, "record"), "--perfetto", str(out)]) == 0
    doc = __import__("json").loads(out.read_text())
    tracks = {e["args"]["name"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"comm: all_gather [dp]", "comm: all_gather [tp]", "comm: reduce_scatter [tp]"} <= tracks


def test_a_traced_collective_gets_its_dimension_and_a_track_of_its_own():
    from gpuscope.render.perfetto import MESH_TID, _mesh_copy

    ev, tids = [], {}
    kernel = {"ph": "X", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 10.0, "dur": 5.0,
              "pid": 7, "tid": 3, "args": {"Process Group Name": "3"}}
    _mesh_copy(kernel, {"3": "tp", "1": "dp"}, 0, 1, tids, ev)
    assert kernel["args"]["mesh dim"] == "tp"
    names = [e for e in ev if e["ph"] == "M" and e["name"] == "thread_name"]
    assert names[0]["args"]["name"] == "mesh tp" and tids == {(0, "tp"): MESH_TID}
    (copy,) = [e for e in ev if e["ph"] == "X"]
    assert (copy["pid"], copy["tid"], copy["ts"], copy["dur"]) == (1, MESH_TID, 10.0, 5.0)
    other = {"ph": "X", "name": "aten::mm", "ts": 1.0, "dur": 1.0, "args": {}}
    _mesh_copy(other, {"3": "tp"}, 0, 1, tids, ev)
    assert "mesh dim" not in other["args"] and len(ev) == 3  # not a mesh group's: untouched


def test_waits_are_split_per_collective_key():
    """key_waits: within each key and step, the excess over the least exposed rank; a key with
    an instance missing on one rank, and point-to-point, are left out."""
    import pandas as pd

    from gpuscope.analyze.wait import key_waits

    comm = pd.DataFrame({
        "rank": [0, 1, 0, 1, 0, 1, 0],
        "step": [5, 5, 5, 5, 6, 6, 5],
        "key": ["all_reduce:3", "all_reduce:3", "all_gather:1", "all_gather:1",
                "all_reduce:3", "all_reduce:3", "send_next:0"],
        "comm_ns": [10, 10, 8, 8, 9, 9, 4], "exposed_ns": [10, 4, 3, 8, 9, 2, 4],
        "count": [1, 1, 2, 2, 1, 2, 1]})
    w = key_waits(comm).set_index(["rank", "step", "key"])["wait_ns"]
    assert w[(0, 5, "all_reduce:3")] == 6 and w[(1, 5, "all_reduce:3")] == 0
    assert w[(1, 5, "all_gather:1")] == 5 and w[(0, 5, "all_gather:1")] == 0
    assert w[(0, 6, "all_reduce:3")] == 0 and w[(1, 6, "all_reduce:3")] == 0  # counts differ
    assert not any(k.startswith("send") for _, _, k in w.index)
    assert key_waits(comm[comm["key"] == "send_next:0"]) is None


def test_every_functional_collective_of_this_torch_is_timed_and_its_backward_found(tmp_path):
    """The functional collectives are found by name (2.13 added all_gather_single and
    reduce_scatter_single, which DTensor uses): helpers are not; the autograd node of a
    collective is found under the cat a gather on another dimension ends in."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from gpuscope.record.collectives import _collective_node, funcol_kinds

    kinds = funcol_kinds(funcol)
    # each that this torch has (CI's 2.13 has all three; the GPU image's 2.11 lacks the first two)
    for name, kind in (("all_gather_single", "all_gather"),
                       ("reduce_scatter_single", "reduce_scatter"),
                       ("all_to_all_single_autograd", "all_to_all")):
        if hasattr(funcol, name):
            assert kinds[name] == kind
    assert "all_gather_tensor" in kinds and "all_reduce" in kinds
    assert not any(n.endswith(("_backward", "_setup_context")) for n in kinds)
    assert "wait_tensor" not in kinds
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        x = torch.randn(4, 3, requires_grad=True)
        for gather_dim in (0, 1):
            out = funcol.all_gather_single(x, gather_dim, dist.group.WORLD)
            node = _collective_node(getattr(out, "elem", out).grad_fn)
            assert node is not None and "all_gather" in node.name(), gather_dim
            out.wait() if hasattr(out, "wait") else None
        with torch.no_grad():  # nothing for autograd to run: nothing to hook
            out = funcol.all_gather_single(x, 0, dist.group.WORLD)
        assert _collective_node(getattr(out, "elem", out).grad_fn) is None
        out.wait()
        assert _collective_node(None) is None
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:The combination of ranks \\+ tag:FutureWarning")
def test_a_functional_collectives_group_is_resolved_once_per_argument(tmp_path, monkeypatch):
    # the group argument's name is cached (the recorder's per-call cost): a process group by
    # identity, a list of ranks by value; each gives the name funcol gives it, and a recording's
    # end forgets them (a later one may see other groups behind the same objects)
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from gpuscope.record import collectives as C

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        sub = dist.new_group([0])
        calls = []
        real = funcol._resolve_group_name
        monkeypatch.setattr(funcol, "_resolve_group_name",
                            lambda g, t="": calls.append(g) or real(g, t))
        from gpuscope.record import groups

        groups._by_arg.clear()
        names = [groups.funcol_group_name(funcol, g, "") for g in (dist.group.WORLD, sub, [0], sub, [0],
                                                           dist.group.WORLD, [0])]
        assert names[0] == names[5] == "default"
        assert names[1] == names[3] == str(real(sub, "")) != "default"
        assert names[2] == names[4] == names[6]
        assert len(calls) == 3  # once each: the world's group, sub, [0]
        C._restore()
        assert groups._by_arg == {}
    finally:
        dist.destroy_process_group()


def test_routing_names_the_rank_the_most_uneven_all_to_all_favours():
    """Instance by instance: a counts exchange (even), the dispatch (rank 2 gets 70%), the
    combine (even): the dispatch is the evidence; fewer than two ranks, or even rows, name no
    one; only the analysed steps count."""
    import pandas as pd

    from gpuscope.analyze.routing import routing_note, routing_section

    rows = []
    for step in range(4):
        for rank, got in ((0, 150), (1, 150), (2, 700)):
            rows += [(rank, step, 0, 3), (rank, step, 1, got), (rank, step, 2, 333)]
    rows.append((2, 9, 1, 10**6))  # a step not analysed: left out
    routing = pd.DataFrame(rows, columns=["rank", "step", "instance", "rows"])
    frame = pd.DataFrame({"rank": [r for s in range(4) for r in range(3)],
                          "step": [s for s in range(4) for _ in range(3)]})
    sec = routing_section(routing, frame, None)
    assert sec.instance == 1 and sec.instances == 3 and sec.steps == 4
    assert sec.rows_by_rank == {"0": 150.0, "1": 150.0, "2": 700.0}
    assert sec.busiest_rank == 2 and sec.busiest_share == pytest.approx(0.7)
    assert sec.max_over_mean == pytest.approx(2.1) and sec.uneven
    assert "rank 2 receives 70% of the rows" in routing_note(sec)
    even = routing.assign(rows=100)
    assert routing_section(even, frame, None).uneven is False and routing_note(
        routing_section(even, frame, None)) == ""
    assert routing_section(routing[routing["rank"] == 0], frame, None) is None
    assert routing_section(None, frame, None) is None


def test_all_to_all_rows_are_read_back_and_malformed_ones_said():
    from gpuscope.readers.routing_records import routing_frame, routing_ok
    from gpuscope.record.collectives import _a2a_rows_c10d, _a2a_rows_funcol
    from gpuscope.record.rows import Built
    from gpuscope.record.sinks import RoutingSink

    sink = RoutingSink()
    assert sink.meta(False) is None
    sink.rows(Built([[3], [4]], [(3, [2, 640, -1])], [1, 1]))
    sink.rows(Built([[5]], [(4, [2, 650, 512])], [1]))
    meta = sink.meta(False)
    assert meta == {"routing": {"steps": [3, 4], "rows": [[2, 640, -1], [2, 650, 512]]}}
    assert sink.meta(True) is None  # handed over once
    assert routing_ok(meta["routing"])
    for bad in ({"steps": [1], "rows": []}, {"steps": [1], "rows": [["x"]]}, [], {"steps": [-1],
                                                                                "rows": [[1]]}):
        assert not routing_ok(bad), bad
    f = routing_frame([(1, [meta["routing"]])])
    assert f.values.tolist() == [[1, 3, 0, 2], [1, 3, 1, 640], [1, 4, 0, 2], [1, 4, 1, 650],
                                 [1, 4, 2, 512]]  # the shapeless -1 left out
    import torch

    x = torch.zeros(6, 2)
    assert _a2a_rows_funcol((x, [1, 4], [3, 3], None), {}) == 5
    assert _a2a_rows_funcol((x, None, None, None), {}) == 6  # even splits: all of it
    assert _a2a_rows_funcol((x,), {"output_split_sizes": [2, 2]}) == 4
    assert _a2a_rows_c10d((torch.zeros(7, 1), x), {}) == 7
    assert _a2a_rows_c10d((), {}) == -1


def _gpu_mesh_traces(tmp_path, slow_tp_rank=None):
    """4 hand-built GPU traces on a 2 x 2 mesh: dp groups "1" = (0, 2), "2" = (1, 3); tp groups
    "3" = (0, 1), "4" = (2, 3). Each step [0, 1000) us: a gemm 0-400, a tp all-reduce 400-600
    (exposed), a dp all-gather 600-700 (exposed), a gemm 700-900. `slow_tp_rank`'s gemm runs
    100 us longer, so its tp peer waits 100 us inside the all-reduce (it starts at 400, the slow
    one at 500; both end at 600)."""
    import json

    from test_kineto_steps import X, kernel, launch

    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
           {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]},
           {"pg_name": "2", "pg_desc": "mesh_dp", "ranks": [1, 3]},
           {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1]},
           {"pg_name": "4", "pg_desc": "mesh_tp", "ranks": [2, 3]}]
    for r in range(4):
        dp, tp = ("1" if r in (0, 2) else "2"), ("3" if r < 2 else "4")
        ev = []
        for s in range(1, 4):
            t0, c = (s - 1) * 1000, s * 10
            late = 100 if r == slow_tp_rank else 0
            ev += [X(f"ProfilerStep#{s}", t0, 1000),
                   launch(t0 + 1, c), kernel("gemm", t0, 400 + late, c),
                   launch(t0 + 2, c + 1),
                   X("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 400 + late, 200 - late,
                     cat="kernel", tid=7, correlation=c + 1, stream=7,
                     **{"Process Group Name": tp}),
                   launch(t0 + 3, c + 2),
                   X("ncclDevKernel_AllGather_RING_LL", t0 + 600, 100, cat="kernel", tid=7,
                     correlation=c + 2, stream=7, **{"Process Group Name": dp}),
                   launch(t0 + 4, c + 3), kernel("gemm", t0 + 700, 200, c + 3)]
        ev.append(X("ProfilerStep#4", 3000, 100))
        (tmp_path / f"rank{r}.pt.trace.json").write_text(json.dumps({
            "traceEvents": ev, "distributedInfo": {"rank": r, "world_size": 4,
                                                   "backend": "nccl", "pg_config": pgs}}))
    return tmp_path


def test_gpu_traces_split_each_dimension_by_its_kernels_groups(tmp_path):
    """GPU traces name each collective's group (the kernel's Process Group Name): per dimension
    the comm, and the wait inside tp where one rank of a tp pair computes 100 us longer; the
    Perfetto export puts each rank's collectives on a track per dimension."""
    from gpuscope.cli import main

    _gpu_mesh_traces(tmp_path, slow_tp_rank=1)
    rep = gpuscope.analyze(str(tmp_path))
    by = {g.group: g for g in rep.comm_by_group}
    assert {g: by[g].dim for g in by} == {"1": "dp", "2": "dp", "3": "tp", "4": "tp"}
    assert by["1"].comm_ms == pytest.approx(0.1) and by["3"].kinds == ["all_reduce"]
    # tp group 3: rank 0's all-reduce 200 us (100 of it waiting for rank 1), rank 1's 100 us
    assert by["3"].comm_ms == pytest.approx(0.15)
    assert by["3"].wait_ms == pytest.approx(0.05) and by["4"].wait_ms == pytest.approx(0)
    assert rep.layout.mesh.by_dim["tp"].wait_ms == pytest.approx(0.025)
    out = tmp_path / "t.json"
    assert main(["export", str(tmp_path), "--perfetto", str(out)]) == 0
    doc = __import__("json").loads(out.read_text())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    mesh_tracks = {v for v in names.values() if v.startswith("mesh ")}
    assert mesh_tracks == {"mesh dp", "mesh tp"}
    copies = [e for e in doc["traceEvents"] if e["ph"] == "X"
              and names.get((e["pid"], e["tid"]), "").startswith("mesh ")]
    assert len(copies) == 4 * 3 * 2  # every rank's two collectives in each of the 3 steps
    assert all(e["args"]["mesh dim"] == names[(e["pid"], e["tid"])][5:] for e in copies)


def test_what_goes_wrong_in_counting_never_reaches_the_training():
    """Counting an all-to-all's rows or finding a collective's autograd node runs inside the
    user's call: an argument or a graph of a shape we do not know costs the count, not the
    step."""
    from gpuscope.record.collectives import _count_rows, _time_backward

    got = []

    class Timer:
        on_rows = staticmethod(got.append)

    def broken(args, kwargs):
        raise RuntimeError("a symbolic shape")

    _count_rows(Timer(), broken, (), {})
    _count_rows(Timer(), lambda a, k: 7, (), {})
    assert got == [7]

    class Node:
        def name(self):
            raise RuntimeError("a node that will not say")

    class Out:
        grad_fn = Node()

    _time_backward(Timer(), "all_to_all:0", Out())  # returns, hooks nothing


def _funcol_has(name: str) -> bool:
    import torch.distributed._functional_collectives as funcol

    return hasattr(funcol, name)


@pytest.mark.skipif(not _funcol_has("all_gather_single"),
                    reason="this torch has no functional all_gather_single (added in 2.13)")
def test_a_gather_that_waits_inside_its_call_counts_the_wait_not_the_concatenation(
        tmp_path, monkeypatch):
    """funcol's all_gather_single on dimension 1 waits inside the call, then concatenates the
    gathered chunks (sequence parallel's gathers, large on the example's model): the wait is the
    collective's blocked time, the launch and the concatenation host work, as the trace counts
    them (the concatenation is made to take 20 ms here). Before, the whole call was counted as
    blocked communication: the real 2D example's all-gathers read 33% above its traces."""
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GPUSCOPE_DISABLE"):
        monkeypatch.delenv(var, raising=False)
    concat = funcol._maybe_view_chunk_cat

    def slow_concat(*args, **kwargs):
        time.sleep(0.02)
        return concat(*args, **kwargs)

    monkeypatch.setattr(funcol, "_maybe_view_chunk_cat", slow_concat)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        x = torch.randn(8, 4)
        with gpuscope.record(tmp_path / "run", memory=False) as rec:
            for _ in rec.data(range(6)):
                out = funcol.all_gather_single(x, 1, dist.group.WORLD)
                assert not hasattr(out, "trigger_wait")  # it waited inside the call
                rec.step()
    finally:
        dist.destroy_process_group()
    rep = gpuscope.analyze(str(tmp_path / "run"))
    frame = rep.table.frame
    assert len(frame) == 5 and (frame["step_ns"] >= 20e6).all()
    # the 20 ms of concatenation is outside the exposed communication, however long the wait
    # (13.5 ms in one step once, the gather descheduled on a busy machine)
    assert (frame["step_ns"] - frame["comm_exposed_ns"] >= 20e6).all(), \
        frame[["step_ns", "comm_exposed_ns"]].values.tolist()
    assert (frame["comm_exposed_ns"] < 10e6).sum() >= 3, frame["comm_exposed_ns"].tolist()
    assert (frame["n_comm"] == 1).all() and set(rep.ranks[0].comm_by_kind) == {"all_gather"}
