"""Times DDP's gradient synchronization without a comm hook: DDP's reducer runs as it would
without gpuscope (its C++ all-reduce, or the user's own hook, registered whenever they like).

A Python comm hook costs a call from C++ into Python per bucket and a Python completion callback
on the backend's thread: even a minimal one costs ~46 us per step on this project's CPU against
DDP's built-in all-reduce, most of gpuscope's whole per-step budget. What a step loses to
gradient communication is the backward's tail instead: DDP launches its last bucket inside the
last gradient's accumulation, and once autograd has run every node of the graph, its reducer
waits for the all-reduces before backward returns. The tail starts just before that last launch:
a post-accumulate hook on the parameter whose gradient is ready last (a guess, the first
parameter, until DDP's logging names it after an iteration) runs before DDP's own hook on the
same accumulation, so a launch that blocks (gloo's, when a busy core preempts it) is inside, as
a trace counts it. Where a gradient may not come in every backward (find_unused_parameters, a
static graph), or once the watched one did not, a prehook on the root of each graph also queues
an autograd final callback (before DDP's own, so it runs first, at the end of backward compute):
where the watched gradient was not ready this time, the tail starts there. (Elsewhere DDP needs
every gradient in every synchronized backward, so the watched one always comes, and the prehook,
its callback and a handle a step are saved.) It ends at backward's return, and is the step's one
"bucket" (all_reduce:ddp). On CUDA, the same points get events (DeviceTimer.comm_launch /
comm_done): after DDP's finalize the current stream waits for the all-reduce, so the second
event completes when the gradients are in.

Communication that backward hides is not seen; when it began is: once DDP has rebuilt its
buckets in the order gradients come (its logging names them, after its second iteration), a
second post-accumulate hook on the parameter of its first bucket that is ready last times that
bucket's launch. From there to backward's return, gradient synchronization is in flight (the
row's comm_ns; its exposed part starts at the last launch): what part of that window the
all-reduces ran, and took from backward, is the analysis's model (whatif.hidden_comm), the
same one a CPU trace gets (readers/kineto/steps.py). On CUDA the launch is not timed: the host
runs ahead of the device there. DDP's own runtime logging (sampled iterations) is written at the
end of the run.
"""

from __future__ import annotations



def is_ddp(model) -> bool:
    return model is not None and hasattr(model, "register_comm_hook") and hasattr(model, "reducer")


def inner_ddp(model):
    """The DistributedDataParallel that `model` is, or that a wrapper around it holds (Lightning
    Fabric's _FabricModule keeps DDP as its `_forward_module`): the outermost DDP among the
    model's modules; None without one."""
    if is_ddp(model):
        return model
    try:
        for i, m in enumerate(model.modules()):
            if is_ddp(m):
                return m
            if i >= 8:  # a wrapper holds it near the top; a model's own layers are no DDP
                return None
    except Exception:
        return None
    return None


#: what DDP's logging holds of its sampled iterations when the gradient order is first known
FIRST_SAMPLE_KEYS = ("iteration", "avg_backward_compute_time",
                     "avg_backward_compute_comm_overlap_time")


