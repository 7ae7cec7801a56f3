"""Pipeline and hybrid layouts on hand-built tables: chains from point-to-point peers, process
groups, the bubble / imbalance split, the stage view and its suggestions, the report's JSON.
(tests/test_parallel.py runs the real thing.)"""

import numpy as np
import pandas as pd
import pytest

from gpuscope.analyze.layout import Layout, find_layout, split_bubble
from gpuscope.analyze.run import analyze_table
from gpuscope.analyze.bottlenecks.pipeline import model_step, stage_view, suggest_pipeline
from gpuscope.readers.kineto.events import RankEvents, is_p2p, p2p_masks
from gpuscope.readers.rundir import with_bubble
from gpuscope.report import PipelineResult, Report, StageResult
from gpuscope.runtable import COMM_COLUMNS, RankInfo, RunTable

MS = 1_000_000


def pipeline_table(busy_ms: dict[int, float], steps: int = 8, micro: int = 4,
                   layers: dict[int, list] | None = None, groups: dict | None = None,
                   chains: list[list[int]] | None = None) -> RunTable:
    """A recorded run of GPipe chains: each rank computes busy_ms[rank] per step and waits the
    rest of the step (the slowest stage's pace) on its neighbours, point to point."""
    chains = chains or [sorted(busy_ms)]
    rows, comm = [], []
    for chain in chains:
        pace = model_step([busy_ms[r] for r in chain], micro)
        for i, r in enumerate(chain):
            for s in range(steps):
                wait = pace - busy_ms[r]
                rows.append({"rank": r, "step": s, "start_ns": s * 1000 * MS,
                             "step_ns": int(pace * MS), "data_ns": 0,
                             "compute_ns": int(busy_ms[r] * MS), "comm_ns": int(wait * MS),
                             "comm_exposed_ns": int(wait * MS), "wait_ns": 0, "other_ns": 0,
                             "n_comm": 2 * micro, "data_cpu_ns": 0})
                # the first stage waits on the next one, the others on the previous one
                if i == 0:
                    comm.append((r, s, f"recv_next:{chain[1]}", int(wait * MS), int(wait * MS), micro))
                    comm.append((r, s, f"send_next:{chain[1]}", 0, 0, micro))
                else:
                    comm.append((r, s, f"recv_prev:{chain[i - 1]}", int(wait * MS), int(wait * MS), micro))
                    comm.append((r, s, f"send_prev:{chain[i - 1]}", 0, 0, micro))
    frame = pd.DataFrame(rows).sort_values(["rank", "step"]).reset_index(drop=True)
    comm_frame = pd.DataFrame(comm, columns=list(COMM_COLUMNS))
    frame = with_bubble(frame, comm_frame)
    ranks = {}
    for r in busy_ms:
        knobs = {"forwards_per_step": micro, "model": "Sequential"}
        if layers and r in layers:
            knobs["layers"] = layers[r]
        if groups:
            knobs["process_groups"] = {n: g for n, g in groups.items() if r in g}
        ranks[r] = RankInfo(r, "h", knobs)
    return RunTable(frame, "record", "<hand-built>", ranks, len(busy_ms), [], comm=comm_frame)


def test_model_step_is_gpipe_fill_drain_plus_steady_state():
    # balanced: (M + S - 1) slots of busy / M each
    assert model_step([40.0, 40.0], 4) == pytest.approx(5 * 10.0)
    assert model_step([10.0, 30.0], 4) == pytest.approx(40 / 4 + 0.75 * 30)
    assert model_step([10.0, 30.0], None) == 30.0  # unknown M: the slowest stage's pace


def test_chains_come_from_peers_and_groups_from_knobs():
    t = pipeline_table({0: 10, 1: 10, 2: 10, 3: 10}, chains=[[0, 1], [2, 3]],
                       groups={"dp0": [0, 2], "dp1": [1, 3], "pp0": [0, 1], "pp1": [2, 3]})
    lay = find_layout(t)
    assert lay.chains == [[0, 1], [2, 3]] and lay.stage_ranks == [0, 1, 2, 3]
    assert lay.stage_of(3) == (1, 1)
    # the pipeline groups hold the chains: a rank's peers are its data-parallel group
    assert lay.peer_group(3) == ("dp1", [1, 3])
    assert Layout.from_dict(lay.to_dict(), lay.ranks) == lay


