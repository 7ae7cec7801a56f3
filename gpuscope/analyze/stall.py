"""A stalled run, told first: which ranks wait where, which rank never came and where it was,
since when, and whether it was late before. From the stall watcher's records (record/stall.py:
each rank's `stall`, its `stall_end` when steps resumed), the end records (a rank that raised or
was killed) and the slowness report of the steps before; told by stall_story.py.
"""

from __future__ import annotations

from ..stall_story import _at, _ranks, analyse

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
                            "in": s.get("in"), "at": _at(s)})
        last, end = _unresumed(info), info.meta.get("end")
        if last is not None and _closed_cleanly(end) and end.get("end_unix_ns"):
            out.append({"rank": int(r), "step": int(last["step"]), "in": last.get("in"),
                        "at": _at(last), "until_end": True,
                        "lasted_s": round((end["end_unix_ns"] - last["since_unix_ns"]) / 1e9, 3)})
    return out


def culprits(found: dict) -> list[int]:
    """The ranks the stall points at: never reached the collective, or said nothing."""
    return sorted(set(found.get("never_reached") or []) | set(found.get("silent") or [])
                  | set(found.get("odd_ones") or []))


def late_before(report, rank: int, verb: str = "stalled") -> str:
    """Whether `rank` was late in the steps before, from the slowness report."""
    for s in report.stragglers:
        if s.rank == rank:
            word = "probably the straggler" if s.probable else "the straggler"
            n, of = s.last_in
            return (f"rank {rank} was already {word} before it {verb} ({s.excess_ns / 1e6:.1f} "
                    "ms a step busier than the median rank" + (f", last to arrive in {n} of "
                                                               f"{of} steps" if of else "") + ")")
    for m in report.minor_stragglers or ():
        if m.rank == rank:
            return (f"rank {rank} was already slightly late before it {verb} "
                    f"({m.late_ns / 1e6:.1f} ms a step, under the imbalance threshold)")
    if not report.steps or all(r.rank != rank for r in report.ranks):
        return f"no steps of rank {rank} to tell whether it was late before it {verb}"
    return f"rank {rank} was not late before it {verb}"


def _dumps(table) -> dict | None:
    """The Flight Recorder's dumps beside the records, told (analyze/hang_report.py)."""
    if not table.flight_recorder:
        return None
    from .hang_report import tell

    dumps, bad = table.flight_recorder
    return tell(dumps, bad, table.world_size)


def _from_dumps(fr: dict, report, back) -> dict:
    """A stall the recorder did not see (the job ended before `stall_s`) but the dumps show."""
    out = {"text": "stalled (Flight Recorder) " + fr["text"].splitlines()[0],
           "blamed": fr["blamed"], "flight_recorder": fr,
           "flight_recorder_text": "\n".join(fr["text"].splitlines()[1:])}
    out["late_before"] = {r: late_before(report, r) for r in fr["blamed"]}
    if back:
        out["pauses"] = back
    return out


def section(table, report) -> dict:
    """The report's `stall` section ({} when no rank stalled): analyse()'s fields, with whether
    each rank the stall points at was late before, the pauses the run came back from, and what
    the Flight Recorder's dumps beside the records say (`flight_recorder`)."""
    if table.source != "record":
        return {}
    stalls = open_stalls(table)
    back = pauses(table)
    fr = _dumps(table)
    if not stalls:
        if fr and fr["hung"]:
            return _from_dumps(fr, report, back)
        return {"pauses": back} if back else {}
    from .stopped import _why

    others = {}
    for r, info in table.ranks.items():
        if r in stalls:
            continue
        end = info.meta.get("end")
        why = _why(end)
        err = (end or {}).get("error_where") if isinstance(end, dict) else None
        at = _at(err) if isinstance(err, dict) else None
        others[int(r)] = (f"stopped: {why}" if why else "ended") + (f", at {at}" if at else "")
    for r in sorted(set(range(table.world_size)) - set(table.ranks)):
        others[r] = "has no record"
    found = analyse(stalls, table.world_size, others)
    found["blamed"] = culprits(found)
    if fr and fr["hung"]:  # the Flight Recorder's dumps beside the records
        found["flight_recorder"] = fr
        found["flight_recorder_text"] = "Flight Recorder: " + fr["text"]
    found["late_before"] = {r: late_before(report, r) for r in culprits(found)}
    plain = [r for r, t in found["late_before"].items() if t.endswith("was not late before it "
                                                                        "stalled")]
    said = [t for r, t in found["late_before"].items() if r not in plain]
    if len(plain) > 1:
        said.append(f"{_ranks(plain)} were not late before they stalled")
    elif plain:
        said.append(found["late_before"][plain[0]])
    if said:
        found["text"] += "; " + "; ".join(said)
    found["ranks"] = {int(r): {k: v for k, v in s.items() if k != "stack"} | {"at": _at(s)}
                      for r, s in stalls.items()}
    found["stacks"] = {int(r): s.get("stack") or [] for r, s in stalls.items()}
    if back:
        found["pauses"] = back
    return found
