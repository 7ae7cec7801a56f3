"""The micro-step being recorded, as lists of events: every hook appends one small tuple.

The hooks (hooks.py, collectives.py, ddp_timing.py through `timed_backward`, the recorder's data
wrapper and phases) call one method of `StepLog` each, which appends to the micro-step's lists
and keeps nothing else, apart from the live flags a hook itself must read (a backward being
timed, a forward or optimizer step begun by one hook and ended by another, the model's sync
probe and its last answer, DDP's tail timer, whether the optimizer ran). `take()` hands the
lists over at rec.step(); rows.py makes the rows of them at the flush, off the per-step path.
Nothing outside this module writes a StepLog's fields.

The lists (times are the recorder's clock, integer ns), by how often a step has their events:
  phases  (name, t0, t1): a part of the step, ended: "forward" (the model's, by its wrapper or
          its forward hooks), "backward", "optimizer", and rec.phase(name)'s of compute
  data    (t0, t1, cpu_ns): a batch fetched (cpu_ns -1: not measured)
  tails   (t0, t1, first): the end of a DDP backward that waited for its all-reduce, and when
          its first bucket was launched (ddp_timing.py)
  rare    (kind, ...): everything else, in the order it happened:
          (WAIT, key, t0, t1)     the training thread blocked on communication: an async
                                  collective's wait, rec.phase(name) of communication
          (COLL, key, launch, done, blocked)  a collective through torch.distributed
          (SAMPLES, n)            the batch's size differs from the first batch's
          (ROWS, n)               rows an all_to_all_single delivered (rows.Built.routed)
          (BEGAN, t)              a forward or optimizer step that began at t and never ended
          (LOOP_FORWARD, t1)      the phase ending at t1 named "forward" is the loop's
                                  rec.phase, not the model's forward
"""

from __future__ import annotations

from typing import NamedTuple

WAIT, COLL, SAMPLES, ROWS, BEGAN, LOOP_FORWARD = range(6)


class Taken(NamedTuple):
    """A micro-step handed over by take(): its lists, its number and when it ran."""
    phases: list
    data: list
    tails: list
    rare: list
    step: int
    start: int | None  # None: the first, begun before anything ran
    end: int
    synced: object     # the model's sync flag for it (ddp_timing: None where not known)


_taken = tuple.__new__  # a Taken made as a plain tuple is (one C call on the per-step path)


