"""How a stall is told, from the ranks' stall records (record/stall.py): who waits in which
collective, who never reached it and where, mismatched collectives, who left no word. Shared by
the analysis (analyze/stall.py) and the live line rank 0 logs (record/stall_exchange.py).

A rank's place in the collective order is how many collectives it issued on a group (torch's
sequence number, the Flight Recorder's collective_seq_id). The ranks that wait are those at the
highest number on the group the stall is on; a rank at a lower one never reached that
collective; ranks at the same number in collectives of another kind or size are mismatched,
the smaller party the odd one out.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

#: the states in which a rank waits on its peers (a collective, or work that waits on one)
WAITING = ("collective", "wait", "backward", "optimizer")


def clock(ns: int | None) -> str:
    return "?" if not ns else time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + " UTC"


def stack_at(stall: dict) -> str | None:
    """The innermost frame of the user's code on the rank's stack: file:line (function)."""
    if stall.get("at"):
        return stall["at"]
    for f in stall.get("stack") or ():
        if f.get("user"):
            return f"{os.path.basename(f['file'])}:{f['line']} ({f['func']})"
    return None


class Target(NamedTuple):
    """A collective by its group, number on that group (seq), kind and tensor sizes; for a rank
    in none, its group and how many it issued there (kind None)."""

    group: str | None
    seq: int | None
    kind: str | None
    sizes: object


@dataclass(frozen=True)
class StallRecord:
    """One rank's stall record (record/stall.py's, or its place at a SIGTERM), parsed once where
    the telling takes it in, as the Flight Recorder's EntryState wraps a dump's raw entry."""

    step: int | None            # the step it stalled in
    in_: str | None             # collective | wait | data | forward | ... | between steps
    since_unix_ns: int | None
    at: str | None              # the innermost frame of the user's code, file:line (function)
    own: Target                 # the collective it is in, as its record says (where it is in one)
    waits_on: Target | None     # the collective the work it is in waits on (Flight Recorder)
    groups: dict                # group -> collectives it issued there

    @classmethod
    def of(cls, s: dict) -> "StallRecord":
        w = s.get("waits_on")
        step = s.get("step")
        return cls(step if isinstance(step, int) else None, s.get("in"), s.get("since_unix_ns"),
                   stack_at(s), Target(s.get("group"), s.get("seq"), s.get("kind"), s.get("sizes")),
                   Target(w.get("group"), w.get("seq"), w.get("kind"), w.get("sizes"))
                   if isinstance(w, dict) else None, dict(s.get("groups") or {}))

    @property
    def target(self) -> Target:
        """The collective it is in or waits on (its group "default" where unnamed); where it is
        in none, its group and how many it issued there."""
        if self.in_ == "collective" and self.own.seq is not None:
            return self.own._replace(group=self.own.group or "default")
        w = self.waits_on
        if w is not None and w.seq is not None:
            return w._replace(group=w.group or "default")
        g = "default" if "default" in self.groups else next(iter(self.groups), "default")
        return Target(g, self.groups.get(g), None, None)

    @property
    def waits(self) -> bool:
        """It waits on its peers: in a collective, or in work that waits on one."""
        return self.target.seq is not None and (self.in_ in WAITING or self.waits_on is not None)

    def issued(self, group: str) -> int | None:
        """How many collectives it issued on `group`."""
        n = self.groups.get(group)
        if n is None:
            t = self.target
            n = t.seq if t.group == group else None
        return n


_SOURCE = re.compile(r"\[[^\]]*\.(?:cc|cpp|cu|c|h|hpp):\d+\]\s*")


def short_error(err, most: int = 200) -> str:
    """An error's first line without the C++ source location gloo and c10d put in front."""
    line = str(err or "").strip().splitlines()
    return _SOURCE.sub("", line[0])[:most] if line else ""


def in_step(n) -> str:
    """Where a rank stopped, from the steps it completed: "in step 40 (steps 0-39 completed)",
    "in step 0, its first"; "" where the record does not say."""
    if not isinstance(n, int) or n < 0:
        return ""
    return f"in step {n}" + (f" (steps 0-{n - 1} completed)" if n > 1 else
                             " (step 0 completed)" if n == 1 else ", its first")


def rank_list(rs, most: int = 12) -> str:
    """"0, 1, 4-9, 12": runs of four or more as a span; past `most` items, "... (N ranks)"."""
    rs = sorted(set(rs))
    items, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 3:
            items.append(f"{rs[i]}-{rs[j]}")
        else:
            items.extend(map(str, rs[i:j + 1]))
        i = j + 1
    if len(items) > most:
        return ", ".join(items[:most]) + f", ... ({len(rs)} ranks)"
    return ", ".join(items)


