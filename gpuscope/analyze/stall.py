"""A stalled run, told first: which ranks wait where, which rank never came and where it was,
since when, and whether it was late before. From the stall watcher's records (record/stall.py:
each rank's `stall`, its `stall_end` when steps resumed), the end records (a rank that raised or
was killed) and the slowness report of the steps before; told by stall_story.py.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..sections import Stall, load
from ..stall_story import analyse, ranks_said, said, short_error, stack_at


def _unresumed(info) -> dict | None:
    """The rank's last stall record when its steps had not resumed as the record ends (no
    stall_end at or after the stall's step)."""
    stalls = info.meta.get("stalls") or []
    if not stalls:
        return None
    last = stalls[-1]
    ends = info.meta.get("stall_ends") or []
    if any(e.get("step", -1) >= last["step"] and e.get("resumed_unix_ns", 0)
           >= last.get("noticed_unix_ns", 0) for e in ends):
        return None
    return last


def _closed_cleanly(end) -> bool:
    """The recording was stopped by the program (the loop ended, an evaluation after it): not
    a crash, a signal or a kill."""
    return isinstance(end, dict) and bool(end) and not end.get("crashed") and \
        not end.get("terminated") and not end.get("recorder_error")


def open_stalls(table) -> dict[int, dict]:
    """{rank: its last stall record} of the ranks whose steps had not resumed when the record
    ends and whose recording did not close cleanly: a recording the program closed after a
    long time without steps (an evaluation after the loop) paused, it did not hang."""
    out = {}
    for r, info in table.ranks.items():
        last = _unresumed(info)
        if last is not None and not _closed_cleanly(info.meta.get("end")):
            out[int(r)] = last
    return out


def pauses(table) -> list[dict]:
    """Stalls the run came back from (or the program closed the recording in): rank, step, how
    long, what the rank was in, where."""
    out = []
    for r, info in sorted(table.ranks.items()):
        stalls = {s["step"]: s for s in info.meta.get("stalls") or []}
        for e in info.meta.get("stall_ends") or []:
            s = stalls.get(e["step"])
            if s is not None:
                out.append({"rank": int(r), "step": int(e["step"]), "lasted_s": e.get("lasted_s"),
                            "in": s.get("in"), "at": stack_at(s)})
        last, end = _unresumed(info), info.meta.get("end")
        if last is not None and _closed_cleanly(end) and end.get("end_unix_ns"):
            out.append({"rank": int(r), "step": int(last["step"]), "in": last.get("in"),
                        "at": stack_at(last), "until_end": True,
                        "lasted_s": round((end["end_unix_ns"] - last["since_unix_ns"]) / 1e9, 3)})
    return out


def culprits(found: dict) -> list[int]:
    """The ranks the stall points at: never reached the collective, or said nothing."""
    return sorted(set(found.get("never_reached") or []) | set(found.get("silent") or [])
                  | set(found.get("odd_ones") or []))


class Before(NamedTuple):
    """Whether a rank the stall (or a death) points at was late in the steps before, from the
    slowness report: `kind` one of BEFORE_KINDS, `text` its words."""
    kind: str
    text: str


#: what a rank was before it stalled: the straggler (or probably it), slightly late, not late,
#: or no steps of it to tell
BEFORE_KINDS = ("straggler", "minor", "not_late", "unknown")


def late_before(report, rank: int, verb: str = "stalled") -> Before:
    """Whether `rank` was late in the steps before, from the slowness report."""
    for s in report.stragglers:
        if s.rank == rank:
            word = "probably the straggler" if s.probable else "the straggler"
            n, of = s.last_in
            return Before("straggler", (
                f"rank {rank} was already {word} before it {verb} ({s.excess_ns / 1e6:.1f} ms a "
                "step busier than the median rank"
                + (f", last to arrive in {n} of {of} steps" if of else "") + ")"))
    for m in report.minor_stragglers or ():
        if m.rank == rank:
            return Before("minor", f"rank {rank} was already slightly late before it {verb} "
                                   f"({m.late_ns / 1e6:.1f} ms a step, under the imbalance "
                                   "threshold)")
    if not report.steps or all(r.rank != rank for r in report.ranks):
        return Before("unknown",
                      f"no steps of rank {rank} to tell whether it was late before it {verb}")
    return Before("not_late", f"rank {rank} was not late before it {verb}")


