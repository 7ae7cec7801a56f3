"""Times the collectives that go through torch.distributed's Python API: FSDP's all-gathers and
reduce-scatters (FSDP1 and FSDP2 both call it), and those the training code issues itself.

Why this seam: c10d offers no per-collective hook that works on every backend (the process
group's completion hook is NCCL-only, private, and fires from NCCL's watchdog thread), DDP's
comm hook covers DDP's buckets only (ddp_timing.py), and FSDP2's set_custom_all_gather /
set_custom_reduce_scatter exist only in recent torch and would displace a user's own. Every FSDP
version and user code call the functions of `torch.distributed` by attribute, so while a
recording runs gpuscope puts a thin timing wrapper in front of those functions, and of
`Work.wait`, and puts the originals back when the recording ends. A wrapper notes, per call: the
kind, the process group, when it was launched and when it completed (an async call's future),
and how long the calling thread was blocked (a blocking call, or `wait()` on an async one):
blocked time is exposed communication. Collectives issued from inside another timed collective
(or inside gpuscope's own live exchange, `quiet()`) are not counted twice.

Functional collectives (`torch.distributed._functional_collectives`: what DTensor and tensor,
sequence and context parallelism issue inside forward and backward, and `all_to_all_single`
for experts) return at once a tensor that waits when first used: the same wrapper notes the
launch, and one in front of the module's `wait_tensor` notes the blocked wait; the collective's
span is taken to end with that wait (when it finished earlier, the span is longer than the
transfer; the blocked part is exact). Their group is named as funcol names it.

Symmetric-memory collectives (`torch.ops.symm_mem`: one-shot / two-shot / multimem all-reduce,
all-gather, reduce-scatter, NVSHMEM all-to-all, the fused matmul collectives) are ops, not
Python functions: each op packet of a group collective is put behind a callable that forwards
every attribute to it (`.default`, its overloads and schema keep working). On a GPU they run on
the caller's stream and return at once, so the host sees a launch, not the transfer: they are
counted by kind and group and the end record says so (their time is inside compute there;
profiler traces show it). On host tensors (no such kernel ships for CPU; a test registers one)
a call blocks and is timed like any blocking collective.

On CUDA with NCCL the host only sees enqueueing and waiting, not the transfer on the GPU; the
report says so, and torch.profiler traces give the device view.
"""

from __future__ import annotations

import inspect
import sys
import threading

# group_name and members are this module's too: the recorder and knobs.py read them here
from .groups import forget, funcol_group_name, group_name, members, registered_name  # noqa: F401


#: torch.distributed function -> kind of collective
KINDS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "send", "recv": "recv", "isend": "send", "irecv": "recv",
    "batch_isend_irecv": "send_recv", "barrier": "barrier", "monitored_barrier": "barrier",
}

#: torch.distributed._functional_collectives: the prefix of a public function's name -> kind
#: (DTensor, TP / SP / CP, experts). Found by name in the loaded module, so that the functions a
#: release adds (2.13's all_gather_single, reduce_scatter_single, their _autograd and _coalesced
#: forms) are timed without a list to keep up; their helpers (_backward, _setup_context) are not
FUNCOL_PREFIXES = (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                   ("reduce_scatter", "reduce_scatter"), ("all_to_all", "all_to_all"),
                   ("broadcast", "broadcast"), ("permute_tensor", "send_recv"))
FUNCOL_HELPERS = ("_backward", "_setup_context", "_meta")


def funcol_kinds(funcol) -> dict[str, str]:
    """{function name: kind} of the functional collectives `funcol` defines."""
    out = {}
    for name, fn in vars(funcol).items():
        if name.startswith("_") or name.endswith(FUNCOL_HELPERS) or not callable(fn):
            continue
        if getattr(fn, "__module__", None) != funcol.__name__ and not getattr(fn, "_gpuscope", 0):
            continue  # imported into it, not one of its collectives
        for prefix, kind in FUNCOL_PREFIXES:
            if name.startswith(prefix):
                out[name] = kind
                break
    return out


