"""The recorder's event log (record/events.py) and the pure function that makes a micro-step's
intervals of it, on hand-written event lists: no torch, no clock, no recorder."""

from gpuscope.record.events import (BACKWARD, COLL, DATA, DDP_TAIL, FWD_END, FWD_START, MARK,
                                    OPT_END, OPT_START, PHASE, ROWS, SAMPLES, WAIT, StepLog,
                                    interpret)
from gpuscope.record.step_row import sum_step


def test_a_plain_step_pairs_its_starts_and_ends():
    events = [(DATA, 100, 130, 20), (FWD_START, 140), (FWD_END, 200), (MARK, 210),
              (BACKWARD, 210, 300), (DDP_TAIL, 280, 320), (OPT_START, 330), (OPT_END, 360)]
    r = interpret(events, 7, 90, 400, True)
    assert (r.step, r.start, r.end, r.first) == (7, 90, 400, 100)  # the fetch began it
    assert r.phases == [("forward", 140, 200), ("backward", 210, 300), ("optimizer", 330, 360)]
    assert (r.data_ns, r.data_cpu_ns, r.forwards, r.fwd_end) == (30, 20, 1, 200)
    assert r.ddp_tails == [(280, 320)] and r.synced == 1 and r.samples == -1
    row = sum_step(r, 1_000)
    assert row[:3] == [7, 1_000, 310]  # step, start (unix), step_ns


def test_an_end_without_its_start_is_not_a_phase_and_a_start_without_an_end_neither():
    events = [(FWD_END, 10), (FWD_START, 20), (FWD_START, 30), (FWD_END, 50), (OPT_START, 60),
              (FWD_START, 70)]  # a forward that raised: started, never ended
    r = interpret(events, 0, 0, 100, None)
    assert r.phases == [("forward", 30, 50)] and r.forwards == 1 and r.fwd_end == 50
    assert r.first == 20 and r.synced == -1  # no probe, no communication: unknown


def test_collectives_waits_and_comm_phases_are_exposed_blocked_ones_begin_the_step():
    events = [(COLL, "all_reduce:g", 5, 40, False),   # async: issued, done elsewhere
              (COLL, "all_gather:g", 50, 90, True),   # blocked the training thread
              (WAIT, "all_reduce:g", 95, 99),
              (MARK, 100), (PHASE, "comm", 100, 120, True), (PHASE, "x", 121, 130, False)]
    r = interpret(events, 3, None, 200, None)
    assert r.start == r.first == 50  # the first thing that began: the blocked call's launch
    assert r.exposed == [(50, 90, "all_gather:g"), (95, 99, "all_reduce:g"),
                         (100, 120, "phase:comm")]
    assert r.colls == [("all_reduce:g", 5, 40), ("all_gather:g", 50, 90)]
    assert r.phases == [("x", 121, 130)] and r.synced == 1  # it communicated


def test_samples_rows_and_a_forward_phase():
    events = [(SAMPLES, 12), (ROWS, 3), (ROWS, 5), (MARK, 1), (PHASE, "forward", 1, 9, False),
              (SAMPLES, 11)]
    r = interpret(events, 0, 0, 10, False)
    assert r.samples == 11 and r.rows == (3, 5) and r.forwards == 1 and r.synced == 0


def test_a_micro_step_where_nothing_began_is_none():
    assert interpret([(COLL, "k", 1, 2, False), (ROWS, 4)], 0, None, 10, None) is None


def test_the_log_hands_over_its_events_and_keeps_only_live_flags():
    clock = iter(range(100, 10_000, 10)).__next__
    log = StepLog(clock)
    log.forward_start()  # inactive: nothing kept
    assert log.events == []
    log.active = True
    assert log.take(50) is None and log.start == 50  # nothing began before it
    log.collective("k", 60, 70, False)  # from another thread, before anything of the step began
    log.fetched(80, 90, 5)
    assert not log.begun()  # a fetch that opens the step
    log.forward_start()
    assert log.begun()
    log.forward_end()
    log.optimizer_start()
    log.optimizer_end()
    events, start, sync, opt_ran = log.take(500)
    assert start == 50 and opt_ran and sync is None and len(events) == 6
    assert log.events == [] and log.start == 500 and not log.opt_ran
    log.collective("k", 510, 520, False)
    assert log.take(600) is not None  # it had a start: a micro-step, if an empty one
    log.collective("k", 610, 620, False)
    log.clear()
    assert log.events == [] and log.start is None
    log.collective("late", 690, 695, False)  # delivered before anything of a step began
    assert log.take(700) is None and log.events == [(COLL, "late", 690, 695, False)]
    assert log.start == 700  # the next micro-step begins here: it has a start
    assert log.take(800)[:2] == ([(COLL, "late", 690, 695, False)], 700)


def test_a_timed_backward_marks_its_start_and_logs_its_span_and_ddp_tail():
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
    assert log.events == [(MARK, 0), (BACKWARD, 0, 10), (DDP_TAIL, 15, 25)]
    depth = []

    def backward(*a, **k):  # torch's, which calls backward again inside (a nested backward)
        depth.append(1)
        if len(depth) == 1:
            log.timed_backward("inner")  # passes through: one span, the outer one

    log.backward = backward
    log.events.clear()
    log.timed_backward("outer")
    assert len(depth) == 2
    assert [e[0] for e in log.events] == [MARK, BACKWARD, DDP_TAIL]
