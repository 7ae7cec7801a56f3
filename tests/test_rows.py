"""record/rows.py: a micro-step's events (StepLog.take's lists) -> its row, on a made-up clock.

Every rule is written as event lists and run through rows.build on both paths: FAST (the
common shape straight from its events, plain_row, anything else paired into intervals) and
GENERAL (everything paired). `fast_took` says which rules' shapes the fast path made itself;
the last test gives both paths the same random steps, of the common shape and near it."""

import pytest

from gpuscope.record.events import COLL, SAMPLES, WAIT
from gpuscope.record.rows import (DDP_KEY, FAST, GENERAL, PATHS, build, interpret, plain_row,
                                  sum_steps)
from gpuscope.run_format import STEP_COLUMNS
from gpuscope.vocab import RESUME_NS

fast_took: set = set()  # the rules whose micro-step the fast path made itself


def item(phases=(), data=((0, 10, 1),), tails=(), colls=(), waits=(), start=0, end=100,
         sync=None, step=3, samples=None):
    """One micro-step as StepLog.take hands it over. `colls`: (key, launch, done, blocked);
    `waits`: (key, t0, t1), the training thread blocked on communication; `samples`: the
    batch's size where it differs from the first batch's."""
    rare = [(COLL, *c) for c in colls] + [(WAIT, *w) for w in waits]
    if samples is not None:
        rare.append((SAMPLES, samples))
    return (list(phases), list(data), list(tails), rare, step, start, end, sync)


@pytest.fixture(params=PATHS)
def row(request):
    """The row of `item(**kw)` on one path, with start_unix 5, as a dict of its columns."""
    path = request.param

    def make(**kw):
        it = item(**kw)
        shift = 5 - it[5]
        (out,) = build([it], shift, path).rows
        if path == FAST and plain_row(it, shift) is not None:
            fast_took.add(request.node.originalname)
        d = dict(zip(STEP_COLUMNS, out))
        d["extra"] = out[len(STEP_COLUMNS)] if len(out) > len(STEP_COLUMNS) else {}
        # the per-key breakdown as a reader takes it: a row with collectives and no "_comm"
        # had them all under the header's comm_key (run_format.py)
        d["by_key"] = d["extra"].get("_comm") or (
            {DDP_KEY: [d["comm_ns"], d["comm_exposed_ns"], d["n_comm"]]} if d["n_comm"] else {})
        return d

    return make


FWD, OPT = ("forward", 10, 30), ("optimizer", 90, 95)


def test_a_row_leaves_out_the_breakdown_its_columns_imply(row):
    """Only DDP's tail: no "_comm" (its columns say it all); any other collective: all of them."""
    r = row(phases=[FWD, ("backward", 30, 80), OPT], tails=[(70, 90)])
    assert r["n_comm"] == 1 and "_comm" not in r["extra"]
    r = row(phases=[FWD, ("backward", 30, 80)], tails=[(70, 90)],
            colls=[("all_reduce:1", 82, 84, False)])
    assert set(r["extra"]["_comm"]) == {DDP_KEY, "all_reduce:1"}


def test_ddp_step_backward_inferred_and_exposed_tail(row):
    # data 0-10, forward 10-30, backward 30-80 with buckets 50-60 (hidden) and 70-90 (tail),
    # optimizer 90-95
    r = row(phases=[FWD, OPT], tails=[(50, 60), (70, 90)])
    assert r["backward_ns"] == 40          # forward end -> optimizer start, less the exposed tail
    assert r["comm_ns"] == 30 and r["n_comm"] == 2
    assert r["comm_exposed_ns"] == 20      # last launch (70) -> last done (90)
    assert r["compute_ns"] == 85 - 20      # 10..95 minus the exposed tail
    assert r["other_ns"] == 100 - 10 - 65 - 20
    assert r["start_ns"] == 5 and r["step"] == 3
    assert r["by_key"] == {DDP_KEY: [30, 20, 2]}


def test_the_common_shape_with_its_tail(row):
    """forward, backward, optimizer, one fetch, one DDP tail launched inside backward (its
    first bucket at 40): the fast path's own shape."""
    r = row(phases=[FWD, ("backward", 30, 80), OPT], tails=[(70, 85, 40)], sync=True)
    assert r["comm_exposed_ns"] == 15 and r["comm_ns"] == 15 + 30  # in flight from 40
    assert (r["forward_ns"], r["backward_ns"], r["optimizer_ns"]) == (20, 40, 5)
    assert r["compute_ns"] == 20 + 40 + 5 and r["synced"] == 1 and r["n_comm"] == 1
    assert r["other_ns"] == 100 - 10 - 65 - 15 and r["data_cpu_ns"] == 1