FUNCOL = "torch.distributed._functional_collectives"

_tls = threading.local()
_lock = threading.Lock()
_timers: list = []          # active CollectiveTimers (the wrappers report to the newest)
_originals: dict = {}       # (module, name) -> original function, while wrappers are installed


class quiet:
    """Collectives issued inside this block are not counted (DDP's comm hook times its own)."""

    def __enter__(self):
        _tls.depth = getattr(_tls, "depth", 0) + 1

    def __exit__(self, *exc):
        _tls.depth -= 1
        return False


def _active_timer():
    return _timers[-1] if _timers and not getattr(_tls, "depth", 0) else None


def _param_index(fn, name: str) -> int:
    try:
        return list(inspect.signature(fn).parameters).index(name)
    except (TypeError, ValueError):
        return -1


#: point-to-point kinds name the direction of the peer in rank order (a pipeline's previous or
#: next stage): recv_prev / recv_next / send_prev / send_next
P2P = {"send", "recv", "send_recv"}


def _global_peer(group, peer, group_peer):
    if peer is not None:
        return peer
    if group_peer is None:
        return None
    try:
        import torch.distributed as dist

        return dist.get_global_rank(group, group_peer) if group is not None else group_peer
    except Exception:
        return None


def _direction(peer) -> str:
    try:
        import torch.distributed as dist

        return "next" if peer > dist.get_rank() else "prev"
    except Exception:
        return "peer"


def _p2p_key(kind: str, args, kwargs, peer_index: int, group) -> str:
    """"recv_prev:3", "send_next:1", ...: a point-to-point call's key names the peer's side in
    rank order (a pipeline's previous or next stage) and the peer's global rank."""
    if kind == "send_recv":  # batch_isend_irecv([P2POp, ...]): named by what it receives
        ops = args[0] if args else kwargs.get("p2p_op_list", [])
        recvs = [op for op in ops if "recv" in getattr(op.op, "__name__", "")]
        op = (recvs or list(ops) or [None])[0]
        if op is None:
            return f"{kind}:?"
        peer = _global_peer(getattr(op, "group", None), getattr(op, "peer", None),
                            getattr(op, "group_peer", None))
        kind = "recv" if recvs else "send"
    else:
        name = "dst" if kind == "send" else "src"
        peer = kwargs.get(name, args[peer_index] if 0 <= peer_index < len(args) else None)
        peer = _global_peer(group, peer, kwargs.get(f"group_{name}"))
    return f"{kind}_{_direction(peer)}:{peer}" if peer is not None else f"{kind}:?"


def _wrap(name: str, fn):
    kind = KINDS[name]
    gi = _param_index(fn, "group")
    pi = _param_index(fn, "dst" if kind == "send" else "src")

    p2p = kind in P2P

    def timed_c10d(*args, **kwargs):
        tls = _tls
        depth = getattr(tls, "depth", 0)
        if depth or not _timers:
            return fn(*args, **kwargs)
        timer = _timers[-1]
        group = kwargs.get("group", args[gi] if 0 <= gi < len(args) else None)
        what = _p2p_key(kind, args, kwargs, pi, group) if p2p else kind
        now = timer.now
        t0 = now()
        tls.depth = 1
        try:
            out = fn(*args, **kwargs)
        finally:
            tls.depth = 0
        timer.issued(what, group, t0, now(), out)
        if rows is not None:
            _count_rows(timer, rows, args, kwargs)
        return out

    rows = _a2a_rows_c10d if name == "all_to_all_single" else None
    return _ours(timed_c10d, fn, name)


def _count_rows(timer, rows, args, kwargs) -> None:
    """Hand the timer the rows an all-to-all delivered; whatever goes wrong in counting them
    (an argument of a shape we do not know) costs the count, never the training."""
    on_rows = timer.on_rows
    if on_rows is not None:
        try:
            on_rows(rows(args, kwargs))
        except Exception:
            pass


