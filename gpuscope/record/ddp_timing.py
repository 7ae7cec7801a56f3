"""Times DDP gradient communication per bucket by wrapping (never replacing) the comm hook.

DDP accepts one comm hook per model, registered before the first backward. gpuscope registers a
dispatcher that calls the user's hook (or DDP's default all-reduce) and notes, per bucket, when it
was launched and when its future completed. A hook the user registers later is routed through the
dispatcher instead of failing with DDP's "can only be registered once".
"""

from __future__ import annotations

import time
from typing import Callable

from .._log import info_once, warn_once
from .collectives import quiet

CommSink = Callable[[int, int, int], None]  # (bucket_index, launch_ns, done_ns)


def is_ddp(model) -> bool:
    return model is not None and hasattr(model, "register_comm_hook") and hasattr(model, "reducer")


class DDPCommTimer:
    """Installs the timing dispatcher on one DDP model and forwards bucket timings to `sink`."""

    def __init__(self, ddp, sink: CommSink):
        self.ddp = ddp
        self.sink = sink
        self.active = False
        self.reason = ""
        self.device = None  # DeviceTimer on CUDA: bucket times on the GPU's timeline too
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self._default_hooks = default_hooks
        self.inner_hook = _mean_allreduce  # what DDP does without a hook, in as few calls
        self.inner_state = getattr(ddp, "process_group", None)
        self.hook_name = "allreduce (DDP default)"
        self.unwrap = True  # the inner future holds [tensor]; ours hands DDP the tensor

    def install(self) -> bool:
        ddp = self.ddp
        if getattr(ddp, "_comm_hooks", None):
            hook, _ = ddp._comm_hooks[-1]
            self.reason = (f"a comm hook ({getattr(hook, '__qualname__', hook)}) was registered before "
                           "gpuscope.record(): communication is taken from DDP's own logging")
            info_once("ddp-hook-present", "gpuscope: %s", self.reason)
            return False
        try:
            ddp.register_comm_hook(self, _dispatch)
        except Exception as exc:  # e.g. backward already ran: DDP refuses late registration
            self.reason = f"could not register the timing comm hook ({exc}); using DDP's own logging"
            info_once("ddp-hook-failed", "gpuscope: %s", self.reason)
            return False
        ddp.register_comm_hook = self._register_user_hook  # route later user hooks through us
        ddp._register_builtin_comm_hook = self._register_builtin
        self.active = True
        return True

    def _register_user_hook(self, state, hook) -> None:
        self.ddp._check_comm_hook(hook)
        self.inner_hook, self.inner_state, self.unwrap = hook, state, False
        self.hook_name = getattr(hook, "__qualname__", repr(hook))
        self.ddp._comm_hooks.append((hook, state))

    def _register_builtin(self, comm_hook_type) -> None:
        name = str(comm_hook_type)
        hook = (self._default_hooks.fp16_compress_hook if "FP16" in name
                else self._default_hooks.allreduce_hook)
        self._register_user_hook(getattr(self.ddp, "process_group", None), hook)

    def detach(self) -> None:
        """Stop reporting and let go of the recorder: the dispatcher stays registered (DDP cannot
        unregister a hook) and from now on only forwards to the inner hook, with no timing."""
        self.active = False
        self.sink = None
        self.device = None


def _mean_allreduce(process_group, bucket):
    """DDP's default reduction (average over ranks) as one division and one async all-reduce."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    buf = bucket.buffer()
    buf.div_(group.size())
    return group.allreduce([buf]).get_future()


def _dispatch(timer: DDPCommTimer, bucket):
    unwrap = timer.unwrap
    sink = timer.sink if timer.active else None
    if sink is None:  # detached: exactly what DDP would do without gpuscope
        fut = timer.inner_hook(timer.inner_state, bucket)
        return fut.then(_first) if unwrap else fut
    launch = time.perf_counter_ns()
    device = timer.device
    dev_launch = device.comm_launch() if device is not None else None
    with quiet():  # a user hook's dist.all_reduce is this bucket, already timed here
        fut = timer.inner_hook(timer.inner_state, bucket)
    try:
        index = bucket.index()

        def _done(f):
            try:
                sink(index, launch, time.perf_counter_ns())
                if dev_launch is not None:
                    device.comm_done(dev_launch)
            except Exception:
                warn_once("ddp-sink", "gpuscope: failed to note a bucket timing", exc_info=True)
            return f.value()[0] if unwrap else f.value()

        return fut.then(_done)
    except Exception:
        warn_once("ddp-dispatch", "gpuscope: comm timing failed; gradients unaffected", exc_info=True)
        return fut.then(_first) if unwrap else fut


def _first(f):
    return f.value()[0]


def ddp_logging_summary(ddp) -> dict:
    """What DDP measures itself (sampled iterations), in ns; empty if unavailable."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return {}
    keys = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time", "comm_hook", "backend_name", "bucket_sizes")
    return {k: data[k] for k in keys if k in data}
