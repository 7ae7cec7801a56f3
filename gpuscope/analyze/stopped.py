"""Ranks that stopped before the others: a rank killed (SIGKILL, the OOM killer), crashed or
terminated while the rest went on, and ranks with no data at all.

A rank file without an end record was cut; one whose end says `crashed` or `terminated` ended
by an exception or a signal. Such a rank "stopped early" when its last recorded step is before
the last step any other rank recorded. A killed rank's last rows may not have reached the disk
(rows are written every `flush_rows` steps or `flush_s` seconds), so its true last step can be up
to one flush interval later than the one named. Hence, when every rank that got further was
killed too (a whole job killed at once), a lag within that interval says nothing of who stopped
first, and no one is named.
"""

from __future__ import annotations

import re

from ..sections import Death, StoppedRank
from ..runtable import RunTable
from ..stall_story import ranks_said, clock, in_step, short_error
from .rowgroups import step_by_rank


def end_why(end) -> str:
    if not isinstance(end, dict) or not end:
        return ("no end record: killed (SIGKILL, the OOM killer, a node lost) before it could "
                "close; its last rows may not have been written")
    if end.get("terminated"):
        return f"terminated by {end['terminated']} (a launcher stopping it, a preemption)"
    if end.get("crashed"):
        err = str(end.get("error") or "")
        return "training raised an exception" + (f" ({err.splitlines()[0][:160]})" if err else "")
    return ""


#: how a rank's error reads when a peer's death made its collective fail (gloo sees the sockets
#: close, NCCL's watchdog times out, c10d raises DistBackendError)
_PEER_FAILED = re.compile(r"closed by peer|reset by peer|broken pipe|timed? ?out|watchdog|"
                          r"DistBackendError|DistNetworkError|NCCL (?:error|communicator)|"
                          r"remote worker|connection refused", re.IGNORECASE)


def failed_on_a_peer(end) -> bool:
    """The rank stopped because another did: terminated by the launcher, or its collective
    failed on a lost peer."""
    if not isinstance(end, dict) or not end:
        return False
    return bool(end.get("terminated")) or bool(_PEER_FAILED.search(str(end.get("error", ""))))


def stopped_ranks(table: RunTable) -> tuple[list[StoppedRank], list[int]]:
    """(The ranks that stopped first, the ranks with no data) for recorded runs.

    A rank stopped early when its last recorded step is before the others' last; in a
    synchronous job the others cannot go further than the dead rank, so, all being cut at the
    same step, the ranks that died of their own (no end record, or an error of their own) are
    told from those that then failed waiting on them (a collective error on a lost peer, or the
    launcher's SIGTERM)."""
    if table.source != "record":
        return [], []
    frame = table.frame
    last = step_by_rank(frame, "max")
    ends = {r: info.meta.get("end") for r, info in table.ranks.items()}
    cut = {r: end_why(e) for r, e in ends.items() if end_why(e)}
    victims = {r for r in cut if failed_on_a_peer(ends[r])}
    out = []
    for rank in sorted(cut):
        mine = last.get(rank, -1)
        reach = max((s for r, s in last.items() if r != rank), default=-1)
        first = victims and rank not in victims  # the others failed because of this one
        ahead = [r for r, s in last.items() if r != rank and s > mine]
        if (not first and _killed(ends[rank]) and all(_killed(ends[r]) for r in ahead)
                and reach - mine <= _flush_rows(table.ranks[rank])):
            continue  # all killed: their unwritten rows may hold the difference
        if mine < reach or (first and mine <= reach):
            why = cut[rank] + ("; the other ranks then failed waiting on it" if first else "")
            out.append(StoppedRank(rank=int(rank), last_step=int(mine),
                                   others_reached=int(reach), reason=why))
    missing = sorted(set(range(table.world_size)) - set(table.ranks))
    return out, missing


def _killed(end) -> bool:
    """No end record: the process was killed before it could write one."""
    return not isinstance(end, dict) or not end