def _dumps(table) -> dict | None:
    """The Flight Recorder's dumps beside the records, told (analyze/hang_report.py)."""
    if not table.flight_recorder:
        return None
    from .hang_report import tell

    dumps, bad = table.flight_recorder
    return tell(dumps, bad, table.world_size)


def _from_dumps(fr: dict, report, back) -> dict:
    """A stall the recorder did not see (the job ended before `stall_s`) but the dumps show."""
    out = said({"state": "from_dumps", "blamed": fr["blamed"], "flight_recorder": fr,
                "flight_recorder_text": "\n".join(fr["text"].splitlines()[1:])},
               "(Flight Recorder) " + fr["text"].splitlines()[0])
    out["late_before"] = {r: late_before(report, r).text for r in fr["blamed"]}
    if back:
        out["pauses"] = back
    return out


#: a collective's own timeout ending a rank (gloo's "Timed out waiting 12000ms for recv", NCCL's
#: watchdog)
_TIMEOUT = re.compile(r"timed? ?out|timeout|watchdog", re.IGNORECASE)
#: a SIGTERM that finds every rank this long past its last step (and at least this many of its
#: median steps) came to a job that was blocked, not working
TERM_IDLE_S, TERM_IDLE_STEPS = 2.0, 20


def _last_step_ends(table) -> dict[int, int]:
    f = table.frame
    if not len(f) or "start_ns" not in f:
        return {}
    return (f["start_ns"] + f["step_ns"]).groupby(f["rank"]).max().astype("int64").to_dict()


def term_stalls(table) -> dict[int, dict]:
    """A run a launcher stopped with SIGTERM while it was blocked, before the stall watcher's
    bound: each rank's place at the TERM (its end record's terminated_where), as a stall record.
    Blocked: a rank's recorder could not take the signal in training (blocked in native code), or
    every rank was past its last step by TERM_IDLE_S and TERM_IDLE_STEPS median steps."""
    ends = {int(r): info.meta.get("end") for r, info in table.ranks.items()}
    termed = {r: e for r, e in ends.items() if isinstance(e, dict) and e.get("terminated")
              and isinstance(e.get("terminated_where"), dict)}
    if not termed:
        return {}
    last = _last_step_ends(table)
    idle = _idle_at_term(table, termed, last)
    med = float(table.frame["step_ns"].median()) if len(table.frame) else 0.0
    if not (any(e.get("blocked") for e in termed.values()) or (
            idle and len(idle) == len(termed)
            and min(idle) >= max(TERM_IDLE_S * 1e9, TERM_IDLE_STEPS * med))):
        return {}
    out = {}
    for r, e in termed.items():
        w = dict(e["terminated_where"])
        w["step"] = e.get("steps", 0)
        if not w.get("since_unix_ns") and r in last:
            w["since_unix_ns"] = last[r]
        w["at_term"] = True
        out[r] = w
    return out


def ended(table, stalled) -> str:
    """How a stalled run ended, said after the stall: the ranks whose collective timed out
    waiting (with its message), the ranks a launcher stopped."""
    timed, termed = [], []
    for r, info in sorted(table.ranks.items()):
        end = info.meta.get("end")
        if not isinstance(end, dict) or not end:
            continue
        err = str(end.get("error") or "")
        if end.get("crashed") and _TIMEOUT.search(err):
            timed.append((int(r), short_error(err)))
        elif end.get("terminated"):
            termed.append(int(r))
    parts = []
    if timed:
        parts.append(f"then the collective timeout ended the run: {ranks_said(r for r, _ in timed)}"
                     f" timed out waiting ({timed[0][1]})")
    if termed and (timed or not all(r in stalled for r in termed)):
        parts.append(f"{ranks_said(termed)} stopped by SIGTERM")
    elif termed:
        parts.append(f"a SIGTERM stopped {'it' if len(termed) == 1 else 'them'} "
                     f"{_idle_for(table, termed)}")
    return "; ".join(parts)


def _idle_at_term(table, ranks, last: dict | None = None) -> list[int]:
    """ns from each rank's last step to the end its record says (where both are known)."""
    last = _last_step_ends(table) if last is None else last
    ends = [(r, table.ranks[r].meta["end"].get("end_unix_ns")) for r in ranks]
    return [e - last[r] for r, e in ends if r in last and isinstance(e, int)]


