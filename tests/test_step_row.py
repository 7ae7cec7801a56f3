"""sum_step: one step's recorded intervals -> a row (times in ns on a made-up clock)."""

from gpuscope.record_format import STEP_COLUMNS
from gpuscope.record.step_row import sum_step


def row(**kw):
    args = dict(step=3, start=0, now=100, data_ns=10, data_cpu_ns=1, raw_phases=[],
                comm_phases=[], comm=[], fwd_end=None, start_unix=5)
    args.update(kw)
    return dict(zip(STEP_COLUMNS, sum_step(**args)))


def test_ddp_step_backward_inferred_and_exposed_tail():
    # data 0-10, forward 10-30, backward 30-80 with buckets 50-60 (hidden) and 70-90 (tail),
    # optimizer 90-95
    r = row(raw_phases=[("forward", 10, 30), ("optimizer", 90, 95)],
            comm=[(50, 60), (70, 90)], fwd_end=30)
    assert r["backward_ns"] == 60          # forward end -> optimizer start
    assert r["comm_ns"] == 30 and r["n_comm"] == 2
    assert r["comm_exposed_ns"] == 20      # last launch (70) -> last done (90)
    assert r["compute_ns"] == 85 - 20      # 10..95 minus the exposed tail
    assert r["other_ns"] == 100 - 10 - 65 - 20
    assert r["start_ns"] == 5 and r["step"] == 3


def test_without_phases_everything_else_is_compute():
    r = row(comm_phases=[(40, 60)])
    assert r["comm_exposed_ns"] == 20 and r["compute_ns"] == 70 and r["other_ns"] == 0


def test_user_phases_that_are_not_fixed_columns_are_kept():
    out = sum_step(1, 0, 100, 0, 0, [("forward", 0, 40), ("loss", 40, 50)], [], [], None, 0)
    assert out[-1] == {"loss": 10}
    assert dict(zip(STEP_COLUMNS, out))["compute_ns"] == 50


def test_comm_outside_the_step_is_clipped():
    r = row(comm=[(-50, 20)], raw_phases=[("forward", 10, 30)], fwd_end=30)
    assert r["comm_ns"] == 20

