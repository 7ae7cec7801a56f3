"""Times DDP's gradient synchronization without a comm hook: DDP's reducer runs as it would
without gpuscope (its C++ all-reduce, or the user's own hook, registered whenever they like).

A Python comm hook costs a call from C++ into Python per bucket and a Python completion callback
on the backend's thread: torch's own default Python hook costs ~56 us per step on this project's
CPU against DDP's built-in one, more than gpuscope's whole per-step budget. What a step loses to
gradient communication is the backward's tail instead: once autograd has run every node of the
backward graph (the last bucket is launched inside the last gradient's accumulation), DDP's
reducer waits for its all-reduces to finish before backward returns. So a prehook on the root of
the graph queues an autograd final callback (queued before DDP's own, it runs first: at the end
of backward compute), and the tail from there to backward's return is the exposed communication,
noted as the step's one "bucket" (launch = end of backward compute, done = backward's return).
On CUDA, the same two points get events (DeviceTimer.comm_launch/comm_done): after DDP's
finalize, the current stream waits for the all-reduce, so the second event completes when the
gradients are in. Communication hidden behind backward is taken from DDP's own runtime logging
(sampled iterations, `ddp_logging_summary`, written at the end of the run).
"""

from __future__ import annotations

import time
from typing import Callable

from .._log import warn_once

CommSink = Callable[[int, int, int], None]  # (bucket_index, launch_ns, done_ns)


def is_ddp(model) -> bool:
    return model is not None and hasattr(model, "register_comm_hook") and hasattr(model, "reducer")


class DDPTailTimer:
    """Times the end of one DDP model's backward: see the module's docstring."""

    hook_name = "none (backward tail timed, DDP's reducer untouched)"

    def __init__(self, ddp, sink: CommSink, clock=time.perf_counter_ns):
        import torch

        self.ddp = ddp
        self.sink = sink
        self.clock = clock
        self.active = True
        self.device = None  # DeviceTimer on CUDA: the tail on the GPU's timeline too
        self._queue = torch.autograd.Variable._execution_engine.queue_callback
        self._t_final = None
        self._dev_final = None

    def arm(self, tensors) -> bool:
        """Before a backward: if it synchronizes gradients, hook the root of its graph."""
        if not self.active or not self.ddp.require_backward_grad_sync:
            return False
        root = tensors if hasattr(tensors, "grad_fn") else next(
            (t for t in tensors if hasattr(t, "grad_fn") and t.grad_fn is not None), None) \
            if isinstance(tensors, (list, tuple)) else None
        fn = getattr(root, "grad_fn", None)
        if fn is None:
            return False
        self._t_final = None
        # not removed afterwards: the graph (and the hook with it) goes when backward frees it;
        # a graph kept for a second backward queues the callback again, as it should
        fn.register_prehook(self._root)
        return True

    def _root(self, grad_outputs):
        self._queue(self._final)

    def _final(self) -> None:
        self._t_final = self.clock()
        device = self.device
        if device is not None:
            self._dev_final = device.comm_launch()

    def finish(self) -> None:
        """After the backward returned: the tail, if the final callback ran."""
        t_end = self.clock()
        t0, self._t_final = self._t_final, None
        if t0 is None or self.sink is None:
            return
        self.sink(0, t0, t_end)
        device, ev = self.device, self._dev_final
        self._dev_final = None
        if device is not None and ev is not None:
            device.comm_done(ev)

    def detach(self) -> None:
        self.active = False
        self.sink = None
        self.device = None


def ddp_logging_summary(ddp) -> dict:
    """What DDP measures itself (sampled iterations), in ns; empty if unavailable."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return {}
    keys = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time", "comm_hook", "backend_name", "bucket_sizes")
    return {k: data[k] for k in keys if k in data}