def _rows(x) -> int:
    """The first dimension of a tensor (tokens, for an expert layer's all-to-all); -1 if none."""
    shape = getattr(x, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else -1


def _a2a_rows_c10d(args, kwargs) -> int:
    """Rows this rank received: torch.distributed.all_to_all_single(output, input, ...)."""
    return _rows(kwargs.get("output", args[0] if args else None))


def _a2a_rows_funcol(args, kwargs) -> int:
    """Rows this rank received: funcol.all_to_all_single(self, output_split_sizes, ...), the
    sum of the output splits, or all of the input's rows when there are none (even splits)."""
    splits = kwargs.get("output_split_sizes", args[1] if len(args) > 1 else None)
    if splits is not None:
        try:
            return int(sum(int(n) for n in splits))
        except (TypeError, ValueError):
            return -1
    return _rows(kwargs.get("self", args[0] if args else None))


def _ours(wrapper, fn, name: str):
    """Mark `wrapper` as gpuscope's timing wrapper of `fn` (restored at detach)."""
    wrapper.__wrapped__ = fn
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper._gpuscope = True
    return wrapper


def _wrap_blocking(fn, report: str, name: str):
    """A call that blocks on a collective (Work.wait, funcol's wait_tensor): its first argument
    and the time it blocked go to the timer's method `report`; nothing under torch.compile."""
    def blocking(first, *args, **kwargs):
        timer = _active_timer()
        if timer is None or _compiling():
            inner = getattr(_tls, "waits", None)
            if inner is None or timer is not None:
                return fn(first, *args, **kwargs)
            now = _tls.clock  # a wait inside a functional collective's call: handed to its
            t0 = now()  # wrapper, on its timer's clock
            try:
                return fn(first, *args, **kwargs)
            finally:
                inner.append((t0, now()))
        t0 = timer.now()
        try:
            return fn(first, *args, **kwargs)
        finally:
            getattr(timer, report)(first, t0, timer.now())

    return _ours(blocking, fn, name)


def _compiling() -> bool:
    global _is_compiling
    try:
        if _is_compiling is None:
            import torch

            _is_compiling = torch.compiler.is_compiling
        return bool(_is_compiling())
    except Exception:
        return False


_is_compiling = None  # torch.compiler.is_compiling, looked up once


def _wrap_funcol(funcol, name: str, fn, kind: str):
    gi, ti = _param_index(fn, "group"), _param_index(fn, "tag")

    def timed_funcol(*args, **kwargs):
        timer = _active_timer()
        if timer is None or _compiling():  # traced by torch.compile: nothing of ours in it
            return fn(*args, **kwargs)
        group = kwargs.get("group", args[gi] if 0 <= gi < len(args) else None)
        tag = kwargs.get("tag", args[ti] if 0 <= ti < len(args) else "")
        key = f"{kind}:{funcol_group_name(funcol, group, tag)}"
        # a gather on a dimension other than 0 waits inside the call, then concatenates the
        # chunks: the waits made inside are collected, to tell them from the call's host work
        outer, waits, clock = getattr(_tls, "waits", None), [], getattr(_tls, "clock", None)
        t0 = timer.now()
        _tls.depth = getattr(_tls, "depth", 0) + 1
        _tls.waits, _tls.clock = waits, timer.now
        try:
            out = fn(*args, **kwargs)
        finally:
            _tls.depth -= 1
            _tls.waits, _tls.clock = outer, clock
        timer.launched(key, t0, timer.now(), out, waits)
        _time_backward(timer, key, out)
        if a2a:
            _count_rows(timer, _a2a_rows_funcol, args, kwargs)
        return out

    a2a = kind == "all_to_all" and name.startswith("all_to_all_single")
    return _ours(timed_funcol, fn, name)


def _time_backward(timer, key: str, out) -> None:
    """A collective that autograd records (the _autograd forms, and since 2.13 the plain ones
    on a tensor that requires grad) has the same collective again as its backward (all-to-all
    back, an all-gather's reduce-scatter), issued inside autograd where no Python wrapper sees
    it: hooks on its autograd node time it, as a call that blocked its thread."""
    try:
        node = _collective_node(getattr(getattr(out, "elem", out), "grad_fn", None))
    except Exception:  # an autograd graph of a shape we do not know: its backward uncounted
        return
    if node is None:
        return
    start = [0]

    def before(grad_outputs):
        start[0] = timer.now()

    def after(grad_inputs, grad_outputs):
        t1 = timer.now()
        on_collective = timer.on_collective
        if on_collective is not None and start[0] and not getattr(_tls, "depth", 0):
            on_collective(key, start[0], t1, True)

    try:
        node.register_prehook(before)
        node.register_hook(after)
    except Exception:  # a node that takes no hooks: its backward stays uncounted
        pass


def _collective_node(node, depth: int = 4):
    """The autograd node of a functional collective at or just below `node` (a gather on
    another dimension ends in a cat of the gathered chunks, after its wait), or None."""
    for _ in range(depth):
        if node is None:
            return None
        name = node.name()
        if "c10d_functional" in name and "wait_tensor" not in name:
            return node  # (a wait's node sits between a cat and its gather: walked through)
        nxt = [f for f, _ in node.next_functions if f is not None]
        if len(nxt) != 1:
            return None
        node = nxt[0]
    return None


def _install_funcol() -> None:
    """The functional collectives, where they are loaded (DTensor imports them)."""
    funcol = sys.modules.get(FUNCOL)
    if funcol is None:
        return
    for name, kind in funcol_kinds(funcol).items():
        fn = getattr(funcol, name, None)
        if fn is None or getattr(fn, "_gpuscope", False):
            continue
        _originals[(funcol, name)] = fn
        setattr(funcol, name, _wrap_funcol(funcol, name, fn, kind))
    wait = getattr(funcol, "wait_tensor", None)
    if wait is not None and not getattr(wait, "_gpuscope", False):
        _originals[(funcol, "wait_tensor")] = wait
        funcol.wait_tensor = _wrap_blocking(wait, "tensor_waited", "wait_tensor")


SYMM_MEM_MODULE = "torch.distributed._symmetric_memory"

#: symmetric-memory ops: a part of the op's name -> kind; only ops that take a group
#: (`group_name`) are collectives of one, the rest (put / get / signals) are left alone
SYMM_MEM_KINDS = (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                  ("reduce_scatter", "reduce_scatter"), ("all_to_all", "all_to_all"),
                  ("broadcast", "broadcast"), ("reduce", "reduce"))


def symm_mem_kinds(op_names, group_index) -> dict[str, tuple[str, int]]:
    """{op name: (kind, index of its group_name argument)} of the group collectives among
    `op_names` ("symm_mem::one_shot_all_reduce", ...); `group_index(name)` gives the argument's
    index, or -1 when the op takes no group."""
    out = {}
    for full in op_names:
        ns, _, name = full.partition("::")
        if ns != "symm_mem":
            continue
        kind = next((k for part, k in SYMM_MEM_KINDS if part in name), None)
        if kind is None:
            continue
        gi = group_index(name)
        if gi >= 0:
            out[name] = (kind, gi)
    return out


class SymmMemOp:
    """A torch.ops.symm_mem op packet behind a timing call; every attribute is the packet's."""

    _gpuscope = True

    def __init__(self, packet, kind: str, group_index: int):
        self.__wrapped__ = packet
        self._kind, self._gi = kind, group_index

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)

    def __call__(self, *args, **kwargs):
        timer = _active_timer()
        if timer is None or _compiling():
            return self.__wrapped__(*args, **kwargs)
        gi = self._gi
        group = kwargs.get("group_name", args[gi] if gi < len(args) else None)
        t0 = timer.now()
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            out = self.__wrapped__(*args, **kwargs)
        finally:
            _tls.depth -= 1
        try:
            key = f"{self._kind}:{registered_name(group)}"
            on_device = on_gpu(args[0] if args else kwargs.get("input"))
        except Exception:  # an argument of a shape we do not know: this call uncounted
            return out
        timer.symm_mem(key, t0, timer.now(), on_device)
        return out


