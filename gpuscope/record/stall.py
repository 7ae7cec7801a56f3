"""Notices, from a thread of the recorder's own, that steps stopped coming: a rank blocked in a
collective its peers never join, a stuck loader, a lock, a filesystem. The training thread does
nothing for it: the watcher reads what the training thread already keeps (the step count, when
the current micro-step began, the forward / backward / optimizer flags of its event log) and the
training thread's Python stack (sys._current_frames), every PERIOD_S.

- Rows a stalled run made are written once they are `flush_s` old (the recorder's `idle_flush`),
  so a run killed while it hangs keeps every step it made.
- After `bound` seconds without a step ending (stall_s, else max(MIN_BOUND_S, FACTOR x the
  median step)), one `stall` record: the step, what the training thread is in (a collective:
  its kind, group and sequence number on that group; a data fetch; forward, backward, the
  optimizer; between steps), since when, the stack, and each group's sequence number (how many
  collectives this rank issued on it); torch's Flight Recorder is dumped beside the record
  where it records. When steps resume, a `stall_end` record says how long it lasted.
- In a job of several ranks, the ranks' watchers leave their stall in the job's store and rank
  0's logs who waits where and who is missing, then whether steps resumed (stall_exchange.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import sysconfig
import threading

#: how often the watcher looks (seconds): a stall is noticed within bound + PERIOD_S
PERIOD_S = 0.5
#: the bound when none is given: at least this, or FACTOR x the median step; short enough that the
#: live word of a hang (stall_exchange.py) comes before a launcher's or a collective's timeout
#: (NCCL's is 10 min); a longer pause (a checkpoint) is told as one when steps resume
MIN_BOUND_S = 10.0
FACTOR = 20
#: before the run's second step ended (compiling, warming up) the bound is at least this
FIRST_STEPS_BOUND_S = 300.0
#: a SIGTERM the training thread has not taken after this long is taken by the watcher
SIGTERM_GRACE_S = 1.0
#: frames of the stack kept (the innermost)
MAX_FRAMES = 32


def _lib_dirs() -> tuple[str, ...]:
    """Where library code lives (the standard library, site-packages): not the user's."""
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(os.path.realpath(sysconfig.get_paths()[key]))
        except Exception:
            pass
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the gpuscope package
    dirs.add(here)
    return tuple(sorted(dirs))


_LIBS: tuple[str, ...] | None = None


def is_user_file(path: str) -> bool:
    """A frame of the user's code: not the standard library, an installed package or gpuscope."""
    global _LIBS
    if _LIBS is None:
        _LIBS = _lib_dirs()
    if not path or path.startswith("<"):
        return False
    real = os.path.realpath(path)
    return not any(real == d or real.startswith(d + os.sep) for d in _LIBS)


def stack_of(frame) -> list[dict]:
    """The frames from `frame` outwards, innermost first: file, line, function, whether the
    user's code (MAX_FRAMES at most)."""
    out = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        out.append({"file": code.co_filename, "line": frame.f_lineno, "func": code.co_name,
                    "user": is_user_file(code.co_filename)})
        frame = frame.f_back
    return out


def _sizes(args) -> list:
    """The shapes of the tensors among a collective's first arguments (a list's first one)."""
    out = []
    for a in list(args)[:3]:
        if isinstance(a, (list, tuple)) and a:
            a = a[0]
        shape = getattr(a, "shape", None)
        if shape is not None:
            try:
                out.append([int(n) for n in shape])
            except Exception:
                pass
    return out


def group_seq(group) -> int | None:
    """How many collectives this rank issued on `group` (None: the default group), torch's own
    count (the Flight Recorder's collective_seq_id); None where torch does not say."""
    try:
        import torch.distributed as dist

        if group is None:
            group = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())
    except Exception:
        return None