#: the recorder's default `flush_rows`, for records that do not say theirs (written before it
#: went into the header)
DEFAULT_FLUSH_ROWS = 16


def _flush_rows(info) -> int:
    """At most how many of a killed rank's steps may not have reached its file."""
    flush = info.meta.get("flush")
    rows = flush.get("rows") if isinstance(flush, dict) else None
    return int(rows) if isinstance(rows, int) and rows > 0 else DEFAULT_FLUSH_ROWS


def _flush_s(info) -> float:
    flush = info.meta.get("flush")
    s = flush.get("s") if isinstance(flush, dict) else None
    return s if isinstance(s, (int, float)) and s > 0 else 1.0


def stopped_warnings(stopped: list[StoppedRank]) -> list[str]:
    return [s.line() for s in stopped]


def died_in(end, last: int | None) -> int | None:
    """The step (numbered from 0, as every step in a report) a rank's training died in: the
    one after the steps its end record says completed, else after its last recorded step."""
    n = end.get("steps") if isinstance(end, dict) else None
    if isinstance(n, int) and n >= 0:
        return n
    return None if last is None else int(last) + 1


def deaths(table: RunTable, stopped: list[dict], memory, last: dict) -> list[Death]:
    """How the run died, where it did: the ranks whose training ended by their own error or a
    kill (not by waiting on a lost peer), each with the step it died in (numbered from 0, as
    every step in a report: died_in), first the one that died first (then the earliest to die);
    `last`: each rank's last recorded step. An out-of-memory death carries the memory section's
    post-mortem (what was asked, what was held, of what capacity). A rank killed before its rows
    reached its file died in the step the others then failed in, waiting on it (they completed
    every earlier step with it). [] for a run that ended cleanly, or whose every rank was
    stopped by a launcher at once (a time limit: nobody died first)."""
    if table.source != "record":
        return []
    ooms = {f["ranks"][0]: f for f in (memory.of_kind("out_of_memory") if memory else [])}
    first = {s.rank for s in stopped}
    victims = {r: info.meta.get("end") for r, info in table.ranks.items()
               if failed_on_a_peer(info.meta.get("end"))}
    # where the ranks that failed on a lost peer were: the collective its death broke
    broken = next((b for b in (_place(e, frame=True) for e in victims.values()) if b), None)
    failed_in = min((s for r, e in victims.items() if (s := died_in(e, last.get(r))) is not None),
                    default=None)
    ended = [e["end_unix_ns"] for e in victims.values() if isinstance(e.get("end_unix_ns"), int)]
    out = []
    for rank, info in sorted(table.ranks.items()):
        end = info.meta.get("end")
        if not end_why(end) or failed_on_a_peer(end):
            continue
        mine = last.get(rank)
        killed = _killed(end)
        when = None if killed else end.get("end_unix_ns")
        if killed:
            step = failed_in if failed_in is not None and (mine is None or mine < failed_in) \
                else None
        else:
            step = died_in(end, mine)
        if rank in ooms:
            cause, text = "out_of_memory", ooms[rank]["text"]
        elif killed and info.meta.get("fatal"):
            cause = "fatal_signal"
            text = _fatal_text(rank, info.meta["fatal"], step, victims)
        elif killed:
            cause, text = "killed", _killed_text(rank, info, mine, step, broken,
                                                 len(table.ranks) - 1)
        else:
            cause = "exception"
            err = short_error(end.get("error"))
            text = (f"rank {rank}'s training raised {in_step(step) or ''}"
                    + (f" at {clock(when)}" if when else "") + (f": {err}" if err else ""))
            place = _place(end, frame=True)
            if place:
                text += f" ({place})"
            after = [t - when for t in ended if when and t > when]
            if after:
                text += (f"; the other ranks failed {min(after) / 1e9:.1f}-"
                         f"{max(after) / 1e9:.1f} s later, waiting on it" if len(after) > 1 else
                         f"; the other rank failed {after[0] / 1e9:.1f} s later, waiting on it")
        out.append(Death(rank=int(rank), step=step,
                         last_step=None if mine is None else int(mine), cause=cause,
                         first=rank in first or not stopped, unix_ns=when, text=text))
    out.sort(key=lambda d: (not d.first, d.unix_ns or float("inf"),
                            d.last_step if d.last_step is not None else -1, d.rank))
    return out


