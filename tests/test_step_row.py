"""sum_step: one micro-step's recorded intervals -> a row (times in ns on a made-up clock).

sum_step is the general path. The recorder makes the row of the common shape (forward, backward,
optimizer in order, at most one fetch and one DDP tail, nothing else) straight from the
micro-step's events (step_row.plain_row): the last test gives both paths the same random steps
as event lists, of that shape and near it."""

import pytest

from gpuscope.record import step_row
from gpuscope.record.events import SAMPLES, interpret, rows_of
from gpuscope.record.step_row import DDP_KEY, Raw, sum_step, sum_steps
from gpuscope.run_format import STEP_COLUMNS
from gpuscope.vocab import RESUME_NS


def raw(**kw) -> Raw:
    args = dict(step=3, start=0, end=100, first=None, data_ns=10, data_cpu_ns=1, phases=[],
                exposed=[], ddp_tails=[], colls=[], fwd_end=None, synced=-1)
    args.update(kw)
    return Raw(**args)


def row(**kw):
    out = sum_step(raw(**kw), start_unix=5)
    d = dict(zip(STEP_COLUMNS, out))
    d["extra"] = out[len(STEP_COLUMNS)] if len(out) > len(STEP_COLUMNS) else {}
    # the per-key breakdown as a reader takes it: a row with collectives and no "_comm" had
    # them all under the header's comm_key (run_format.py)
    d["by_key"] = d["extra"].get("_comm") or (
        {DDP_KEY: [d["comm_ns"], d["comm_exposed_ns"], d["n_comm"]]} if d["n_comm"] else {})
    return d


def test_a_row_leaves_out_the_breakdown_its_columns_imply():
    """Only DDP's tail: no "_comm" (its columns say it all); any other collective: all of them."""
    r = row(phases=[("forward", 10, 30), ("backward", 30, 80)], ddp_tails=[(70, 90)], fwd_end=30)
    assert r["n_comm"] == 1 and "_comm" not in r["extra"]
    r = row(phases=[("forward", 10, 30), ("backward", 30, 80)], ddp_tails=[(70, 90)],
            colls=[("all_reduce:1", 82, 84)], fwd_end=30)
    assert set(r["extra"]["_comm"]) == {DDP_KEY, "all_reduce:1"}


def test_ddp_step_backward_inferred_and_exposed_tail():
    # data 0-10, forward 10-30, backward 30-80 with buckets 50-60 (hidden) and 70-90 (tail),
    # optimizer 90-95
    r = row(phases=[("forward", 10, 30), ("optimizer", 90, 95)],
            ddp_tails=[(50, 60), (70, 90)], fwd_end=30)
    assert r["backward_ns"] == 40          # forward end -> optimizer start, less the exposed tail
    assert r["comm_ns"] == 30 and r["n_comm"] == 2
    assert r["comm_exposed_ns"] == 20      # last launch (70) -> last done (90)
    assert r["compute_ns"] == 85 - 20      # 10..95 minus the exposed tail
    assert r["other_ns"] == 100 - 10 - 65 - 20
    assert r["start_ns"] == 5 and r["step"] == 3
    assert r["by_key"] == {DDP_KEY: [30, 20, 2]}


def test_a_comm_hook_s_time_before_its_launch_is_the_rank_s_own():
    """A Python comm hook runs inside DDP's tail and launches its all-reduce through
    torch.distributed: a hook that computes or waits 15 ms first (a slow link's rank, PowerSGD's
    matmuls) is that rank's backward, not communication it waited for; the tail is exposed from
    that launch on. Without a collective inside the tail, from the tail's start as before."""
    kw = dict(phases=[("forward", 10, 30), ("backward", 30, 92), ("optimizer", 92, 95)],
              ddp_tails=[(70, 90)], fwd_end=30)
    hooked = row(colls=[("all_reduce:default", 85, 90)], **kw)
    assert hooked["comm_exposed_ns"] == 5 + 2     # launch 85 -> done 90, on to backward's end
    assert hooked["backward_ns"] == 62 - 7        # 30-92 less the exposed 85-92
    plain = row(**kw)
    assert plain["comm_exposed_ns"] == 22 and plain["backward_ns"] == 40
    # a collective launched before the tail (an earlier bucket's, hidden) moves nothing
    early = row(colls=[("all_reduce:default", 50, 60)], **kw)
    assert early["comm_exposed_ns"] == 22


def test_measured_backward_wins_over_the_inferred_one():
    # a micro-step that does not synchronize: no bucket, no optimizer, backward measured
    r = row(phases=[("forward", 10, 30), ("backward", 35, 80)], fwd_end=30, synced=0)
    assert r["backward_ns"] == 45 and r["compute_ns"] == 65 and r["synced"] == 0


