"""The micro-step being recorded, as a list of events: every hook appends one small tuple.

The hooks (hooks.py, collectives.py, ddp_timing.py through `timed_backward`, the recorder's data
wrapper and phases) call one method of `StepLog` each, which appends `(kind, ...)` to the
micro-step's list and keeps nothing else, apart from the few live flags a hook itself must read
(whether a backward is being timed, the model's sync probe and its last answer, DDP's tail timer,
whether the optimizer ran). `take()` hands the list over at rec.step(); `interpret()`, a pure
function off the per-step path, turns it into the micro-step's intervals (step_row.Raw), which
step_row sums into its row. Nothing outside this module writes a StepLog's fields.

Events (times are the recorder's clock, integer ns):
  (MARK, t)                      something of the step began at t (a backward's, a phase's)
  (FWD_START, t), (FWD_END, t)   the model's forward; an end pairs with the open start
  (BACKWARD, t0, t1)             torch.autograd.backward, timed whole
  (DDP_TAIL, t0, t1)             the end of a DDP backward that waited for its all-reduce
  (OPT_START, t), (OPT_END, t)   optimizer.step(); an end pairs with the open start
  (COLL, key, launch, done, blocked)  a collective through torch.distributed
  (WAIT, key, t0, t1)            the training thread waited on an async collective
  (DATA, t0, t1, cpu_ns)         a batch fetched
  (PHASE, name, t0, t1, comm)    rec.phase(name); comm: blocking communication
  (SAMPLES, n)                   the batch's size differs from the first batch's
  (ROWS, n)                      rows an all_to_all_single delivered (sinks.Routing)
"""

from __future__ import annotations

import time

from .step_row import Raw

MARK, FWD_START, FWD_END, BACKWARD, DDP_TAIL, OPT_START, OPT_END, COLL, WAIT, DATA, PHASE, \
    SAMPLES, ROWS = range(13)
#: the events that begin something of the step at their first time (a step's `first`; a
#: backward and a phase append a MARK as they begin, their own event at their end)
_MARKS = frozenset({MARK, FWD_START, OPT_START, WAIT, DATA})
#: the events of the step's own work (a batch fetched after one is fetched mid-step)
_WORK = frozenset({FWD_START, BACKWARD, OPT_START})
#: what a micro-step with no start keeps for the next one (what other threads delivered)
_CARRIED = frozenset({COLL, DDP_TAIL})


class StepLog:
    """One micro-step's events, appended by the hooks while `active`."""

    def __init__(self, clock=None):
        self.now = clock if clock is not None else time.perf_counter_ns
        self.active = False
        self.events: list = []
        self.start = None            # when the micro-step began (the last take), None at first
        self.in_backward = False     # a timed backward is running (nested ones pass through)
        self.opt_ran = False         # the optimizer stepped in this micro-step
        self.sync_flag = None        # the probe's answer at the last forward: will backward sync?
        self.probe = None            # hooks.sync_probe's callable, asked at each forward
        self.tail = None             # ddp_timing.DDPTailTimer of a DDP model
        self.backward = None         # torch.autograd.backward as it was (hooks.py)

    # ------------------------------------------------------------------ the hooks
    def mark(self, t: int) -> None:
        if self.active:
            self.events.append((MARK, t))

    def forward_start(self, *_) -> None:  # also the model's forward pre-hook (module, args)
        if self.active:
            self.events.append((FWD_START, self.now()))
            flag = None
            if self.probe is not None:
                try:
                    flag = bool(self.probe())
                except Exception:
                    self.probe = None  # the model no longer says: unknown from now on
            self.sync_flag = flag

    def forward_end(self, *_) -> None:  # also the forward hook (module, args, output)
        if self.active:
            self.events.append((FWD_END, self.now()))

    def time_forward(self, forward):
        """`forward`, timed (hooks.wrap_forward puts it in the model's forward: one frame, where
        a hook pair costs torch's slow call path)."""
        log = self

        def timed_forward(*args, **kwargs):
            if not log.active:
                return forward(*args, **kwargs)
            log.forward_start()
            out = forward(*args, **kwargs)  # raising: no end, as a forward hook would not run
            log.forward_end()
            return out

        return timed_forward

    def timed_backward(self, *args, **kwargs):
        """torch.autograd.backward (which loss.backward() calls) while this log records
        (hooks.py puts it in place): the backward's span and, for a DDP model, the tail of it
        that waited for the gradients' all-reduce (ddp_timing.py)."""
        backward = self.backward
        if not self.active or self.in_backward:  # off, or inside a timed backward
            return backward(*args, **kwargs)
        t0 = self.now()
        self.events.append((MARK, t0))
        self.in_backward = True
        tail, armed = self.tail, False
        if tail is not None:
            try:
                armed = tail.arm(args[0] if args else kwargs.get("tensors"))
            except Exception:
                self.tail = None  # timing off; the backward runs as it would
        try:
            return backward(*args, **kwargs)
        finally:
            self.in_backward = False
            if self.active:
                self.events.append((BACKWARD, t0, self.now()))
            if armed:
                try:
                    span = tail.finish()
                except Exception:
                    self.tail = span = None
                if span is not None and self.active:
                    self.events.append((DDP_TAIL, span[0], span[1]))

    def optimizer_start(self, *_) -> None:  # also torch's optimizer step hook (opt, args, kw)
        if self.active:
            self.events.append((OPT_START, self.now()))

    def optimizer_end(self, *_) -> None:
        if self.active:
            self.events.append((OPT_END, self.now()))
            self.opt_ran = True

    def collective(self, key: str, launch: int, done: int, blocked: bool) -> None:
        if self.active:
            self.events.append((COLL, key, launch, done, blocked))

    def waited(self, key: str, t0: int, t1: int) -> None:
        if self.active:
            self.events.append((WAIT, key, t0, t1))

    def routed(self, rows: int) -> None:
        if self.active:
            self.events.append((ROWS, rows))

    def fetched(self, t0: int, t1: int, cpu_ns: int) -> None:
        if self.active:
            self.events.append((DATA, t0, t1, cpu_ns))

    def phase(self, name: str, t0: int, t1: int, comm: bool) -> None:
        if self.active:
            self.events.append((PHASE, name, t0, t1, comm))

    def samples(self, n: int) -> None:
        if self.active:
            self.events.append((SAMPLES, n))

    # ------------------------------------------------------------------ the recorder's
    def begun(self) -> bool:
        """Whether the micro-step has begun its work (a forward, backward, optimizer step or a
        finished compute phase): a batch fetched after that is fetched mid-step."""
        return self.in_backward or any(e[0] in _WORK or (e[0] == PHASE and not e[4])
                                       for e in self.events)

    def take(self, now: int) -> tuple | None:
        """(events, start, sync flag, optimizer ran) of the micro-step that ends now, None when
        nothing of it began (the first one, before anything ran: what other threads delivered
        is kept for the next); the next one begins now."""
        events, start, opt_ran = self.events, self.start, self.opt_ran
        self.start = now
        self.opt_ran = False
        if start is None and not _begins(events):
            self.events = [e for e in events if e[0] in _CARRIED]
            return None
        self.events = []
        return events, start, self.sync_flag, opt_ran

    def clear(self) -> None:
        """Recording stopped: nothing kept."""
        self.events = []
        self.start = None
        self.opt_ran = False