def test_peer_group_is_none_when_ambiguous_or_absent():
    lay = Layout([0, 1, 2, 3], {"a": [0, 1], "b": [0, 2]}, [], [0, 1, 2, 3])
    assert lay.peer_group(0) is None  # two groups of the same size
    assert lay.peer_group(3) is None  # in none


def test_bubble_beyond_the_data_parallel_peers_is_imbalance():
    frame = pd.DataFrame({"rank": [0, 2, 0, 2], "step": [0, 0, 1, 1],
                          "bubble_ns": [5, 50, 6, 60], "wait_ns": [40, 0, 50, 0]})
    lay = Layout([0, 2], {"dp": [0, 2]}, [[0], [2]], [0, 2])
    out = split_bubble(frame, lay)
    assert out["bubble_ns"].tolist() == [5, 5, 6, 6]
    assert out["wait_ns"].tolist() == [40, 45, 50, 54]
    # without data-parallel peers all of it stays bubble
    assert split_bubble(frame, Layout([0, 2], {}, [[0, 2]], [0, 2]))["bubble_ns"].tolist() == \
        [5, 50, 6, 60]


def test_heavy_stage_named_and_its_first_layers_moved_back():
    layers = {1: [["0", 100], ["2", 100], ["4", 100], ["6", 100], ["8", 100], ["10", 100]],
              0: [["0", 100], ["2", 100]]}
    rep = analyze_table(pipeline_table({0: 40.0, 1: 120.0}, layers=layers))
    assert rep.verdict.label == "pipeline-bound"
    p = rep.pipeline
    assert p.slowest_rank == 1 and p.n_stages == 2 and p.microbatches == 4
    assert p.ideal_bubble_share == pytest.approx(0.2)
    assert [s.stage for s in p.stages] == [0, 1]
    assert p.stages[0].wait_next_ns == 90 * MS and p.stages[1].wait_prev_ns == 10 * MS
    top = rep.suggestions[0]
    assert top.knob == "pipeline_partition"
    # 6 layers of 20 ms on stage 1, stage 0 at 40 ms: 2 layers move (80 / 80)
    assert top.proposed == "move its first 2 layer(s) (0, 2) from stage 1 (rank 1) to stage 0 (rank 0)"
    before, after = model_step([40, 120], 4), model_step([80, 80], 4)
    assert top.estimated_step_ms == pytest.approx(rep.steps[0].step_ns / MS * after / before,
                                                  rel=1e-3)
    assert not rep.stragglers


def test_heavy_first_stage_moves_its_last_layers_on():
    layers = {0: [["a", 1], ["b", 1], ["c", 1], ["d", 1]], 1: [["e", 1]]}
    rep = analyze_table(pipeline_table({0: 100.0, 1: 25.0}, layers=layers))
    assert "last" in rep.suggestions[0].proposed and "(d" in rep.suggestions[0].proposed
    assert "from stage 0 (rank 0) to stage 1 (rank 1)" in rep.suggestions[0].proposed


def test_without_layers_the_time_to_move_is_given():
    rep = analyze_table(pipeline_table({0: 40.0, 1: 120.0}))
    assert "move ~40.0 ms of work per step" in rep.suggestions[0].proposed


def test_balanced_stages_few_microbatches_get_more_microbatches():
    # 4 stages, 4 micro-batches: 3 / 7 of the step is fill and drain
    t = pipeline_table({0: 80.0, 1: 80.0, 2: 80.0, 3: 80.0}, micro=4)
    rep = analyze_table(t)
    assert rep.verdict.label == "pipeline-bound"
    assert rep.pipeline.ideal_bubble_share == pytest.approx(3 / 7)
    s = next(x for x in rep.suggestions if x.knob == "n_microbatches")
    assert (s.current, s.proposed) == (4, 16)
    assert s.estimated_step_ms == pytest.approx(140 * model_step([80] * 4, 16) / 140, rel=1e-3)