def on_gpu(x) -> bool:
    """Whether a symmetric-memory op's input lives on a GPU (the op then runs on its stream)."""
    return bool(getattr(x, "is_cuda", False))


def _install_symm_mem() -> None:
    """The symmetric-memory ops, where symmetric memory is loaded (a program that allocates
    symmetric buffers imports torch.distributed._symmetric_memory to do it)."""
    if SYMM_MEM_MODULE not in sys.modules:
        return
    import torch

    ns = torch.ops.symm_mem

    def group_index(name: str) -> int:
        try:
            args = [a.name for a in getattr(ns, name).default._schema.arguments]
        except Exception:
            return -1
        return args.index("group_name") if "group_name" in args else -1

    for name, (kind, gi) in symm_mem_kinds(torch._C._dispatch_get_all_op_names(),
                                           group_index).items():
        packet = getattr(ns, name, None)
        if packet is None or getattr(packet, "_gpuscope", False):
            continue
        _originals[(ns, name)] = packet
        setattr(ns, name, SymmMemOp(packet, kind, gi))


def _install() -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name in KINDS:
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "_gpuscope", False):
            continue
        wrapped = _wrap(name, fn)
        for module in (c10d, dist):
            if getattr(module, name, None) is fn:
                _originals[(module, name)] = fn
                setattr(module, name, wrapped)
    work = getattr(c10d, "Work", None)
    if work is not None and not getattr(work.wait, "_gpuscope", False):
        _originals[(work, "wait")] = work.wait
        work.wait = _wrap_blocking(work.wait, "waited", "wait")
    _install_funcol()
    _install_symm_mem()


