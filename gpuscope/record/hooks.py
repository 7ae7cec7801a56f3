"""Hooks that feed a StepState from the training process, and take themselves out again.

- the model: forward pre/post hooks; a hook on the forward's output that fires when backward
  reaches it, and an autograd-engine callback at the end of that backward (so backward is timed
  in every micro-step, synchronized or not); whether this micro-step's backward will synchronize
  gradients (DDP's require_backward_grad_sync, which no_sync() clears; FSDP2's reduce_grads,
  which set_requires_gradient_sync() sets; FSDP1's _sync_gradients);
- DDP's gradient buckets (ddp_timing.py), torch's global optimizer step hooks, and the
  collectives issued through torch.distributed (collectives.py).
"""

from __future__ import annotations

import sys

from .._log import warn_once


def find_grad_tensor(output, depth: int = 0):
    """The first tensor that requires grad in a forward's output (tensor, sequence, mapping,
    or an object with tensor attributes such as a transformers ModelOutput)."""
    if getattr(output, "requires_grad", False) and hasattr(output, "register_hook"):
        return output
    if depth >= 2:
        return None
    if isinstance(output, dict):
        items = list(output.values())
    elif isinstance(output, (list, tuple)):
        items = list(output)
    else:
        return None
    for item in items[:16]:
        found = find_grad_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def sync_probe(model):
    """A callable telling, at forward time, whether this micro-step's backward will synchronize
    gradients; None when the model does not say."""
    if model is None:
        return None
    if hasattr(model, "require_backward_grad_sync") and hasattr(model, "reducer"):  # DDP
        return lambda: model.require_backward_grad_sync
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


class Hooks:
    """Everything gpuscope hooks into; `remove()` takes it all out (idempotent)."""

    def __init__(self, state, model=None, time_optimizer: bool = True):
        self.state = state
        self.model = model
        self.handles: list = []
        self.ddp = None          # ddp_timing.DDPCommTimer
        self.collectives = None  # collectives.CollectiveTimer
        self.warnings: list[str] = []
        self._probe = None
        self._time_optimizer = time_optimizer

    def install(self) -> None:
        model, state = self.model, self.state
        if model is not None:
            from .ddp_timing import DDPCommTimer, is_ddp

            if is_ddp(model):
                self.ddp = DDPCommTimer(model, state.bucket)
                if not self.ddp.install():
                    self.warnings.append(self.ddp.reason)
            self._probe = sync_probe(model)
            if hasattr(model, "register_forward_pre_hook"):
                self.handles.append(model.register_forward_pre_hook(self._forward_start))
                self.handles.append(model.register_forward_hook(self._forward_end))
        if "torch" in sys.modules:
            if self._time_optimizer:
                self._install_optimizer_hooks()
            from .collectives import CollectiveTimer

            self.collectives = CollectiveTimer(state.collective, state.waited)
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
        self.handles.append(register_optimizer_step_pre_hook(
            lambda opt, args, kwargs: self.state.optimizer_start()))
        self.handles.append(register_optimizer_step_post_hook(
            lambda opt, args, kwargs: self.state.optimizer_end()))

    def remove(self) -> None:
        for handle in self.handles:
            try:
                handle.remove()
            except Exception:
                pass
        self.handles.clear()
        for timer in (self.ddp, self.collectives):
            if timer is not None:
                timer.detach()  # DDP cannot unregister its hook: it now only forwards
        self.collectives = None
        self._probe = None

    # ------------------------------------------------------------------ model hooks
    def _forward_start(self, module, args):
        flag = None
        if self._probe is not None:
            try:
                flag = bool(self._probe())
            except Exception:
                self._probe = None
        self.state.forward_start(flag)

    def _forward_end(self, module, args, output):
        if self.state.forward_end():
            tensor = find_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._backward_reached)

    def _backward_reached(self, grad):
        if self.state.backward_start():
            try:
                from torch.autograd import Variable

                Variable._execution_engine.queue_callback(self.state.backward_end)
            except Exception as exc:
                warn_once("backward-timing", "gpuscope: backward timing off: %r", exc)
                self.state.backward_end()
        return None
