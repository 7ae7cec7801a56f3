"""The intervals of the micro-step being recorded, filled by the recorder and its hooks.

Every method is a few appends under the GIL; nothing is kept while `active` is False, so a
disabled or stopped recorder holds no per-step state.
"""

from __future__ import annotations

import time

from .step_row import Raw

_new = tuple.__new__  # Raw(...) without its Python __new__: one C call a micro-step


class StepState:
    _now = staticmethod(time.perf_counter_ns)

    def __init__(self, clock=None):
        if clock is not None:
            self._now = clock  # the recorder's clock (a test injects one): its hooks read it too
        self.active = False
        self.buckets: list = []      # DDP buckets may complete on another thread: kept across
        self.colls: list = []        # resets, handed over at close()
        self.a2a: list = []          # rows each all_to_all_single delivered (sinks.Routing):
        #                              handed over by the recorder when the step closes
        self.sync_flag = None        # probe's answer at the last forward: will backward sync?
        self.probe = None            # hooks.sync_probe's callable, asked at each forward
        self.tail = None             # ddp_timing.DDPTailTimer of a DDP model
        self.backward = None         # torch.autograd.backward as it was (hooks.py): timed_backward
        #                              calls it
        self.reset(None)

    def reset(self, start) -> None:
        self.start = start
        self.first = None
        self.data_ns = 0
        self.data_cpu_ns = 0
        self.phases: list = []
        self.exposed: list = []
        self.fwd_t0 = None
        self.fwd_end = None
        self.bwd_t0 = None
        self.opt_t0 = None
        self.opt_ran = False
        self.samples = -1
        self.forwards = 0

    def clear(self) -> None:
        self.reset(None)
        self.buckets, self.colls, self.a2a = [], [], []

    def mark(self, t: int) -> None:
        """An event of the step happened at `t` (the first one starts the step if needed)."""
        if self.first is None:
            self.first = t
            if self.start is None:
                self.start = t

    def close(self, step: int, now: int) -> Raw | None:
        """The finished micro-step's intervals (None if nothing happened in it); the next one
        starts at `now`."""
        start = self.start
        if start is None:
            self.reset(now)
            return None
        buckets, self.buckets = self.buckets, []
        colls, self.colls = self.colls, []
        if self.sync_flag is not None:
            synced = int(bool(self.sync_flag))
        else:
            synced = 1 if buckets or colls else -1
        raw = _new(Raw, (step, start, now, self.first, self.data_ns, self.data_cpu_ns,
                         self.phases, self.exposed, buckets, colls, self.fwd_end, synced,
                         self.samples, self.forwards))
        # reset(now), written out: a call less every micro-step
        self.start = now
        self.first = self.fwd_t0 = self.fwd_end = self.bwd_t0 = self.opt_t0 = None
        self.data_ns = self.data_cpu_ns = 0
        self.phases = []
        self.exposed = []
        self.opt_ran = False
        self.samples = -1
        self.forwards = 0
        return raw

    # ---------------------------------------------------------------- hook callbacks
    # the hooks below run every micro-step: mark() is written out in them (a call less each)
    def forward_start(self, *_) -> None:  # also the model's forward pre-hook (module, args)
        if self.active:
            t = self._now()
            if self.first is None:
                self.first = t
                if self.start is None:
                    self.start = t
            self.fwd_t0 = t
            flag = None
            if self.probe is not None:
                try:
                    flag = bool(self.probe())
                except Exception:
                    self.probe = None  # the model no longer says: unknown from now on
            self.sync_flag = flag

    def forward_end(self, *_) -> None:  # also the forward hook (module, args, output)
        if self.active and self.fwd_t0 is not None:
            t = self._now()
            self.phases.append(("forward", self.fwd_t0, t))
            self.forwards += 1
            self.fwd_t0 = None
            self.fwd_end = t

    def timed(self, forward):
        """`forward`, timed: what forward_start and forward_end do, written out around the call
        in one frame (hooks.wrap_forward puts it in the model's forward; a hook pair cost three
        frames and torch's slow call path)."""
        now = self._now
        state = self

        def timed_forward(*args, **kwargs):
            if not state.active:
                return forward(*args, **kwargs)
            t = now()
            if state.first is None:
                state.first = t
                if state.start is None:
                    state.start = t
            state.fwd_t0 = t
            flag = None
            if state.probe is not None:
                try:
                    flag = bool(state.probe())
                except Exception:
                    state.probe = None
            state.sync_flag = flag
            out = forward(*args, **kwargs)  # raising: no end, as a forward hook would not run
            t0 = state.fwd_t0
            if t0 is not None and state.active:
                t = now()
                state.phases.append(("forward", t0, t))
                state.forwards += 1
                state.fwd_t0 = None
                state.fwd_end = t
            return out

        return timed_forward

    def timed_backward(self, *args, **kwargs):
        """torch.autograd.backward (which loss.backward() calls) while this state records
        (hooks.py puts it in place): the backward's span and, for a DDP model, the tail of it
        that waited for the gradients' all-reduce (ddp_timing.py)."""
        backward = self.backward
        if not self.active or self.bwd_t0 is not None:  # off, or inside a timed backward
            return backward(*args, **kwargs)
        t = self._now()
        if self.first is None:
            self.first = t
            if self.start is None:
                self.start = t
        self.bwd_t0 = t
        tail = self.tail
        armed = False
        if tail is not None:
            try:
                armed = tail.arm(args[0] if args else kwargs.get("tensors"))
            except Exception:
                self.tail = None  # timing off; the backward runs as it would
        try:
            return backward(*args, **kwargs)
        finally:
            if self.active and self.bwd_t0 is not None:
                self.phases.append(("backward", self.bwd_t0, self._now()))
            self.bwd_t0 = None
            if armed:
                try:
                    span = tail.finish()
                except Exception:
                    self.tail = span = None
                if span is not None and self.active:
                    self.buckets.append(span)  # the step's one DDP "bucket": its tail

    def optimizer_start(self, *_) -> None:  # also torch's optimizer step hook (opt, args, kw)
        if self.active:
            t = self._now()
            if self.first is None:
                self.first = t
                if self.start is None:
                    self.start = t
            self.opt_t0 = t

    def optimizer_end(self, *_) -> None:
        if self.active and self.opt_t0 is not None:
            self.phases.append(("optimizer", self.opt_t0, self._now()))
            self.opt_t0 = None
            self.opt_ran = True

    def collective(self, key: str, launch: int, done: int, blocked: bool) -> None:
        if self.active:
            if blocked:  # issued by the training thread (an async one's done comes from another)
                if self.first is None:
                    self.first = launch
                    if self.start is None:
                        self.start = launch
                self.exposed.append((launch, done, key))
            self.colls.append((key, launch, done))

    def routed(self, rows: int) -> None:
        if self.active:
            self.a2a.append(rows)

    def waited(self, key: str, t0: int, t1: int) -> None:
        if self.active:
            if self.first is None:
                self.first = t0
                if self.start is None:
                    self.start = t0
            self.exposed.append((t0, t1, key))
