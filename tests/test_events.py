"""The recorder's event log (record/events.py) and the pure function that makes a micro-step's
intervals of it, on hand-written event lists: no torch, no clock, no recorder."""

from gpuscope.record.events import BEGAN, COLL, LOOP_FORWARD, ROWS, SAMPLES, WAIT, StepLog
from gpuscope.record.rows import interpret, plain_row, sum_steps


def step(phases=(), data=(), tails=(), rare=(), start=0, end=100, sync=None, n=0):
    got = interpret([(list(phases), list(data), list(tails), list(rare), n, start, end, sync)])
    return got[0] if got else None


def test_a_plain_step():
    r = step([("forward", 140, 200), ("backward", 210, 300), ("optimizer", 330, 360)],
             [(100, 130, 20)], [(280, 320)], start=90, end=400, sync=True, n=7)
    assert (r.step, r.start, r.end, r.first) == (7, 90, 400, 100)  # the fetch began it
    assert r.phases == [("forward", 140, 200), ("backward", 210, 300), ("optimizer", 330, 360)]
    assert (r.data_ns, r.data_cpu_ns, r.forwards, r.fwd_end) == (30, 20, 1, 200)
    assert r.ddp_tails == [(280, 320)] and r.synced == 1 and r.samples == -1
    row = sum_steps([r], 1_000 - r.start)[0]
    assert row[:3] == [7, 1_000, 310]  # step, start (unix), step_ns
    # the same row straight from the events (the recorder's path for this shape)
    item = ([("forward", 140, 200), ("backward", 210, 300), ("optimizer", 330, 360)],
            [(100, 130, 20)], [(280, 320)], [], 7, 90, 400, True)
    assert plain_row(item, 1_000 - 90) == row


def test_first_is_the_earliest_beginning_parts_logged_at_their_end_included():
    # a blocked collective inside a backward is logged before the backward's own part
    r = step([("backward", 30, 80)], rare=[(COLL, "reduce_scatter:g", 40, 60, True)], start=None)
    assert r.first == r.start == 30 and r.synced == 1  # it communicated
    assert step([("forward", 10, 20)], rare=[(BEGAN, 5)], start=None).first == 5
    assert step(rare=[(BEGAN, 5)], start=None).phases == []  # began, never ended: no part


def test_collectives_waits_and_comm_phases_are_exposed_blocked_ones_begin_the_step():
    rare = [(COLL, "all_reduce:g", 5, 40, False),   # async: issued, done elsewhere
            (COLL, "all_gather:g", 50, 90, True),   # blocked the training thread
            (WAIT, "all_reduce:g", 95, 99), (WAIT, "phase:comm", 100, 120)]
    r = step([("x", 121, 130)], rare=rare, start=None, end=200)
    assert r.start == r.first == 50  # the first thing that began: the blocked call's launch
    assert r.exposed == [(50, 90, "all_gather:g"), (95, 99, "all_reduce:g"),
                         (100, 120, "phase:comm")]
    assert r.colls == [("all_reduce:g", 5, 40), ("all_gather:g", 50, 90)]
    assert r.phases == [("x", 121, 130)]


def test_samples_rows_and_a_forward_phase_of_the_loop_s_own():
    r = step([("forward", 1, 5), ("forward", 6, 9)],
             rare=[(SAMPLES, 12), (ROWS, 3), (ROWS, 5), (LOOP_FORWARD, 9), (SAMPLES, 11)],
             sync=False)
    assert r.samples == 11 and r.rows == (3, 5) and r.forwards == 2 and r.synced == 0
    assert r.fwd_end == 5  # the loop's phase named forward is not the model's forward


def test_without_a_probe_or_communication_the_sync_is_unknown():
    assert step([("forward", 1, 2)]).synced == -1
    assert step([("forward", 1, 2)], tails=[(3, 4)]).synced == 1