def sequence_numbers() -> dict[str, int]:
    """{group name: collectives this rank issued on it} for the default group and the groups
    the recorder saw."""
    out = {}
    if "torch.distributed" not in sys.modules:  # never imported here (a signal handler runs it)
        return {}
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return {}
        from .groups import group_name

        groups = [None] + [g for g in getattr(dist.distributed_c10d._world, "pg_names", {})
                           if g is not dist.distributed_c10d._get_default_group()]
        for g in groups[:64]:
            n = group_seq(g)
            if n is not None:
                out[group_name(g)] = n
    except Exception:
        pass
    return out


def where(log, frame, codes: dict, unix) -> dict:
    """What the training thread is in, from its innermost `frame` and its event log `log`
    (events.StepLog): {"in": collective | wait | data | forward | backward | optimizer |
    between steps, "since_unix_ns" where known, the stack, and for a collective its kind,
    group, sizes and sequence number}. A collective's wrapper on the stack decides (its own
    wait is inside it), else the innermost of the recorder's wrappers (`codes`: {code object:
    collective | wait | data | forward | backward}); else the log's flags.
    `unix`: the recorder's clock to unix ns."""
    out: dict = {"stack": stack_of(frame)}
    found = []  # the recorder's wrappers on the stack, innermost first
    f = frame
    while f is not None:
        if f.f_code in codes:
            found.append(f)
        f = f.f_back
    # a collective's own wait (a blocking call waits inside) is the collective's
    coll = [f for f in found if codes[f.f_code] == "collective"]
    for f in coll[-1:] or found[:1]:
        what = codes.get(f.f_code)
        if what is not None:
            loc = f.f_locals
            out["in"] = what
            if what == "collective":
                from .groups import group_name

                group = loc.get("group")
                out.update({"kind": str(loc.get("what") or "?").split(":")[0],
                            "group": group_name(group),
                            "sizes": _sizes(loc.get("args") or ())})
                seq = group_seq(group)
                if seq is not None:
                    out["seq"] = seq
            t0 = loc.get("t0")
            if isinstance(t0, int):
                out["since_unix_ns"] = unix(t0)
            return out
    if log.fwd_t0 is not None:
        out["in"], t0 = "forward", log.fwd_t0
    elif log.in_backward:
        out["in"], t0 = "backward", None
    elif log.opt_t0 is not None:
        out["in"], t0 = "optimizer", log.opt_t0
    elif log.phases:  # the step's work began: after its last part
        out["in"], t0 = f"after {log.phases[-1][0]}", log.phases[-1][2]
    else:
        out["in"], t0 = "between steps", None
    if t0 is not None:
        out["since_unix_ns"] = unix(t0)
    return out


