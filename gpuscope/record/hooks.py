"""Hooks that feed a StepLog (events.py) from the training process, and take themselves out
again: each calls one StepLog method, which appends one event.

- the model: its forward timed by a wrapper (or forward pre/post hooks), and whether this
  micro-step's backward will synchronize gradients (DDP's require_backward_grad_sync, which
  no_sync() clears; FSDP2's reduce_grads, which set_requires_gradient_sync() sets; FSDP1's
  _sync_gradients);
- backward: torch.autograd.backward (which loss.backward() calls) is wrapped while a recording
  runs, so every backward is timed in every micro-step, synchronized or not, the loss
  function's own backward included, whatever the model returns;
- the tail of DDP's backward, waiting for its gradient all-reduces (ddp_timing.py: no comm
  hook), torch's global optimizer step hooks, and the collectives issued through
  torch.distributed (collectives.py).
"""

from __future__ import annotations

import functools
import sys
import threading

_lock = threading.Lock()
_backward_states: list = []   # StepLogs timing backward (the newest gets it)
_backward_original = None     # torch.autograd.backward before the first of them


def _ours(fn, state) -> bool:
    """Whether `fn` (what torch.autograd.backward is now) is `state`'s timed_backward."""
    return getattr(fn, "__self__", None) is state and \
        getattr(fn, "__func__", None) is type(state).timed_backward


def _attach_backward(state) -> None:
    """torch.autograd.backward becomes `state.timed_backward` (a bound method: no frame of ours
    between torch and the state), which calls the original."""
    global _backward_original
    import torch.autograd

    with _lock:
        if not _backward_states:
            _backward_original = torch.autograd.backward
        state.backward = _backward_original
        current = torch.autograd.backward
        if current is _backward_original or any(_ours(current, s) for s in _backward_states):
            torch.autograd.backward = state.timed_backward
        _backward_states.append(state)


def _detach_backward(state) -> None:
    """Put back what was there before `state` (an older recording's timing, or the original),
    unless someone else has replaced torch.autograd.backward since: theirs stays (and calls
    ours, which only passes through once the state is off)."""
    global _backward_original
    import torch.autograd

    with _lock:
        if state not in _backward_states:
            return
        _backward_states.remove(state)
        if _ours(torch.autograd.backward, state):
            torch.autograd.backward = (_backward_states[-1].timed_backward if _backward_states
                                       else _backward_original)
        if not _backward_states:
            _backward_original = None


def sync_probe(model):
    """A callable telling, at forward time, whether this micro-step's backward will synchronize
    gradients; None when the model does not say."""
    if model is None:
        return None
    if hasattr(model, "require_backward_grad_sync") and hasattr(model, "reducer"):  # DDP
        return functools.partial(getattr, model, "require_backward_grad_sync")  # no Python frame
    groups = []
    for m in model.modules() if hasattr(model, "modules") else ():
        get_state = getattr(m, "_get_fsdp_state", None)  # FSDP2 (fully_shard)
        if get_state is not None:
            try:
                pg = get_state()._fsdp_param_group
            except Exception:
                pg = None
            if pg is not None and hasattr(pg, "reduce_grads"):
                groups.append(pg)
        if len(groups) >= 1:
            break
    if groups:
        return lambda: groups[0].reduce_grads
    if hasattr(model, "_sync_gradients"):  # FSDP1 (FullyShardedDataParallel)
        return lambda: model._sync_gradients
    return None


def timed_module(model):
    """The module whose forward is timed: the model, or the stage module of a
    torch.distributed.pipelining PipelineStage (which is no Module itself)."""
    if hasattr(model, "register_forward_pre_hook"):
        return model
    sub = getattr(model, "submod", None)
    return sub if hasattr(sub, "register_forward_pre_hook") else None