def test_balanced_two_stages_four_microbatches_get_no_suggestion_but_a_reason():
    rep = analyze_table(pipeline_table({0: 80.0, 1: 80.0}, micro=4))
    assert rep.verdict.label == "pipeline-bound" and not rep.suggestions
    assert any("schedule's own" in w for w in rep.warnings)


def test_a_stage_slow_in_one_replica_is_a_straggler_not_a_partition():
    """2 x 2: rank 3 slow. Its data-parallel peer (rank 1) waits in the all-reduce; its pipeline
    peer (rank 2) waits on it point to point: imbalance, not bubble."""
    t = pipeline_table({0: 40.0, 1: 40.0, 2: 40.0, 3: 70.0}, chains=[[0, 1], [2, 3]],
                       groups={"dp0": [0, 2], "dp1": [1, 3]})
    # the all-reduce: each data-parallel group waits for its slowest member's replica
    frame, comm = t.frame.copy(), [t.comm]
    slowest = frame.groupby("step")["step_ns"].transform("max")
    extra = (slowest - frame["step_ns"]).to_numpy()
    rows = []
    for i, (r, s) in enumerate(zip(frame["rank"], frame["step"])):
        ar = int(extra[i] + 2 * MS)
        rows.append((r, s, f"all_reduce:{'dp0' if r in (0, 2) else 'dp1'}", ar, ar, 1))
    frame["step_ns"] = slowest + 2 * MS
    frame["comm_ns"] += extra + 2 * MS
    frame["comm_exposed_ns"] += extra + 2 * MS
    comm.append(pd.DataFrame(rows, columns=list(COMM_COLUMNS)))
    t = RunTable(frame, "record", "<hand-built>", t.ranks, 4, [], comm=pd.concat(comm))
    rep = analyze_table(t)
    assert rep.verdict.label == "imbalanced"
    assert rep.straggler_ranks == [3] and rep.stragglers[0].group == [1, 3]
    assert not any(s.knob == "pipeline_partition" for s in rep.suggestions)
    d = rep.to_dict()
    assert d["layout"]["pipelines"] == [[0, 1], [2, 3]]
    assert d["straggler_details"][0]["group"] == [1, 3]
    back = Report.from_dict(d)
    assert back.pipeline.slowest_rank == 3 and back.layout == rep.layout
    assert back.to_dict() == d


def test_stage_view_takes_the_least_busy_replica():
    st = lambda r, s, p, b: StageResult(r, s, p, 100 * MS, b * MS, b * MS, 0, 0, 0, 4)  # noqa: E731
    p = PipelineResult((st(0, 0, 0, 40), st(1, 1, 0, 40), st(2, 0, 1, 40), st(3, 1, 1, 90),
                        st(4, 0, 2, 40), st(5, 1, 2, 40)), 2, 4, 0.2, 0.2, 3, 1.0)
    view = stage_view(p)
    assert [(v.stage, v.ranks, v.busy_ns) for v in view] == [(0, (0, 2, 4), 40 * MS),
                                                              (1, (1, 3, 5), 40 * MS)]
    empty = RunTable(pd.DataFrame(), "record", "", {}, 6, [])
    assert suggest_pipeline(p, empty, 100 * MS)[0] == []
    # two replicas, stage 1 slow in one (rank 3, 90 ms) and a little slower in the other
    # (rank 1, 44 ms, a busy core): a median over two (67 ms) would still ask to repartition
    two = PipelineResult((st(0, 0, 0, 40), st(1, 1, 0, 44), st(2, 0, 1, 40), st(3, 1, 1, 90)),
                         2, 4, 0.2, 0.2, 2, 1.0)
    assert [v.busy_ns for v in stage_view(two)] == [40 * MS, 44 * MS]
    assert not any(s.knob == "pipeline_partition" for s in suggest_pipeline(two, empty,
                                                                            100 * MS)[0])
    # slow in both replicas: the partition is what to change
    both = PipelineResult((st(0, 0, 0, 40), st(1, 1, 0, 85), st(2, 0, 1, 40), st(3, 1, 1, 90)),
                          2, 4, 0.2, 0.2, 2, 1.0)
    assert [v.busy_ns for v in stage_view(both)] == [40 * MS, 85 * MS]
    assert any(s.knob == "pipeline_partition" for s in suggest_pipeline(both, empty,
                                                                        100 * MS)[0])