def test_forward_and_backward_inside_an_optimizer_closure_are_not_optimizer():
    # LBFGS / Lightning: optimizer.step(closure) 10-90 runs forward 20-40 and backward 40-70
    r = row(phases=[("optimizer", 10, 90), ("forward", 20, 40), ("backward", 40, 70)],
            fwd_end=40)
    assert (r["forward_ns"], r["backward_ns"], r["optimizer_ns"]) == (20, 30, 30)
    assert r["forward_ns"] + r["backward_ns"] + r["optimizer_ns"] == r["compute_ns"]


def test_collectives_blocking_and_waited_by_kind_and_group():
    # an async all-gather 20-60 waited on 50-60; a blocking all-reduce 70-80
    r = row(phases=[("forward", 10, 90)],
            colls=[("all_gather:1", 20, 60), ("all_reduce:default", 70, 80)],
            exposed=[(50, 60, "all_gather:1"), (70, 80, "all_reduce:default")])
    assert r["comm_ns"] == 50 and r["comm_exposed_ns"] == 20 and r["n_comm"] == 2
    assert r["compute_ns"] == 80 - 20  # the forward minus the time it was blocked
    assert r["by_key"] == {"all_gather:1": [40, 10, 1], "all_reduce:default": [10, 10, 1]}


def test_without_phases_everything_else_is_compute():
    r = row(exposed=[(40, 60, "phase:comm")])
    assert r["comm_exposed_ns"] == 20 and r["compute_ns"] == 70 and r["other_ns"] == 0


def test_user_phases_that_are_not_fixed_columns_are_kept():
    out = sum_step(raw(start=0, end=100, data_ns=0, phases=[("forward", 0, 40), ("loss", 40, 50)]),
                   0)
    assert out[-1] == {"loss": 10}
    assert dict(zip(STEP_COLUMNS, out))["compute_ns"] == 50


def test_comm_outside_the_step_is_clipped():
    r = row(ddp_tails=[(-50, 20)], phases=[("forward", 10, 30)], fwd_end=30)
    assert r["comm_ns"] == 20


def test_the_loops_own_work_before_the_step_is_named():
    # rec.step() at 0; the loop logs until 25, then fetches the batch (25-35), forward 35-60
    r = row(first=25, data_ns=10, phases=[("forward", 35, 60)])
    assert r["other_ns"] == 100 - 10 - 25 and r["between_ns"] == 25


def test_ddp_tail_runs_to_the_end_of_the_measured_backward():
    # backward measured 30-95: the last bucket launched at 70 and its callback ran at 80, but
    # the training thread came back from DDP's reducer only at 95 (a busy core): 70-95 is the
    # thread waiting on communication, not backward compute. A backward that ended before the
    # last bucket was done leaves the tail at the bucket's end.
    r = row(phases=[("forward", 10, 30), ("backward", 30, 95)], ddp_tails=[(50, 60), (70, 80)],
            fwd_end=30)
    assert r["comm_exposed_ns"] == 25 and r["backward_ns"] == 40
    assert r["by_key"] == {DDP_KEY: [35, 25, 2]}
    r = row(phases=[("forward", 10, 30), ("backward", 30, 75)], ddp_tails=[(50, 60), (70, 80)],
            fwd_end=30)
    assert r["comm_exposed_ns"] == 10 and r["backward_ns"] == 40
    # back more than RESUME_NS after the bucket was done: what is later than that the thread
    # waited for a core, not for communication (the trace reader's rule): other
    late = 80 + RESUME_NS + 500
    r = row(end=late + 10, phases=[("forward", 10, 30), ("backward", 30, late)],
            ddp_tails=[(50, 60), (70, 80)], fwd_end=30)
    assert r["comm_exposed_ns"] == 10 + RESUME_NS
    assert r["backward_ns"] == late - 30 - 10 - RESUME_NS


def test_the_common_shape_s_row_straight_from_its_events_is_the_general_path_s():
    """plain_row against interpret + sum_step on random micro-steps as event lists: the three
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
            assert general == [] and rows_of([item], shift) == ([], [])
        fast = step_row.plain_row(item, shift)
        assert rows_of([item], shift)[0] == general  # whichever path it takes
        batch.append(item[:4] + (i,) + item[5:])
        want += [[i] + row[1:] for row in general]  # its step: i
        if fast is None:
            general_only += 1
            continue
        checked += 1
        assert [fast] == general, (item, fast, general)
    assert checked > 1000 and general_only > 1000, (checked, general_only)
    rows, _ = rows_of(batch, shift)
    assert rows == want