#: which fatal signal means what for the training
_SIGNAL_MEANS = {"SIGABRT": "a library aborted the process, as gloo does on some collective "
                            "mismatches and NCCL on some errors",
                 "SIGSEGV": "a crash in native code"}


def _fatal_text(rank: int, fatal: dict, step, victims: dict) -> str:
    """A rank a fatal signal ended (its faulthandler trace): which, where; where it was in a
    collective at another place of the program than the others were in theirs (another kind, or
    the same kind called from another line), the mismatch first."""
    from ..stall_story import stack_at

    call, site = fatal.get("collective"), fatal.get("at")
    theirs: dict = {}  # (kind, where it was called) of each rank that failed on it
    for r, e in victims.items():
        w = e.get("error_where") or e.get("terminated_where") or {}
        last = w.get("last_issued") or {}
        kind = w.get("kind") if w.get("in") == "collective" else last.get("kind")
        if kind:
            how = w.get("in") if w.get("in") not in (None, "collective") else None
            theirs.setdefault((kind, stack_at(w), how, str(last.get("sizes") or "")),
                              []).append(int(r))
    died = (f"rank {rank} died of {fatal['signal']} ({fatal['error']}: "
            f"{_SIGNAL_MEANS.get(fatal['signal'], 'a fatal signal')}) " + (in_step(step) or ""))
    where = (f"in {call}" if call else "") + (f" at {site}" if site else "")
    if call and theirs and all((k, at) != (call, site) for k, at, _, _ in theirs):
        others = "; ".join(f"{ranks_said(rs)} in {k}" + (f" of {sz}" if sz else "")
                           + (f" from {how}" if how else "") + (f" at {at}" if at else "")
                           for (k, at, how, sz), rs in theirs.items())
        return (f"mismatched collectives: rank {rank} {where}; {others} (rank {rank} the odd "
                f"one out); {died}")
    return died + (f", {where}" if where else "")


def _killed_text(rank: int, info, mine, step, broken, n_others: int) -> str:
    """A rank killed (no end record): in which step, what its file holds, where the others were."""
    held = ("its file holds only its header: none of its steps was written (rows are written "
            f"every {_flush_rows(info)} steps or {_flush_s(info)} s)" if mine is None else
            f"its last step written: {mine}; the last rows may not have been")
    where = in_step(step) if step is not None else (
        f"after its step {mine}" if mine is not None else "before any of its steps was written")
    return (f"rank {rank} was killed {where} (no end record: SIGKILL, the OOM killer or a lost "
            f"node; {held})" + (f"; the other {'rank was' if n_others == 1 else 'ranks were'} "
                                f"{broken} when it went, and failed" if broken else ""))


def _place(end, frame: bool = False) -> str:
    """Where a rank's training was as it raised (its end record's error_where), or as the
    launcher's SIGTERM came (terminated_where): "in all_reduce #46 (default group)", or "in
    forward" with `frame`, ", at file:line (function)"."""
    w = (end.get("error_where") or end.get("terminated_where")) if isinstance(end, dict) \
        else None
    if not isinstance(w, dict):
        return ""
    if w.get("in") == "collective":
        text = f"in {w.get('kind')} #{w.get('seq')} ({w.get('group')} group)"
    elif frame and w.get("in"):
        text = w["in"] if str(w["in"]).startswith("after ") else f"in {w['in']}"
    else:
        return ""
    if frame:
        from ..stall_story import stack_at

        at = stack_at(w)
        text += f", at {at}" if at else ""
    return text