def wrap_forward(module, state):
    """Time `module`'s forward by a wrapper put in its `forward` (an instance attribute, as
    accelerate does), not by forward hooks: a module without hooks stays on torch's fast call
    path, which a hook takes it off (the slow path walks eight hook dicts and calls each hook:
    ~22,000 instructions a step on a tiny DDP model, under valgrind, against the wrapper). Only
    where the module has no forward hooks and no instance `forward` of its own (FSDP2's
    fully_shard, a compiled module, another wrapper: hooks then, as their order relative to the
    module's own hooks says what is inside forward). The wrapper carries the forward's name,
    docstring and `__wrapped__`, so inspect.signature(model.forward) (the HF Trainer reads it to
    pick dataset columns) sees the real arguments. Returns the wrapper, or None."""
    try:
        if module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module):
            return None
        forward = module.forward
    except Exception:  # not an nn.Module as torch makes them
        return None
    timed_forward = state.time_forward(forward)
    functools.update_wrapper(timed_forward, forward)
    # into the module's own __dict__, past any __setattr__ of its class: a wrapper that forwards
    # attribute writes to the module inside it (Lightning Fabric's _FabricModule) would put ours
    # in the inner module's forward, which the outer forward calls: endless recursion
    object.__setattr__(module, "forward", timed_forward)
    return timed_forward


def unwrap_forward(module, wrapper) -> None:
    """Take the wrapper out, unless something has replaced it since (that stays, and calls ours,
    which times nothing once the state is off)."""
    try:
        if vars(module).get("forward") is wrapper:
            vars(module).pop("forward")  # past the class's __delattr__, as wrap_forward wrote it
    except Exception:
        pass


class Hooks:
    """Everything gpuscope hooks into; `remove()` takes it all out (idempotent)."""

    def __init__(self, state, model=None, time_optimizer: bool = True):
        self.state = state
        self.model = model
        self.handles: list = []
        self.ddp = None          # ddp_timing.DDPTailTimer
        self.collectives = None  # collectives.CollectiveTimer
        self.warnings: list[str] = []
        self._time_optimizer = time_optimizer
        self._backward = False
        self._wrapped = None     # (module, wrapper) where forward is timed by wrap_forward

    def install(self) -> None:
        model, state = self.model, self.state
        if model is not None:
            from .ddp_timing import DDPTailTimer

            from .ddp_timing import inner_ddp

            ddp = inner_ddp(model)
            if ddp is not None and "torch" in sys.modules:
                self.ddp = DDPTailTimer(ddp, state.now)
                state.tail = self.ddp
            state.probe = sync_probe(ddp if ddp is not None else model)
            module = timed_module(model)
            wrapper = wrap_forward(module, state) if module is not None else None
            if wrapper is not None:
                self._wrapped = (module, wrapper)
            elif module is not None:  # the state's own methods: no frame between
                self.handles.append(module.register_forward_pre_hook(state.forward_start))
                self.handles.append(module.register_forward_hook(state.forward_end))
        if "torch" in sys.modules:
            _attach_backward(state)
            self._backward = True
            if self._time_optimizer:
                self._install_optimizer_hooks()
            from .collectives import CollectiveTimer

            self.collectives = CollectiveTimer(state.collective, state.waited, state.routed,
                                               now=state.now)
            if not self.collectives.attach():
                if self.collectives.reason:
                    self.warnings.append(self.collectives.reason)
                self.collectives = None

    def _install_optimizer_hooks(self) -> None:
        try:
            from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                               register_optimizer_step_pre_hook)
        except Exception:
            return
        # the state's own methods take (optimizer, args, kwargs): no lambda between
        self.handles.append(register_optimizer_step_pre_hook(self.state.optimizer_start))
        self.handles.append(register_optimizer_step_post_hook(self.state.optimizer_end))

    def remove(self) -> None:
        for handle in self.handles:
            try:
                handle.remove()
            except Exception:
                pass
        self.handles.clear()
        if self._wrapped is not None:
            unwrap_forward(*self._wrapped)
            self._wrapped = None
        for timer in (self.ddp, self.collectives):
            if timer is not None:
                timer.detach()
        self.state.tail = None
        self.state.probe = None
        self.collectives = None
        if self._backward:
            _detach_backward(self.state)
            self._backward = False