def test_kineto_point_to_point_keys():
    assert is_p2p(("", "gloo:send")) and is_p2p(("", "nccl:recv")) and is_p2p(("pg", "send"))
    assert not is_p2p(("", "gloo:all_reduce")) and not is_p2p(None)
    assert is_p2p(("", "sendrecv")) and not is_p2p(("", "sendrecv"), sendrecv_kernels=False)


def _events(host_names: list, dev_names: list) -> RankEvents:
    z = np.zeros(len(host_names), np.int64)
    d = np.zeros(len(dev_names), np.int64)
    return RankEvents(z, z, z, z, z, z, z, [("", n) for n in host_names], d, d, d, d, d,
                      [("", n) for n in dev_names], np.zeros(0, np.int64), np.zeros(0, np.int64))


def test_sendrecv_kernels_are_point_to_point_only_without_all_to_all():
    """NCCL runs all_to_all on SendRecv kernels (HTA's trace_filter): those are not a pipeline."""
    host, dev = p2p_masks(_events(["nccl:all_to_all", "nccl:all_reduce"], ["sendrecv"]))
    assert not host.any() and not dev.any()
    host, dev = p2p_masks(_events(["nccl:send", "nccl:recv"], ["sendrecv", "allreduce"]))
    assert host.all() and dev.tolist() == [True, False]
    host, dev = p2p_masks(_events(["nccl:send", "nccl:all_to_all"], ["sendrecv"]))
    assert host.tolist() == [True, False] and not dev.any()


def test_a_hybrid_straggler_is_measured_against_its_own_group():
    # 2 pipeline stages x 2 data-parallel ranks: stage 0 (ranks 0, 2) computes 80 ms, stage 1
    # 50 ms on rank 1 and 65 ms on rank 3, whose data-parallel peer, rank 1, waits for it. Rank
    # 3's excess is 15 ms of compute against rank 1; against every other rank (the median: 80
    # ms of stage 0's other work) it would read as 15 ms *less* compute and the excess "other"
    # (a balanced run's trace named a rank with -2.1 ms that way, where its own clock had it
    # 13 ms longer than its peer)
    from gpuscope.analyze.consistency import find_roles
    from gpuscope.analyze.stragglers import find_stragglers
    from gpuscope.thresholds import Thresholds
    from gpuscope.vocab import IMBALANCED

    rng = np.random.default_rng(3)
    compute = {0: 80, 1: 50, 2: 80, 3: 65}
    wait = {0: 20, 1: 15, 2: 20, 3: 0.5}
    rows = []
    for s in range(40):
        for r in range(4):
            w = wait[r] + rng.uniform(0, 0.5)
            rows.append({"rank": r, "step": s, "step_ns": 100 * MS, "wait_ns": int(w * MS),
                         "bubble_ns": 0, "data_ns": 0, "compute_ns": compute[r] * MS,
                         "other_ns": int((100 - compute[r] - w) * MS), "forward_ns": compute[r] * MS,
                         "backward_ns": 0, "optimizer_ns": 0, "comm_exposed_ns": int(w * MS)})
    frame = pd.DataFrame(rows)
    steps = pd.DataFrame({"step": range(40), "label": IMBALANCED})
    layout = Layout([0, 1, 2, 3], {"dp0": [0, 2], "dp1": [1, 3], "pp0": [0, 1], "pp1": [2, 3]},
                    [[0, 1], [2, 3]], [0, 1, 2, 3])
    (s,) = find_stragglers(frame, steps, Thresholds(), find_roles(frame), layout=layout)
    assert s.rank == 3 and s.group == [1, 3] and s.peers == [1]
    assert s.cause == "compute" and s.cause_excess_ns == 15 * MS
    assert s.excess_ns == pytest.approx(14.5 * MS, abs=0.6 * MS)  # busy: 99.5 against 85
    # without a layout: against every other rank, as before
    (s,) = find_stragglers(frame, steps, Thresholds(), find_roles(frame))
    assert s.peers == [] and s.cause == "other"