def _idle_for(table, ranks) -> str:
    idle = _idle_at_term(table, ranks)
    return f"{min(idle) / 1e9:.0f} s after the last step" if idle else ""


def section(table, report) -> Stall | None:
    """The report's `stall` section, typed once here (None when no rank stalled or paused)."""
    return load(Stall, _found(table, report), "stall")


def _found(table, report) -> dict:
    """The stall's fields ({} when no rank stalled): analyse()'s fields, with whether
    each rank the stall points at was late before, the pauses the run came back from, and what
    the Flight Recorder's dumps beside the records say (`flight_recorder`)."""
    if table.source != "record":
        return {}
    stalls = open_stalls(table)
    back = pauses(table)
    fr = _dumps(table)
    if not stalls:
        term = term_stalls(table)
        # where each rank was at the SIGTERM tells the stall where it names a rank; where the
        # dumps do and the snapshot does not (a record without the collectives issued), theirs
        # dumps the recorder took as its ranks exited (a SIGTERM, an error) are not a stall's:
        # what a peer's exit failed reads as completed, or as pending for ever
        fresh = fr and fr["hung"] and len(fr["dumped_at_exit"]) < fr["dumps"]
        if term and (culprits(analyse(term, table.world_size)) or not (fresh and fr["blamed"])):
            stalls = term
        elif fresh:
            return _from_dumps(fr, report, back)
        else:
            return {"pauses": back} if back else {}
    from .stopped import end_why

    others = {}
    for r, info in table.ranks.items():
        if r in stalls:
            continue
        end = info.meta.get("end")
        why = end_why(end)
        err = (end or {}).get("error_where") if isinstance(end, dict) else None
        at = stack_at(err) if isinstance(err, dict) else None
        others[int(r)] = (f"stopped: {why}" if why else "ended") + (f", at {at}" if at else "")
    for r in sorted(set(range(table.world_size)) - set(table.ranks)):
        others[r] = "has no record"
    found = analyse(stalls, table.world_size, others)
    if fr and found.get("mismatched") and not found.get("odd_ones"):
        # even parties: the dumps' history tells which call is out of the group's rhythm
        odd = next((st["odd_ones"] for st in fr["stuck_groups"]
                    if st["seq"] == found.get("seq") and st["odd_ones"]), None)
        if odd:
            found["odd_ones"] = odd
            said(found, found["story"] + (
                f" ({ranks_said(odd)} the odd one{'s' if len(odd) > 1 else ''} out: not the "
                "call the group makes there each step, as its Flight Recorder shows)"))
    found["blamed"] = culprits(found)
    if fr and fr["hung"]:  # the Flight Recorder's dumps beside the records
        found["flight_recorder"] = fr
        if fr["blamed"] == found["blamed"] or not fr["dumped_at_exit"]:
            found["flight_recorder_text"] = "Flight Recorder: " + fr["text"]
        else:  # taken as ranks exited: what a peer's exit failed reads as completed
            found["flight_recorder_text"] = (
                f"Flight Recorder: its dumps blame {ranks_said(fr['blamed']) if fr['blamed'] else 'no rank'}"
                f", but {ranks_said(fr['dumped_at_exit'])} dumped as the job ended, as peers exited "
                "(collectives their exit failed read as completed): the ranks' own records "
                "above are the story")
    before = {r: late_before(report, r) for r in culprits(found)}
    found["late_before"] = {r: b.text for r, b in before.items()}
    plain = [r for r, b in before.items() if b.kind == "not_late"]  # told once, together
    more = [b.text for r, b in before.items() if r not in plain]
    if len(plain) > 1:
        more.append(f"{ranks_said(plain)} were not late before they stalled")
    elif plain:
        more.append(before[plain[0]].text)
    how = ended(table, set(stalls))
    if how:
        found["ended"] = how
        more.append(how)
    if more:
        said(found, "; ".join([found["story"], *more]))
    found["ranks"] = {int(r): {k: v for k, v in s.items() if k != "stack"} | {"at": stack_at(s)}
                      for r, s in stalls.items()}
    found["stacks"] = {int(r): s.get("stack") or [] for r, s in stalls.items()}
    if back:
        found["pauses"] = back
    return found