class StallWatch:
    """The watcher thread of one recording. `rec` is the Recorder: read, never waited on."""

    def __init__(self, rec, bound_s: float | None, flush_s: float, codes: dict,
                 exchange=None, period_s: float = PERIOD_S):
        self.rec = rec
        self.given_s = bound_s
        self.flush_ns = int(flush_s * 1e9)
        self.codes = codes
        self.exchange = exchange  # stall_exchange.Exchange in a job of several ranks
        self.period_s = period_s
        self.ident = threading.get_ident()  # the training thread: the one that starts it
        self.stalled: dict | None = None
        self.stalls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen = (None, None)   # (steps, clock) at the last look that saw steps move
        self._rates: list[float] = []  # mean ns a step between looks that saw steps move
        self.error: str | None = None
        self._sigterm_at: int | None = None  # when a SIGTERM was seen to come

    def start(self) -> "StallWatch":
        self._thread = threading.Thread(target=self._run, name="gpuscope-stall-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The recording ends: the thread goes; a stall the steps came back from says so."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(2.0)
        if self.stalled is not None and self.rec.steps > self.stalled["step"]:
            try:
                self._ended(self.rec.clock())
            except Exception:
                pass

    def bound_ns(self) -> int:
        if self.given_s is not None:
            return int(self.given_s * 1e9)
        if self.rec.steps < 2 or not self._rates:
            return int(FIRST_STEPS_BOUND_S * 1e9)
        return int(max(MIN_BOUND_S * 1e9, FACTOR * statistics.median(self._rates)))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.look()
            except Exception as exc:  # noqa: BLE001 - the watcher goes; training never
                self.error = f"stall watch stopped: {exc!r}"[:300]
                return

    def look(self, now: int | None = None) -> None:
        """One look: notice steps that moved, flush idle rows, notice a stall or its end."""
        rec = self.rec
        if not rec.active:
            return
        now = rec.clock() if now is None else now
        self._sigterm(now)
        steps = rec.steps
        seen_steps, seen_at = self._seen
        if steps != seen_steps:
            if seen_steps is not None and steps > seen_steps:
                self._rates.append((now - seen_at) / (steps - seen_steps))
                del self._rates[:-64]
            elif seen_steps is None and steps >= 2:  # a run that hangs in its first second:
                start, last = getattr(rec, "started", None), rec.last_step_end()
                if start is not None and last is not None and last > start:
                    self._rates.append((last - start) / steps)  # its steps so far, on average
            self._seen = (steps, now)
            if self.stalled is not None:
                self._ended(now)
        last = rec.last_step_end()
        if last is None:
            return
        idle = now - last
        if idle >= self.flush_ns:
            rec.idle_flush()
        if self.stalled is None and idle >= self.bound_ns():
            self._stalled(now, last)
        elif self.stalled is not None and self.exchange is not None:
            self.exchange.look(self.stalled)

    def _sigterm(self, now: int) -> None:
        """A SIGTERM the training thread has not taken within SIGTERM_GRACE_S (blocked in native
        code): the recording is closed from here and the process ends (rec.terminate)."""
        rec = self.rec
        if self._sigterm_at is None:
            if rec.sigterm_came():
                self._sigterm_at = now
            return
        if now - self._sigterm_at >= SIGTERM_GRACE_S * 1e9 and rec.sigterm_unhandled():
            rec.terminate(sys._current_frames().get(self.ident))

    def _stalled(self, now: int, last: int) -> None:
        rec = self.rec
        frame = sys._current_frames().get(self.ident)
        state = where(rec.log, frame, self.codes, rec.unix)
        state.setdefault("since_unix_ns", rec.unix(last))
        stall = {"step": rec.steps, "noticed_unix_ns": rec.unix(now),
                 "last_step_end_unix_ns": rec.unix(last), "bound_s": self.bound_ns() / 1e9,
                 **state, "seq": state.get("seq"), "groups": sequence_numbers()}
        if stall["seq"] is None:
            del stall["seq"]
        fr = rec.dump_flight_recorder()
        if fr:
            stall["flight_recorder"] = fr
            oldest = (fr.get("pending") or [None])[0]
            if oldest is not None and "kind" not in stall:
                # the collective it waits on was issued where the recorder does not wrap
                # (DDP's reducer, FSDP's hooks, NCCL's stream that a host sync waits on): the
                # Flight Recorder knows it; the oldest not completed (those issued after it
                # are queued behind it)
                stall.update(waits_on={k: oldest[k] for k in ("kind", "group", "seq", "sizes")})
        self.stalled = stall
        self.stalls += 1
        rec.write_side({"stall": stall})
        if self.exchange is not None:
            self.exchange.said(stall)

    def _ended(self, now: int) -> None:
        stall, self.stalled = self.stalled, None
        lasted = (self.rec.unix(now) - stall["since_unix_ns"]) / 1e9
        self.rec.write_side({"stall_end": {"step": stall["step"], "resumed_unix_ns":
                                           self.rec.unix(now), "lasted_s": round(lasted, 3)}})
        if self.exchange is not None:
            self.exchange.resumed(stall)


def _inner_code(fn, name: str):
    """The code object of the function `name` defined inside `fn`."""
    for c in getattr(fn, "__code__", fn).co_consts:
        if getattr(c, "co_name", None) == name:
            return c
    return None


def wrapper_codes(data_code=None) -> dict:
    """{code object: what a frame of it on the training thread's stack means}: the recorder's
    wrappers around collectives, their waits, the data iterator (`data_code`, the recorder's),
    the model's forward and backward."""
    from . import collectives
    from .events import StepLog

    pairs = [(_inner_code(collectives._wrap, "timed_c10d"), "collective"),
             (_inner_code(collectives._wrap_funcol, "timed_funcol"), "collective"),
             (_inner_code(collectives._wrap_blocking, "blocking"), "wait"),
             (data_code, "data"),
             (_inner_code(StepLog.time_forward, "timed_forward"), "forward"),
             (StepLog.timed_backward.__code__, "backward")]
    return {c: what for c, what in pairs if c is not None}


from ..stall_story import fr_group, fr_kind  # noqa: E402 - beside their one use


def dump_flight_recorder(record_path: str | None, when: str = "stall") -> dict | None:
    """torch's Flight Recorder (it keeps its entries where TORCH_FR_BUFFER_SIZE, or
    TORCH_NCCL_TRACE_BUFFER_SIZE, is set, and for gloo by default in recent torch), as JSON
    beside the record file (rank-N.gpuscope.fr.json), with what torch's dump leaves out under
    `gpuscope`: this process's rank and the members of each of its groups (gloo's pg_config has
    none), and `when` it was taken (at the stall, or at a SIGTERM): {"file", "entries",
    "pending": the collectives it entered and has not retired}; None where it holds nothing or
    cannot be had."""
    if record_path is None or "torch.distributed" not in sys.modules:
        return None
    try:
        import json

        from torch._C._distributed_c10d import _dump_fr_trace_json

        from ..run_format import FR_SUFFIX, beside

        doc = json.loads(_dump_fr_trace_json())
        entries = doc.get("entries") or []
        if not entries and not doc.get("pg_status"):
            return None
        doc["gpuscope"] = {**_whoami(), "when": when}
        path = beside(record_path, FR_SUFFIX)
        # at a SIGTERM or an error a peer that exited first may have failed this rank's
        # collectives, which then read as completed: a dump taken at the stall is kept
        if when == "stall" or not os.path.exists(path):
            with open(path, "w") as fh:
                json.dump(doc, fh)
        return {"file": os.path.basename(path), "entries": len(entries),
                "pending": pending_entries(entries), "last": _last_entry(entries)}
    except Exception:
        return None


def _whoami() -> dict:
    """{"rank", "groups": {name: {"desc", "ranks"}}} of this process, from torch.distributed."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    groups = {}
    for pg, name in list(c10d._world.pg_names.items()):
        try:
            groups[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""),
                                 "ranks": [int(r) for r in dist.get_process_group_ranks(pg)]}
        except Exception:
            continue
    return {"rank": dist.get_rank(), "groups": groups}


def _last_entry(entries: list) -> dict | None:
    """The last collective the rank issued: seq, kind, group, sizes."""
    for e in reversed(entries):
        if isinstance(e, dict) and not e.get("is_p2p"):
            return {"seq": e.get("collective_seq_id"), "kind": fr_kind(e), "group": fr_group(e),
                    "sizes": e.get("input_sizes")}
    return None


def pending_entries(entries: list, most: int = 8) -> list[dict]:
    """The collectives a rank entered and that had not completed (not retired, or not in state
    completed), the last `most`: seq, kind, group, sizes, state."""
    out = []
    for e in entries:
        if not isinstance(e, dict) or e.get("retired") or e.get("state") == "completed":
            continue
        seq = e.get("collective_seq_id") if not e.get("is_p2p") else e.get("p2p_seq_id")
        out.append({"seq": seq, "kind": fr_kind(e), "group": fr_group(e),
                    "sizes": e.get("input_sizes"), "state": e.get("state"),
                    **({"p2p": True} if e.get("is_p2p") else {})})
    return out[-most:]