def test_a_comm_hook_s_time_before_its_launch_is_the_rank_s_own(row):
    """A Python comm hook runs inside DDP's tail and launches its all-reduce through
    torch.distributed: a hook that computes or waits 15 ms first (a slow link's rank, PowerSGD's
    matmuls) is that rank's backward, not communication it waited for; the tail is exposed from
    that launch on. Without a collective inside the tail, from the tail's start as before."""
    kw = dict(phases=[FWD, ("backward", 30, 92), ("optimizer", 92, 95)], tails=[(70, 90)])
    hooked = row(colls=[("all_reduce:default", 85, 90, False)], **kw)
    assert hooked["comm_exposed_ns"] == 5 + 2     # launch 85 -> done 90, on to backward's end
    assert hooked["backward_ns"] == 62 - 7        # 30-92 less the exposed 85-92
    plain = row(**kw)
    assert plain["comm_exposed_ns"] == 22 and plain["backward_ns"] == 40
    # a collective launched before the tail (an earlier bucket's, hidden) moves nothing
    early = row(colls=[("all_reduce:default", 50, 60, False)], **kw)
    assert early["comm_exposed_ns"] == 22


def test_measured_backward_wins_over_the_inferred_one(row):
    # a micro-step that does not synchronize: no bucket, no optimizer, backward measured
    r = row(phases=[FWD, ("backward", 35, 80)], sync=False)
    assert r["backward_ns"] == 45 and r["compute_ns"] == 65 and r["synced"] == 0


def test_forward_and_backward_inside_an_optimizer_closure_are_not_optimizer(row):
    # LBFGS / Lightning: optimizer.step(closure) 10-90 runs forward 20-40 and backward 40-70
    r = row(phases=[("forward", 20, 40), ("backward", 40, 70), ("optimizer", 10, 90)])
    assert (r["forward_ns"], r["backward_ns"], r["optimizer_ns"]) == (20, 30, 30)
    assert r["forward_ns"] + r["backward_ns"] + r["optimizer_ns"] == r["compute_ns"]


def test_collectives_blocking_and_waited_by_kind_and_group(row):
    # an async all-gather 20-60 waited on 50-60; a blocking all-reduce 70-80
    r = row(phases=[("forward", 10, 90)],
            colls=[("all_gather:1", 20, 60, False), ("all_reduce:default", 70, 80, True)],
            waits=[("all_gather:1", 50, 60)])
    assert r["comm_ns"] == 50 and r["comm_exposed_ns"] == 20 and r["n_comm"] == 2
    assert r["compute_ns"] == 80 - 20  # the forward minus the time it was blocked
    assert r["by_key"] == {"all_gather:1": [40, 10, 1], "all_reduce:default": [10, 10, 1]}


def test_without_phases_everything_else_is_compute(row):
    r = row(waits=[("phase:comm", 40, 60)])
    assert r["comm_exposed_ns"] == 20 and r["compute_ns"] == 70 and r["other_ns"] == 0


def test_user_phases_that_are_not_fixed_columns_are_kept(row):
    r = row(data=(), phases=[("forward", 0, 40), ("loss", 40, 50)])
    assert r["extra"] == {"loss": 10} and r["compute_ns"] == 50


def test_comm_outside_the_step_is_clipped(row):
    r = row(tails=[(-50, 20)], phases=[FWD])
    assert r["comm_ns"] == 20


def test_the_loops_own_work_before_the_step_is_named(row):
    # rec.step() at 0; the loop logs until 25, then fetches the batch (25-35), forward 35-60,
    # backward and optimizer
    r = row(data=[(25, 35, 1)], phases=[("forward", 35, 60), ("backward", 60, 80), OPT])
    assert r["compute_ns"] == 25 + 20 + 5
    assert r["other_ns"] == 100 - 10 - 50 and r["between_ns"] == 25


def test_ddp_tail_runs_to_the_end_of_the_measured_backward(row):
    # backward measured 30-95: the last bucket launched at 70 and its callback ran at 80, but
    # the training thread came back from DDP's reducer only at 95 (a busy core): 70-95 is the
    # thread waiting on communication, not backward compute. A backward that ended before the
    # last bucket was done leaves the tail at the bucket's end.
    r = row(phases=[FWD, ("backward", 30, 95)], tails=[(50, 60), (70, 80)])
    assert r["comm_exposed_ns"] == 25 and r["backward_ns"] == 40
    assert r["by_key"] == {DDP_KEY: [35, 25, 2]}
    r = row(phases=[FWD, ("backward", 30, 75)], tails=[(50, 60), (70, 80)])
    assert r["comm_exposed_ns"] == 10 and r["backward_ns"] == 40
    # one tail (the fast path's shape): the same
    r = row(phases=[FWD, ("backward", 30, 95), ("optimizer", 96, 98)], tails=[(70, 80)])
    assert r["comm_exposed_ns"] == 25 and r["backward_ns"] == 40
    # back more than RESUME_NS after the bucket was done: what is later than that the thread
    # waited for a core, not for communication (the trace reader's rule): other
    late = 80 + RESUME_NS + 500
    for tails in ([(50, 60), (70, 80)], [(70, 80)]):
        r = row(end=late + 10, phases=[FWD, ("backward", 30, late), ("optimizer", late, late + 5)],
                tails=tails)
        assert r["comm_exposed_ns"] == 10 + RESUME_NS
        assert r["backward_ns"] == late - 30 - 10 - RESUME_NS