def ranks_said(rs) -> str:
    rs = sorted(set(rs))
    return ("rank " if len(rs) == 1 else "ranks ") + rank_list(rs)


def _where(s: StallRecord, step: int) -> str:
    where = s.in_ or "?"
    mine = s.step if s.step is not None else step
    if where == "collective":
        where = f"{s.own.kind} #{s.own.seq} ({s.own.group} group)"
    elif where == "between steps":
        where = f"between steps {step - 1} and {step}"
    elif where.startswith("after "):
        where = f"step {mine} after its {where[len('after '):]}"
    else:
        where = {"data": "a data fetch", "wait": "a wait on communication"}.get(where, where)
        where = f"{where} of step {mine}"
    return f"in {where} since {clock(s.since_unix_ns)}" + (f", at {s.at}" if s.at else "")


def analyse(stalls: dict[int, dict], world_size: int,
            others: dict[int, str] | None = None) -> dict:
    """The stall from each stalled rank's record: {"state" (sections.StallState's values),
    "step", "group", "seq", "kind", "waiting", "never_reached", "mismatched", "silent",
    "story", "text"}; `others`: {rank: what its end record says}
    of ranks with no open stall (raised, killed)."""
    others = dict(others or {})
    stalls = {r: StallRecord.of(s) for r, s in stalls.items()}  # parsed once, here
    step = max(s.step or 0 for s in stalls.values())
    targets = {r: s.target for r, s in stalls.items()}
    waiting = {r: targets[r] for r, s in stalls.items() if s.waits}
    out: dict = {"step": step}
    parts = []
    if waiting:
        # on the group most waiting ranks are on, the lowest collective a rank waits in: ranks
        # waiting further on went past it and wait for those still in it or behind it
        on = {}
        for t in waiting.values():
            on[t.group] = on.get(t.group, 0) + 1
        group = max(on, key=lambda g: (on[g], g == "default"))
        seq = min(t.seq for t in waiting.values() if t.group == group)
        at = {r: t for r, t in waiting.items() if t.group == group and t.seq == seq}
        ahead = {r: t for r, t in waiting.items() if t.group == group and t.seq > seq}
        kinds = {(t.kind, str(t.sizes)) for t in at.values() if t.kind is not None}
        kind = next(iter(kinds))[0] if len(kinds) == 1 else None
        # the same collective number entered as different collectives, or by a rank that is not
        # waiting in it
        odd = [r for r in stalls if r not in at and targets[r].group == group
               and targets[r].seq == seq]
        if len(kinds) > 1 or odd:
            fields, text = _mismatched(stalls, set(at) | set(odd), group, seq)
            out.update(fields)
            return _closed(out, [text], stalls, world_size, others)
        out.update(state="waiting", group=group, seq=seq, kind=kind, waiting=sorted(at))
        since = min((stalls[r].since_unix_ns or 0) for r in at) or None
        how = {stalls[r].in_ for r in at}
        shapes = {_shape(t.sizes) for t in at.values() if t.sizes}
        extra = ([shapes.pop()] if len(shapes) == 1 else []) + (
            [] if how == {"collective"} else [f"from {'/'.join(sorted(how - {'collective'}))}"])
        what = f"{kind or 'collective'} #{seq} ({', '.join([f'{group} group'] + extra)})"
        parts.append(f"{ranks_said(at)} waiting in {what} since {clock(since)}")
        behind = sorted(r for r, s in stalls.items() if r not in at and (
            s.issued(group) is None or s.issued(group) < seq))
        # of those, the ranks furthest behind hold the others: a rank that issued collectives
        # they never did cannot complete those without them (it waits on them too)
        counts = {r: stalls[r].issued(group) for r in behind}
        low = min((c for c in counts.values() if c is not None), default=None)
        between = [r for r in behind if counts[r] is not None and counts[r] > low]
        out["never_reached"] = [r for r in behind if r not in between]
        told: dict = {}  # ranks in the same place told once
        for r in out["never_reached"]:
            told.setdefault(_where(stalls[r], step), []).append(r)
        for text, rs in told.items():
            parts.append(f"{ranks_said(rs)} never reached it: {text}")
        if between:
            out["behind_them"] = between
            parts.append("; ".join(
                f"rank {r} got as far as #{counts[r]} ({_where(stalls[r], step)}): it waits on "
                f"{ranks_said(out['never_reached'])} too" for r in between))
        if ahead:
            out["past_it"] = sorted(ahead)
            further = {}
            for r, t in ahead.items():
                further.setdefault((t.seq, t.kind, stalls[r].in_), []).append(r)
            for (n, kind, how), rs in sorted(further.items()):
                parts.append(f"{ranks_said(rs)} went past it and wait{'s' if len(rs) == 1 else ''} "
                             f"in {kind or 'collective'} #{n}"
                             + (f" (from {how})" if how and how != "collective" else ""))
    else:
        out.update(state="elsewhere", never_reached=[])
        parts.append("; ".join(f"rank {r} {_where(s, step)}" for r, s in sorted(stalls.items())))
    return _closed(out, parts, stalls, world_size, others)