class StepLog:
    """One micro-step's events, appended by the hooks while `active`."""

    def __init__(self, clock):
        self.now = clock  # the recorder's clock (RecordOptions.clock), integer ns
        self.active = False
        self.phases: list = []
        self.data: list = []
        self.tails: list = []
        self.rare: list = []
        self.start = None            # when the micro-step began (the last take), None at first
        self.in_backward = False     # a timed backward is running (nested ones pass through)
        self.fwd_t0 = None           # a forward began here (its pre-hook) and has not ended
        self.opt_t0 = None           # an optimizer step began here and has not ended
        self.opt_ran = False         # the optimizer stepped in this micro-step
        self.sync_flag = None        # the probe's answer at the last forward: will backward sync?
        self.probe = None            # hooks.sync_probe's callable, asked at each forward
        self.tail = None             # ddp_timing.DDPTailTimer of a DDP model
        self.backward = None         # torch.autograd.backward as it was (hooks.py)

    # ------------------------------------------------------------------ the hooks
    def _probe(self) -> None:
        """Ask the model whether this forward's backward will synchronize gradients."""
        flag = None
        if self.probe is not None:
            try:
                flag = bool(self.probe())
            except Exception:
                self.probe = None  # the model no longer says: unknown from now on
        self.sync_flag = flag

    def forward_start(self, *_) -> None:  # the model's forward pre-hook (module, args)
        if self.active:
            if self.fwd_t0 is not None:  # the last one never ended (it raised)
                self.rare.append((BEGAN, self.fwd_t0))
            self.fwd_t0 = self.now()
            self._probe()

    def forward_end(self, *_) -> None:  # the forward hook (module, args, output)
        if self.active and self.fwd_t0 is not None:
            self.phases.append(("forward", self.fwd_t0, self.now()))
            self.fwd_t0 = None

    def time_forward(self, forward):
        """`forward`, timed (hooks.wrap_forward puts it in the model's forward: one frame, where
        a hook pair costs torch's slow call path)."""
        log = self

        def timed_forward(*args, **kwargs):
            if not log.active:
                return forward(*args, **kwargs)
            t0 = log.now()
            log._probe()
            try:
                out = forward(*args, **kwargs)
            except BaseException:  # it began and never ended: open, as a hook pair leaves it
                if log.active:
                    if log.fwd_t0 is not None:
                        log.rare.append((BEGAN, log.fwd_t0))
                    log.fwd_t0 = t0
                raise
            if log.active:
                log.phases.append(("forward", t0, log.now()))
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
                self.phases.append(("backward", t0, self.now()))
            if armed:
                try:
                    span = tail.finish()
                except Exception:
                    self.tail = span = None
                if span is not None and self.active:
                    self.tails.append(span)

    def optimizer_start(self, *_) -> None:  # torch's optimizer step pre-hook (opt, args, kw)
        if self.active:
            if self.opt_t0 is not None:  # the last one never ended (it raised)
                self.rare.append((BEGAN, self.opt_t0))
            self.opt_t0 = self.now()

    def optimizer_end(self, *_) -> None:  # ... and its post-hook
        if self.active and self.opt_t0 is not None:
            self.phases.append(("optimizer", self.opt_t0, self.now()))
            self.opt_t0 = None
            self.opt_ran = True

    def collective(self, key: str, launch: int, done: int, blocked: bool) -> None:
        if self.active:
            self.rare.append((COLL, key, launch, done, blocked))

    def waited(self, key: str, t0: int, t1: int) -> None:
        """The training thread was blocked on communication from t0 to t1."""
        if self.active:
            self.rare.append((WAIT, key, t0, t1))

    def routed(self, rows: int) -> None:
        if self.active:
            self.rare.append((ROWS, rows))

    def fetched(self, t0: int, t1: int, cpu_ns: int) -> None:
        if self.active:
            self.data.append((t0, t1, cpu_ns))

    def phase(self, name: str, t0: int, t1: int, comm: bool) -> None:
        """rec.phase(name): of communication (blocking) or of compute."""
        if not self.active:
            return
        if comm:
            self.rare.append((WAIT, f"phase:{name}", t0, t1))
        else:
            self.phases.append((name, t0, t1))
            if name == "forward":
                self.rare.append((LOOP_FORWARD, t1))

    def samples(self, n: int) -> None:
        if self.active:
            self.rare.append((SAMPLES, n))

    # ------------------------------------------------------------------ the recorder's
    def begun(self) -> bool:
        """Whether the micro-step has begun its work (a forward, backward, optimizer step, or a
        compute phase ended): a batch fetched after that is fetched mid-step."""
        return bool(self.phases) or self.in_backward or self.fwd_t0 is not None or \
            self.opt_t0 is not None

    def take(self, step: int, now: int) -> Taken | None:
        """The micro-step `step` that ends now, as rows.build's items (Taken); None when nothing of it began (the first one, before
        anything ran: what other threads delivered is kept for the next). The next one begins
        now; read `opt_ran` before."""
        rare = self.rare
        if self.fwd_t0 is not None:  # begun in this one, never ended
            rare.append((BEGAN, self.fwd_t0))
            self.fwd_t0 = None
        if self.opt_t0 is not None:
            rare.append((BEGAN, self.opt_t0))
            self.opt_t0 = None
        out = _taken(Taken, (self.phases, self.data, self.tails, rare, step, self.start, now,
                             self.sync_flag))
        self.start = now
        self.opt_ran = False
        self.phases, self.data, self.rare = [], [], []
        if out.start is None and not _begins(out):
            self.rare = [e for e in rare if e[0] == COLL]  # delivered by other threads
            return None
        self.tails = []
        return out

    def clear(self) -> None:
        """Recording stopped: nothing kept."""
        self.phases, self.data, self.tails, self.rare = [], [], [], []
        self.start = self.fwd_t0 = self.opt_t0 = None
        self.opt_ran = False


def _begins(taken: Taken) -> bool:
    """Whether something of a micro-step began: a part, a fetch, a wait, a blocked collective."""
    phases, data, _, rare = taken[:4]
    return bool(phases or data) or any(
        e[0] in (WAIT, BEGAN) or (e[0] == COLL and e[4]) for e in rare)