def _restore() -> None:
    forget()  # a later recording may see other groups behind the same objects
    for (owner, name), fn in _originals.items():
        current = getattr(owner, name, None)
        if getattr(current, "__wrapped__", None) is fn:  # ours, not patched over by someone else
            setattr(owner, name, fn)
    _originals.clear()


def untimed_on_stream(calls: dict[str, int], steps: int) -> str:
    """The end record's line for symmetric-memory collectives launched on a GPU stream."""
    what = ", ".join(f"{key} x{n}" for key, n in sorted(calls.items(), key=lambda kv: -kv[1])[:6])
    return (f"symmetric-memory collectives ran on the GPU's stream in {steps} step(s) ({what}): "
            "the recorder saw their launches, not their transfer, which is counted as compute "
            "here; torch.profiler traces time them")


class CollectiveTimer:
    """Reports collectives to `on_collective(key, launch_ns, done_ns, blocked)`, blocked waits to
    `on_wait(key, t0, t1)`, key = "kind:group", and the rows each all_to_all_single delivered
    to this rank to `on_rows(rows)`, from the moment it is attached until detach(); times are
    `now()`'s, the recorder's clock."""

    def __init__(self, on_collective, on_wait, on_rows=None, *, now):
        self.on_collective = on_collective
        self.on_wait = on_wait
        #: the recorder's clock (integer ns): every time this timer takes is read from it
        self.now = now
        #: rows an all_to_all_single delivered to this rank (an expert layer's tokens)
        self.on_rows = on_rows
        self.active = False
        self.reason = ""
        self._pending: dict = {}  # id(work) -> kind, for waits on an async collective
        #: functional collectives in flight, oldest first: (key, launch). Waits take the oldest:
        #: the tensor a wait is handed is not the one the launch returned (a custom op between)
        self._inflight: list = []
        #: symmetric-memory collectives launched on a GPU stream: key -> calls (untimed)
        self.on_stream: dict[str, int] = {}

    def attach(self) -> bool:
        if "torch" not in sys.modules:
            return False
        try:
            import torch.distributed as dist

            if not dist.is_available():
                return False
            with _lock:
                if not _timers:
                    _install()
                _timers.append(self)
            self.active = True
        except Exception as exc:  # an unexpected torch layout: no timing, training unaffected
            self.reason = f"collective timing off ({exc!r})"
        return self.active

    def detach(self) -> None:
        if not self.active:
            return
        self.active = False
        with _lock:
            if self in _timers:
                _timers.remove(self)
            if not _timers:
                _restore()
        self.on_collective = self.on_wait = self.on_rows = None
        self._pending.clear()
        self._inflight.clear()

    # called by the wrappers, on whatever thread issued the collective
    def issued(self, kind: str, group, t0: int, t1: int, out) -> None:
        on_collective = self.on_collective
        if on_collective is None:
            return
        key = kind if ":" in kind else f"{kind}:{group_name(group)}"  # p2p keys name the peer
        works = [] if out is None else [w for w in (out if isinstance(out, list) else [out])
                                        if hasattr(w, "get_future")]
        if not works:  # a blocking call (async_op=False, or no Work): all of it exposed
            on_collective(key, t0, t1, True)
            return
        if len(self._pending) > 8192:  # works nobody waited on
            self._pending.clear()
        for w in works:
            self._pending[id(w)] = key
            try:
                w.get_future().then(lambda f: self._done(key, t0))
            except Exception:  # no future on this backend: the launch is all we know
                on_collective(key, t0, t1, False)

    def launched(self, key: str, t0: int, t1: int, out, waits=()) -> None:
        """A functional collective returned `out`: a tensor that waits when first used (its
        wait is timed by wait_tensor), or one already complete: the call waited inside (`waits`,
        the blocked spans; the rest of the call, its launch and what it did with the result,
        is host work as on the asynchronous path), or it blocked in a way not seen (all of it)."""
        on_collective = self.on_collective
        if on_collective is None:
            return
        if not hasattr(out, "trigger_wait"):  # not an AsyncCollectiveTensor: it has completed
            if not waits:
                on_collective(key, t0, t1, True)
                return
            on_collective(key, waits[0][0], waits[-1][1], False)
            on_wait = self.on_wait
            if on_wait is not None:
                for w0, w1 in waits:
                    on_wait(key, w0, w1)
            return
        if len(self._inflight) > 8192:  # launches nobody waited on
            self._inflight.clear()
        # in flight from the end of the call, when it is queued: the call itself is the host's
        # launch work (DTensor's bookkeeping, buffers), as a trace's c10d launch ranges are
        self._inflight.append((key, t1))

    def tensor_waited(self, tensor, t0: int, t1: int) -> None:
        if not self._inflight:
            return
        key, launch = self._inflight.pop(0)
        on_collective, on_wait = self.on_collective, self.on_wait
        if on_collective is not None:
            on_collective(key, launch, t1, False)  # done by the end of its wait at the latest
        if on_wait is not None:
            on_wait(key, t0, t1)

    def symm_mem(self, key: str, t0: int, t1: int, on_device: bool) -> None:
        """A symmetric-memory collective: a host call blocked for all of it; a launch on a GPU
        stream is counted (its transfer happens on the device, after the call returned)."""
        if on_device:
            if len(self.on_stream) < 256 or key in self.on_stream:
                self.on_stream[key] = self.on_stream.get(key, 0) + 1
            return
        on_collective = self.on_collective
        if on_collective is not None:
            on_collective(key, t0, t1, True)

    def _done(self, key: str, t0: int) -> None:
        on_collective = self.on_collective
        if on_collective is not None:
            on_collective(key, t0, self.now(), False)

    def waited(self, work, t0: int, t1: int) -> None:
        on_wait = self.on_wait
        key = self._pending.pop(id(work), None)
        if on_wait is not None and key is not None:
            on_wait(key, t0, t1)
