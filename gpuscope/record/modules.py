"""Opt-in per-module forward time (`record(..., modules=...)`): which module a straggler's excess
is in, for recorded runs (profiler traces have ops and kernels instead).

The chosen modules get a forward pre-hook and a forward hook. On a CPU rank each hook reads the
recorder's clock: the module's forward time on the host. On a CUDA rank the hooks record CUDA
events on the current stream (cuda_timing's backend, from a pool), read once they completed:
the device time between the module's first and last queued kernel, never a synchronization
per step. Per micro-step, each module's summed time and its number of calls go into the record
file as a side record (`{"modules": {"clock", "names", "steps", "ns", "calls"}}`), read back
into RunTable.ops (kind "module").

Only forwards are timed: timing a module's backward takes full backward hooks, which wrap its
inputs and outputs in an autograd function and break in-place operations on them.
"""

from __future__ import annotations

from collections import deque

from .._log import warn_once

#: modules timed at most: each forward call of one costs ~3 us on a CPU (two hooks, and torch's
#: slower call path for a module with hooks: benchmarks/bench_modules.py), and the recorder's
#: budget is 50 us a step
MAX_MODULES = 12


def _unwrapped(model):
    """The user's model inside DDP / FSDP1 / DataParallel (their `.module`)."""
    inner = getattr(model, "module", None)
    return inner if inner is not None and hasattr(inner, "named_modules") else model


def resolve(model, which) -> tuple[list[str], list, list[str]]:
    """(names, modules, warnings) of `which`: True for the model's direct children, or names
    as model.get_submodule takes them ("transformer.h.0")."""
    root = _unwrapped(model)
    warnings = []
    if which is True:
        pairs = list(root.named_children())
    else:
        pairs = []
        for name in which:
            try:
                pairs.append((str(name), root.get_submodule(str(name))))
            except AttributeError:
                warnings.append(f"modules: the model has no submodule {name!r}: not timed")
    if len(pairs) > MAX_MODULES:
        warnings.append(f"modules: {len(pairs)} modules asked for, the first {MAX_MODULES} "
                        "timed (each costs a few us a call: the recording's budget is 50 us "
                        "a step)")
        pairs = pairs[:MAX_MODULES]
    return [n for n, _ in pairs], [m for _, m in pairs], warnings


class ModuleTimer:
    """Forward time per chosen module and micro-step (host clock, or CUDA events via `events`,
    a cuda_timing backend)."""

    def __init__(self, names: list[str], modules: list, clock, events=None):
        self.names, self.modules = names, modules
        self.clock, self.events = clock, events
        n = len(names)
        self.t0: list = [None] * n
        self.ns = [0] * n
        self.calls = [0] * n
        self.spans: list = []          # CUDA: (module, start event, end event) this micro-step
        self.done: list = []           # host: (step, ns, calls) of finished micro-steps
        self.pending: deque = deque()  # CUDA: (step, spans, calls) not read yet
        self.pool: list = []
        self.handles: list = []

    def install(self) -> bool:
        for i, m in enumerate(self.modules):
            self.handles.append(m.register_forward_pre_hook(self._pre(i)))
            self.handles.append(m.register_forward_hook(self._post(i)))
        return bool(self.handles)

    def _pre(self, i: int):
        def pre(module, args):
            try:
                if self.events is None:
                    self.t0[i] = self.clock()
                else:
                    e = self.pool.pop() if self.pool else self.events.new_event()
                    self.events.record(e)
                    self.t0[i] = e
            except Exception as exc:  # never into the user's forward: timing off, said
                self._failed(exc)
        return pre

    def _post(self, i: int):
        def post(module, args, out):
            try:
                t0 = self.t0[i]
                if t0 is None:
                    return
                self.t0[i] = None
                self.calls[i] += 1
                if self.events is None:
                    self.ns[i] += self.clock() - t0
                else:
                    e1 = self.pool.pop() if self.pool else self.events.new_event()
                    self.events.record(e1)
                    self.spans.append((i, t0, e1))
            except Exception as exc:
                self._failed(exc)
        return post

    def _failed(self, exc: Exception) -> None:
        """A hook raised (a CUDA error, a module in a state we do not know): module timing is
        switched off with one warning; the forward goes on."""
        warn_once("modules-failed", "gpuscope: module timing off: %r; training goes on", exc)
        self.remove()

    def step_end(self, step: int) -> None:
        """A micro-step closed: what it timed is kept for the next flush."""
        calls, self.calls = self.calls, [0] * len(self.names)
        if self.events is None:
            ns, self.ns = self.ns, [0] * len(self.names)
            if any(calls):
                self.done.append((step, ns, calls))
        elif self.spans:
            self.pending.append((step, self.spans, calls))
            self.spans = []

    def _read(self, wait: bool) -> None:
        """CUDA: the micro-steps whose last event completed (all of them with `wait`: at the
        end of the recording, one synchronization)."""
        if wait and self.pending:
            self.events.synchronize()
        while self.pending:
            step, spans, calls = self.pending[0]
            if not self.events.done(spans[-1][2]):
                break
            self.pending.popleft()
            ns = [0] * len(self.names)
            for i, e0, e1 in spans:
                ns[i] += self.events.elapsed_ns(e0, e1)
                self.pool += (e0, e1)
            self.done.append((step, ns, calls))

    def meta(self, final: bool) -> dict | None:
        """The side record of the micro-steps read since the last one (None: nothing)."""
        if self.events is not None:
            self._read(final)
        if not self.done:
            return None
        done, self.done = self.done, []
        return {"modules": {"clock": "host" if self.events is None else "cuda",
                            "names": list(self.names), "steps": [d[0] for d in done],
                            "ns": [d[1] for d in done], "calls": [d[2] for d in done]}}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