class DDPTailTimer:
    """Times the end of one DDP model's backward: see the module's docstring."""

    hook_name = "none (backward tail timed, DDP's reducer untouched)"

    def __init__(self, ddp, clock):
        import torch

        self.ddp = ddp
        self.clock = clock
        self.active = True
        self.device = None  # DeviceTimer on CUDA: the tail on the GPU's timeline too
        self._queue = torch.autograd.Variable._execution_engine.queue_callback
        self._t_final = self._t_ready = self._t_first = None
        self._dev_final = self._dev_ready = None
        # the parameter whose gradient is ready last: DDP launches its last bucket right after
        # (in DDP's own hook on the same accumulation, which runs after this one). A guess
        # first (the first parameter: backward reaches the first layer last), then what DDP's
        # logging says of the previous iteration's order
        self.first_sample = None  # DDP's logging when the gradient order was first known
        self._params = _reducer_params(ddp)
        self._handle = self._first_handle = None
        self._order = None  # the previous iteration's gradient order, once DDP's logging says
        self._order_tries = 0
        if self._params:
            self._watch(self._params[0])
        # the end of backward compute is timed too where the watched gradient may not come
        self._root_too = self._handle is None or bool(getattr(ddp, "find_unused_parameters", True)) \
            or bool(getattr(ddp, "static_graph", True))

    def _watch(self, param) -> None:
        try:  # a torch without post-accumulate hooks: the tail starts at the final callback
            if self._handle is not None:
                self._handle.remove()
                self._handle = None
            self._handle = param.register_post_accumulate_grad_hook(self._ready)
        except Exception:
            self._handle = None

    def _watch_first(self, param) -> None:
        try:
            self._first_handle = param.register_post_accumulate_grad_hook(self._first_ready)
        except Exception:
            self._first_handle = None

    def _first_ready(self, param) -> None:
        self._t_first = self.clock()

    def _ready(self, param) -> None:
        self._t_ready = self.clock()
        device = self.device
        if device is not None:
            self._dev_ready = device.comm_launch()

    def arm(self, tensors) -> bool:
        """Before a backward: if it synchronizes gradients, hook the root of its graph."""
        if not self.active or not self.ddp.require_backward_grad_sync:
            return False
        if 0 <= self._order_tries < 12:
            self._learn_order()
        self._t_final = self._t_ready = self._t_first = self._dev_ready = None
        if not self._root_too:  # the watched gradient's hook alone: the graph is not looked at
            return True  # (no graph: finish() finds neither time and says so)
        root = tensors if hasattr(tensors, "grad_fn") else next(
            (t for t in tensors if hasattr(t, "grad_fn") and t.grad_fn is not None), None) \
            if isinstance(tensors, (list, tuple)) else None
        fn = getattr(root, "grad_fn", None)
        if fn is None:
            return False
        # not removed afterwards: the graph (and the hook with it) goes when backward frees it;
        # a graph kept for a second backward queues the callback again, as it should
        fn.register_prehook(self._root)
        return True

    def _learn_order(self) -> None:
        """Once DDP's logging holds the previous iteration's gradient order, watch its last; once
        it holds the rebuilt buckets too, the first bucket's last (asked before each of the
        first 12 synchronizing backwards at most, then never again)."""
        self._order_tries += 1
        try:
            data = self.ddp._get_ddp_logging_data()
        except Exception:
            return
        if self._order is None:
            order = data.get("prev_iteration_grad_ready_order_indices")
            if not isinstance(order, str) or not order.strip():
                return
            try:
                self._order = [int(x) for x in order.split(",")]
            except ValueError:
                self._order_tries = -1
                return
            # DDP's figures so far: its first sampled iteration, before it rebuilt its buckets
            # in the order gradients come (no overlap then), which the analysis sets apart
            self.first_sample = {k: data.get(k) for k in FIRST_SAMPLE_KEYS}
            last = self._order[-1] if self._order else -1
            if 0 <= last < len(self._params):
                self._watch(self._params[last])
        buckets = data.get("rebuilt_per_bucket_param_indices")
        if not isinstance(buckets, str) or not buckets.strip():
            return
        self._order_tries = -1  # known: not asked again
        if self.device is not None or "," not in buckets:  # CUDA, or one bucket: no window
            return
        try:
            first = {int(x) for x in buckets.split(",")[0].split()}
        except ValueError:
            return
        at = {p: i for i, p in enumerate(self._order)}
        ready = [p for p in first if p in at and p < len(self._params)]
        if ready:
            self._watch_first(self._params[max(ready, key=at.__getitem__)])

    def _root(self, grad_outputs):
        self._queue(self._final)

    def _final(self) -> None:
        self._t_final = self.clock()
        device = self.device
        if device is not None:
            self._dev_final = device.comm_launch()

    def finish(self) -> tuple[int, int, int] | None:
        """After the backward returned: the tail (launch, done, first), if the final callback
        ran, for the step's one "bucket". It starts when the last gradient was ready (just
        before DDP launched the last bucket: a launch that blocks, as gloo's does when a busy
        core preempts it, is inside), or at the end of backward compute when that parameter's
        hook did not run this time; `first`, when the first bucket was launched (the launch
        when that was not timed)."""
        t_end = self.clock()
        t_final, t_ready = self._t_final, self._t_ready
        t_first = self._t_first
        if t_first is None or t_ready is None or t_first > t_ready:
            t_first = t_ready  # no earlier launch timed: no window
        if t_final is None and t_ready is not None and self.device is None and self.active:
            self._t_ready = None  # the common case (no final callback, no CUDA events)
            return (t_ready, t_end, t_first)
        self._t_final = self._t_ready = None
        ready = t_ready is not None and (t_final is None or t_ready <= t_final)
        if not ready and t_final is None:
            # the watched gradient did not come (DDP's own check fails at its next backward):
            # from now on the end of backward compute is timed too
            self._root_too = True
            return None
        if not self.active:
            return None
        device = self.device
        ev = self._dev_ready if ready and self._dev_ready is not None else self._dev_final
        self._dev_final = self._dev_ready = None
        if device is not None and ev is not None:
            device.comm_done(ev)
        return (t_ready, t_end, t_first) if ready else (t_final, t_end, t_final)

    def detach(self) -> None:
        self.active = False
        self.device = None
        for handle in (self._handle, self._first_handle):
            if handle is not None:
                try:
                    handle.remove()
                except Exception:
                    pass
        self._handle = self._first_handle = None


def _reducer_params(ddp) -> list:
    """DDP's parameters in its reducer's order (its gradient-order indices count these)."""
    try:
        ignore = set(getattr(ddp, "parameters_to_ignore", ()) or ())
        return [p for n, p in ddp.module.named_parameters()
                if n not in ignore and p.requires_grad]
    except Exception:
        return []


def ddp_logging_summary(ddp, first_sample: dict | None = None) -> dict:
    """What DDP measures itself (sampled iterations), in ns, with the last iteration sampled
    ("iteration") and DDPTailTimer.first_sample ("first_sample"); empty if unavailable."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return {}
    keys = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time", "comm_hook", "backend_name", "bucket_sizes",
            "iteration")
    out = {k: data[k] for k in keys if k in data}
    if out and first_sample:
        out["first_sample"] = first_sample
    return out