def test_a_smaller_batch_is_noted_on_its_row(row):
    """An epoch's last, smaller batch: its size on its row (how compute grows with the batch,
    analyze/whatif); the first batch's size is not repeated on every row."""
    kw = dict(phases=[FWD, ("backward", 30, 80), OPT])
    assert row(samples=3, **kw)["extra"] == {"_samples": 3}
    assert "_samples" not in row(**kw)["extra"]


def test_the_fast_path_made_the_common_shapes_rules_itself():
    """Run after the rules above (file order): the fast path made the rows of the rules whose
    micro-steps have the common shape, not the general path behind it."""
    assert {"test_a_row_leaves_out_the_breakdown_its_columns_imply",
            "test_a_comm_hook_s_time_before_its_launch_is_the_rank_s_own",
            "test_the_common_shape_with_its_tail",
            "test_the_loops_own_work_before_the_step_is_named",
            "test_ddp_tail_runs_to_the_end_of_the_measured_backward"} <= fast_took, fast_took


def test_build_says_each_steps_forwards_and_all_to_all_rows_on_both_paths():
    """What else the recorder reads of a flush: forward calls per step (a pipeline stage's
    micro-batches) and the rows each all-to-all delivered, whichever path made the row."""
    from gpuscope.record.events import ROWS

    plain = item(phases=[FWD, ("backward", 30, 80), OPT], step=0)
    two = item(phases=[FWD, ("forward", 30, 40), ("backward", 40, 80)], step=1)
    routed = item(phases=[FWD], step=2)
    routed[3].extend([(ROWS, 12), (ROWS, 4)])
    empty = ([], [], [], [], 3, None, 100, None)  # nothing began: no row
    for path in PATHS:
        got = build([plain, two, routed, empty], 0, path)
        assert [r[0] for r in got.rows] == [0, 1, 2]
        assert got.forwards == [1, 2, 1] and got.routed == [(2, [12, 4])]
    with pytest.raises(ValueError):
        build([plain], 0, "quick")


def test_the_common_shape_s_row_straight_from_its_events_is_the_general_path_s():
    """plain_row against interpret + sum_steps on random micro-steps as event lists: the three
    phases in order and near it (overlapping, empty, reversed, missing), 0-2 fetches, 0-1 DDP
    tails inside and outside the step (with their first bucket's launch or without), a smaller
    batch, a sync flag or none."""
    import random

    rng = random.Random(24)
    shift = 1_000_000
    checked, general_only = 0, 0
    batch, want = [], []  # all of them as one flush: the rows in order, none for an empty one
    for i in range(6000):
        start = rng.randrange(0, 1000)
        end = start + rng.randrange(1, 5000)
        cuts = sorted(rng.randrange(start - 50, end + 50) for _ in range(6))
        if rng.random() < 0.2:  # phases that overlap, or are empty or reversed
            cuts = [c + rng.randrange(-40, 40) for c in cuts]
        phases = [(name, a, b) for name, (a, b) in
                  zip(("forward", "backward", "optimizer"), (cuts[0:2], cuts[2:4], cuts[4:6]))
                  if rng.random() < 0.9]
        if rng.random() < 0.1 and phases:
            phases.reverse()
        data = []
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            a = rng.randrange(start - 20, max(cuts[0], start) + 20)
            data.append((a, a + rng.randrange(0, 200), rng.choice([-1, rng.randrange(0, 100)])))
        tails = []
        if rng.random() < 0.7:
            # anywhere, or launched exactly as backward begins or ends (the boundaries)
            a = rng.choice([rng.randrange(start - 20, end + 20)] * 4 + [cuts[2], cuts[3]])
            tails = [(a, a + rng.randrange(-5, 3000))]
            if rng.random() < 0.5:  # and the first bucket's launch, earlier (or not timed)
                tails = [(a, b, rng.choice([a, a - rng.randrange(0, 400), cuts[2]]))
                         for a, b in tails]
        rare = [(SAMPLES, 3)] if rng.random() < 0.05 else []
        scale = 1000 if rng.random() < 0.2 else 1  # tails longer than RESUME_NS
        item = ([(n, a * scale, b * scale) for n, a, b in phases],
                [(a * scale, b * scale, c) for a, b, c in data],
                [tuple(x * scale for x in t) for t in tails], rare, 7,
                # the recording's first micro-step has no start of its own: its first event
                None if rng.random() < 0.03 else start * scale,
                end * scale, rng.choice([None, True, False]))
        if rng.random() < 0.01:  # nothing began in it: no row
            item = ([], [], [], [], 7, None, end, None)
        raws = interpret([item])
        general = sum_steps(raws, shift)
        if item[5] is None and not item[0]:
            assert general == [] and build([item], shift).rows == []
        fast = plain_row(item, shift)
        assert build([item], shift).rows == general  # whichever path it takes
        assert build([item], shift, GENERAL).rows == general
        batch.append(item[:4] + (i,) + item[5:])
        want += [[i] + row[1:] for row in general]  # its step: i
        if fast is None:
            general_only += 1
            continue
        checked += 1
        assert [fast] == general, (item, fast, general)
    assert checked > 1000 and general_only > 1000, (checked, general_only)
    assert build(batch, shift).rows == want == build(batch, shift, GENERAL).rows
