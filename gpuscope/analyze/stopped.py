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

from ..runtable import RunTable


def _why(end) -> str:
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


def stopped_ranks(table: RunTable) -> tuple[list[dict], list[int]]:
    """([{rank, last_step, others_reached, reason}], ranks with no data) for recorded runs.

    A rank stopped early when its last recorded step is before the others' last; in a
    synchronous job the others cannot go further than the dead rank, so, all being cut at the
    same step, the ranks that died of their own (no end record, or an error of their own) are
    told from those that then failed waiting on them (a collective error on a lost peer, or the
    launcher's SIGTERM)."""
    if table.source != "record":
        return [], []
    frame = table.frame
    last = frame.groupby("rank")["step"].max().to_dict() if len(frame) else {}
    ends = {r: info.meta.get("end") for r, info in table.ranks.items()}
    cut = {r: _why(e) for r, e in ends.items() if _why(e)}
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
            out.append({"rank": int(rank), "last_step": int(mine), "others_reached": int(reach),
                        "reason": why})
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


def stopped_warnings(stopped: list[dict]) -> list[str]:
    return [f"rank {s['rank']} stopped first: its last recorded step is {s['last_step']}; the "
            f"other ranks recorded up to step {s['others_reached']} ({s['reason']})"
            for s in stopped]


def died_in(end, last: int | None) -> int | None:
    """The step (numbered from 0, as every step in a report) a rank's training died in: the
    one after the steps its end record says completed, else after its last recorded step."""
    n = end.get("steps") if isinstance(end, dict) else None
    if isinstance(n, int) and n >= 0:
        return n
    return None if last is None else int(last) + 1


def completed(step: int | None) -> str:
    """" (steps 0-N completed)" after the step a rank died in ("" for its first, or unknown)."""
    return f" (steps 0-{step - 1} completed)" if step else ""


def deaths(table: RunTable, stopped: list[dict], memory, last: dict) -> list[dict]:
    """How the run died, where it did: the ranks whose training ended by their own error or a
    kill (not by waiting on a lost peer), each with the step it died in (numbered from 0, as
    every step in a report: died_in), first the one that died first; `last`: each rank's last
    recorded step. An out-of-memory death carries the memory section's post-mortem (what was asked,
    what was held, of what capacity). [] for a run that ended cleanly, or whose every rank was
    stopped by a launcher at once (a time limit: nobody died first)."""
    if table.source != "record":
        return []
    ooms = {f["ranks"][0]: f for f in (memory.of_kind("out_of_memory") if memory else [])}
    first = {s["rank"] for s in stopped}
    # where the ranks that failed on a lost peer were: the collective its death broke
    broken = [_place(info.meta.get("end"), frame=True) for info in table.ranks.values()
              if failed_on_a_peer(info.meta.get("end"))]
    broken = next((b for b in broken if b), None)
    out = []
    for rank, info in sorted(table.ranks.items()):
        end = info.meta.get("end")
        why = _why(end)
        if not why or failed_on_a_peer(end):
            continue
        mine = last.get(rank)
        killed = _killed(end)
        step = None if killed else died_in(end, mine)
        if rank in ooms:
            cause, text = "out_of_memory", ooms[rank]["text"]
        elif killed:
            cause = "killed"
            when = (f"after its last recorded step {mine}" if mine is not None else
                    "before any of its steps reached its file (rows are written every "
                    f"{_flush_rows(info)} steps or {_flush_s(info)} s)")
            peers = max((died_in(i.meta.get("end"), last.get(r)) or 0
                         for r, i in table.ranks.items() if r != rank), default=None)
            text = (f"rank {rank} was killed {when} (no end record: SIGKILL, the OOM killer or "
                    "a lost node; its last rows may not have been written)"
                    + (f"; the other ranks were in step {peers}, {broken}, when it went"
                       if broken else ""))
        else:
            cause = "exception"
            err = str(end.get("error") or "").splitlines()
            text = (f"rank {rank}'s training raised in step {step}" + completed(step)
                    + (f": {err[0][:200]}" if err else ""))
            place = _place(end, frame=True)
            if place:
                text += f" ({place})"
        out.append({"rank": int(rank), "step": step, "last_step": None if mine is None
                    else int(mine), "cause": cause, "first": rank in first or not stopped,
                    "text": text})
    out.sort(key=lambda d: (not d["first"], d["last_step"] if d["last_step"] is not None
                            else -1, d["rank"]))
    return out


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
        from ..stall_story import _at

        at = _at(w)
        text += f", at {at}" if at else ""
    return text