def _closed(out: dict, parts: list[str], stalls: dict, world_size: int, others: dict) -> dict:
    """`out` with the ranks of the world that left no stall record (`silent`), each said with
    what its end record says (`others`), and the whole told after `parts`."""
    silent = sorted(set(range(world_size)) - set(stalls))
    out["silent"] = silent
    parts = parts + [f"rank {r} " + others.get(r, "left no word (no stall record: its process "
                                                   "dead, frozen, or not recorded)")
                     for r in silent]
    return said(out, f"at step {out['step']}: " + "; ".join(parts))


def said(stall: dict, story: str) -> dict:
    """`stall` with its words: `story`, what happened ("at step 40: rank 1 waiting in ..."), as
    the report's front ends show it after their own "The run stalled:", and `text`, the same
    as one line ("stalled at step 40: ..."). Made here only: a front end shows `story` and
    never cuts `text`; more words are added by saying the longer story."""
    stall["story"] = story
    stall["text"] = f"stalled {story}"
    return stall


def _shape(sizes) -> str:
    """[[4225]] -> "[4225]"; several tensors' shapes joined."""
    if not sizes:
        return ""
    return ", ".join(str(list(x)) if isinstance(x, (list, tuple)) else str(x) for x in sizes)


def _mismatched(stalls: dict[int, StallRecord], at: set, group: str,
                seq: int) -> tuple[dict, str]:
    """(The stall's fields, its words) where ranks `at` the same collective number `seq` of
    `group` are in different collectives (kind or sizes): the smaller party is the odd one out
    (never named where the parties are even)."""
    parties: dict = {}
    for r in sorted(at):
        t = stalls[r].target
        parties.setdefault((t.kind or stalls[r].in_, _shape(t.sizes)), []).append(r)
    ordered = sorted(parties.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    odd = [] if len(ordered) > 1 and len(ordered[0][1]) == len(ordered[1][1]) else \
        sorted(r for _, rs in ordered[1:] for r in rs)
    out = dict(state="mismatched", group=group, seq=seq, kind=None, waiting=sorted(at),
               never_reached=[], mismatched={f"{k} {s}".strip(): v for (k, s), v in ordered},
               odd_ones=odd)
    since = min((stalls[r].since_unix_ns or 0) for r in at) or None
    text = (f"mismatched collectives at #{seq} on the {group} group since {clock(since)}: "
            + "; ".join(f"{ranks_said(v)} in {k}" + (f" of {s}" if s else "")
                        for (k, s), v in ordered))
    if odd:
        frames = [(f"rank {r} " if len(odd) > 1 else "") + f"at {stalls[r].at}" for r in odd
                  if stalls[r].at]
        text += f" ({ranks_said(odd)} the odd one{'s' if len(odd) > 1 else ''} out" + (
            ", " + ", ".join(frames) if frames else "") + ")"
    return out, text


def tell(stalls: dict[int, dict], world_size: int) -> str:
    """One line (the live log's): who waits where and who is missing."""
    return analyse(stalls, world_size)["text"]


def fr_group(entry: dict) -> str:
    """A Flight Recorder entry's group, as the recorder names groups: by the group's name, never
    its description, which every group of a kind shares ("default" for torch's default_pg)."""
    pg = entry.get("process_group")
    if not isinstance(pg, (list, tuple)) or not pg:
        return str(pg or "default")
    name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    return "default" if desc == "default_pg" or name in ("0", "") else name


def fr_kind(entry: dict) -> str:
    """`gloo:all_reduce`, `nccl:all_reduce`: the collective's kind."""
    return str(entry.get("profiling_name") or "?").split(":")[-1]