def _begins(events: list) -> bool:
    """Whether something of the micro-step began (a marking event, a blocked collective)."""
    return any(e[0] in _MARKS or (e[0] == COLL and e[4]) for e in events)


def interpret(events: list, step: int, start: int | None, end: int, sync_flag) -> Raw | None:
    """The micro-step's intervals from its events (None when nothing happened in it): starts
    paired with their ends, a step's start at its first event when it had none."""
    first = None
    data_ns = data_cpu_ns = forwards = 0
    phases, exposed, tails, colls, rows = [], [], [], [], []
    fwd_t0 = opt_t0 = fwd_end = None
    samples = -1
    for e in events:
        kind = e[0]
        if first is None:
            if kind in _MARKS:
                first = e[2] if kind == WAIT else e[1]
            elif kind == COLL and e[4]:  # a blocked collective began at its launch
                first = e[2]
        if kind == FWD_START:
            fwd_t0 = e[1]
        elif kind == FWD_END:
            if fwd_t0 is not None:
                phases.append(("forward", fwd_t0, e[1]))
                forwards += 1
                fwd_t0, fwd_end = None, e[1]
        elif kind == BACKWARD:
            phases.append(("backward", e[1], e[2]))
        elif kind == DDP_TAIL:
            tails.append((e[1], e[2]))
        elif kind == OPT_START:
            opt_t0 = e[1]
        elif kind == OPT_END:
            if opt_t0 is not None:
                phases.append(("optimizer", opt_t0, e[1]))
                opt_t0 = None
        elif kind == COLL:
            if e[4]:  # issued by the training thread, which waited for it
                exposed.append((e[2], e[3], e[1]))
            colls.append((e[1], e[2], e[3]))
        elif kind == WAIT:
            exposed.append((e[2], e[3], e[1]))
        elif kind == DATA:
            data_ns += e[2] - e[1]
            data_cpu_ns += e[3]
        elif kind == PHASE:
            if e[4]:
                exposed.append((e[2], e[3], f"phase:{e[1]}"))
            else:
                phases.append((e[1], e[2], e[3]))
                if e[1] == "forward":
                    forwards += 1
        elif kind == SAMPLES:
            samples = e[1]
        elif kind == ROWS:
            rows.append(e[1])
    if start is None:
        start = first
    if start is None:
        return None
    if sync_flag is not None:
        synced = int(bool(sync_flag))
    else:
        synced = 1 if tails or colls else -1
    return Raw(step, start, end, first, data_ns, data_cpu_ns, phases, exposed, tails, colls,
               fwd_end, synced, samples, forwards, tuple(rows))