def test_the_log_hands_over_its_events_and_keeps_only_live_flags():
    clock = iter(range(100, 10_000, 10)).__next__
    log = StepLog(clock)
    log.forward_start()  # inactive: nothing kept
    assert log.fwd_t0 is None and log.phases == []
    log.active = True
    assert log.take(0, 50) is None and log.start == 50  # nothing began before it
    log.collective("k", 60, 70, False)  # from another thread, before anything of the step began
    log.fetched(80, 90, 5)
    assert not log.begun()  # a fetch that opens the step
    log.forward_start()
    assert log.begun()
    log.forward_end()
    log.optimizer_start()
    log.optimizer_end()
    assert log.opt_ran
    phases, data, tails, rare, n, start, end, sync = log.take(0, 500)
    assert (n, start, end, sync) == (0, 50, 500, None)
    assert [p[0] for p in phases] == ["forward", "optimizer"] and data == [(80, 90, 5)]
    assert rare == [(COLL, "k", 60, 70, False)] and tails == []
    assert log.phases == log.rare == [] and log.start == 500 and not log.opt_ran
    log.optimizer_start()  # an optimizer step that raised: it began in this micro-step
    rare = log.take(1, 600)[3]
    assert rare == [(BEGAN, rare[0][1])] and log.opt_t0 is None
    log.collective("k", 610, 620, False)
    log.clear()
    assert log.rare == [] and log.start is None
    log.collective("late", 690, 695, False)  # delivered before anything of a step began
    assert log.take(2, 700) is None and log.rare == [(COLL, "late", 690, 695, False)]
    assert log.start == 700  # the next micro-step begins here: it has a start
    assert log.take(2, 800)[3:6] == ([(COLL, "late", 690, 695, False)], 2, 700)


def test_the_forward_wrapper_logs_one_part_and_a_forward_that_raised_its_start():
    clock = iter(range(0, 1000, 10)).__next__
    log = StepLog(clock)
    log.active = True
    log.probe = iter([False, True]).__next__
    assert log.time_forward(lambda x: x + 1)(1) == 2
    assert log.phases == [("forward", 0, 10)] and log.sync_flag is False

    def bad(x):
        raise ValueError("bad batch")

    try:
        log.time_forward(bad)(1)
    except ValueError:
        pass
    assert log.fwd_t0 == 20 and log.sync_flag is True  # open, as a hook pair would leave it
    assert log.take(0, 100)[3] == [(BEGAN, 20)]


def test_a_timed_backward_logs_its_span_and_ddp_tail_and_passes_nested_ones_through():
    clock = iter(range(0, 1000, 10)).__next__

    class Tail:
        def arm(self, tensors):
            return True

        def finish(self):
            return (15, 25)

    log = StepLog(clock)
    log.active = True
    log.tail = Tail()
    seen = []
    log.backward = lambda *a, **k: seen.append(log.in_backward)
    log.timed_backward("loss")
    assert seen == [True] and not log.in_backward
    assert log.phases == [("backward", 0, 10)] and log.tails == [(15, 25)]
    depth = []

    def backward(*a, **k):  # torch's, which calls backward again inside (a nested backward)
        depth.append(1)
        if len(depth) == 1:
            log.timed_backward("inner")  # passes through: one span, the outer one

    log.backward = backward
    log.phases.clear()
    log.timed_backward("outer")
    assert len(depth) == 2 and log.phases == [("backward", 20, 30)]


def test_a_loop_phase_named_forward_is_marked_as_the_loop_s():
    log = StepLog(iter(range(0, 100, 10)).__next__)
    log.active = True
    log.phase("forward", 1, 5, comm=False)
    log.phase("comm", 6, 8, comm=True)
    assert log.phases == [("forward", 1, 5)]
    assert log.rare == [(LOOP_FORWARD, 5), (WAIT, "phase:comm", 6, 8)]


def test_a_fetch_whose_cpu_was_not_measured_leaves_the_step_s_unknown():
    assert step(data=[(0, 10, 4), (20, 30, 5)]).data_cpu_ns == 9
    r = step(data=[(0, 10, 4), (20, 30, -1)])
    assert (r.data_ns, r.data_cpu_ns) == (20, -1)
    assert step(data=[(0, 10, -1), (20, 30, 5)]).data_cpu_ns == -1
    assert step([("forward", 10, 20)]).data_cpu_ns == 0  # no fetch: no CPU spent fetching
