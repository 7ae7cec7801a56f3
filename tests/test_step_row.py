"""sum_step: one micro-step's recorded intervals -> a row (times in ns on a made-up clock).

sum_step has a short path for the usual shape (forward, backward, optimizer in order, at most one
DDP tail) beside its general one: every test here runs on both (`path`), the short one where a
row has its shape."""

import pytest

from gpuscope.record import step_row
from gpuscope.record.step_row import DDP_KEY, Raw, sum_step
from gpuscope.run_format import STEP_COLUMNS
from gpuscope.vocab import RESUME_NS


@pytest.fixture(autouse=True, params=["short", "general"])
def path(request, monkeypatch):
    if request.param == "general":
        monkeypatch.setattr(step_row, "_plain_step", lambda r, shift: None)
    return request.param


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


@pytest.mark.parametrize("path", ["short"], indirect=True)  # it compares the two itself
def test_the_plain_shape_fast_path_agrees_with_the_general_one_on_random_rows(path):
    # sum_step takes a short path for forward / backward / optimizer in order with at most one
    # DDP tail; on random rows of that shape and near it, both paths give the same row
    import random

    rng = random.Random(24)
    checked = 0
    shapes = {3: 0, "other": 0}  # the usual three phases in order (a shortcut), and the rest
    for _ in range(4000):
        start = rng.randrange(0, 1000)
        end = start + rng.randrange(1, 5000)
        cuts = sorted(rng.randrange(start - 50, end + 50) for _ in range(6))
        if rng.random() < 0.2:  # phases that overlap, or are empty or reversed
            cuts = [c + rng.randrange(-40, 40) for c in cuts]
        phases = []
        for name, (a, b) in zip(("forward", "backward", "optimizer"),
                                (cuts[0:2], cuts[2:4], cuts[4:6])):
            if rng.random() < 0.8:
                phases.append((name, a, b))
        if rng.random() < 0.1 and phases:
            phases.reverse()  # out of order: the general path
        tails = []
        if rng.random() < 0.7:
            a = rng.randrange(start - 20, end + 20)
            tails = [(a, a + rng.randrange(-5, 3000))]
        fwd_end = cuts[1] if rng.random() < 0.5 else None
        big = rng.random() < 0.2  # tails longer than RESUME_NS
        scale = 1000 if big else 1
        r = raw(start=start * scale, end=end * scale, first=rng.choice([None, start * scale, rng.randrange(start - 50, end) * scale]),
                data_ns=rng.randrange(0, 200) * scale, phases=[(n, a * scale, b * scale)
                                                                for n, a, b in phases],
                ddp_tails=[(a * scale, b * scale) for a, b in tails],
                fwd_end=None if fwd_end is None else fwd_end * scale,
                samples=rng.choice([-1, 3]))
        fast = step_row._plain_step(r, 5 - r.start)  # its start at 5 (unix), as below
        if fast is None:
            continue
        checked += 1
        shapes[3 if [n for n, _, _ in r.phases] == ["forward", "backward", "optimizer"]
               else "other"] += 1
        saved = step_row._plain_step
        step_row._plain_step = lambda r, s: None
        try:
            general = sum_step(r, 5)
        finally:
            step_row._plain_step = saved
        assert fast == general, (r, fast, general)
    assert checked > 1000 and min(shapes.values()) > 300, shapes
