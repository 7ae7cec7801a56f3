"""Scores one fault row: what a gpuscope report (JSON, `Report.to_dict()`) says against what was
injected (benchmarks/faults/train.py's truth files) and the loop's own clock.

A row is right from a source when the report
- names the slowed rank first among its stragglers, or, naming none, first among its minor
  stragglers (consistently late under the imbalance threshold: no estimate is scored then)
  (both, for two slowed ranks; for a rank slowed
  in one step of five, names it or says its lateness is intermittent; for rotating slowness and
  controls, names no one);
- gives the cause: the loader for `data`, compute in the slowed phase for forward / backward /
  optimizer, time outside the phases for `between`, its communication for `comm`;
- gives an excess within EXCESS_TOLERANCE of the injected time a step;
- estimates the step without the fault within ESTIMATE_TOLERANCE of the run without it (the
  row's control, run in the same batch).
Rows the evidence cannot settle count as right only where the report says so: it names the
rank as probably late (a probable straggler: late in most steps, "record more steps"), whatever
the verdict's confidence (a data-bound run with a small fault is rightly data-bound, and sure of
it), or says its steps cannot rule the rank out as a straggler (`straggler_not_ruled_out`), or
that they cannot see a straggler as small as the fault (`straggler_floor`: the injected ms a step
under the most a rank's lateness could be and look like chance), or names no one at low
confidence. Counted apart as unsure.
"""

from __future__ import annotations

import json
import os
import statistics

EXCESS_TOLERANCE = 0.25
ESTIMATE_TOLERANCE = 0.15
#: the phase each fault adds its time to, as a straggler's `cause` / `cause_detail` say it
#: (`comm` has none: gpuscope names a straggler's cause among data, compute and other, and a rank
#: whose collective starts late is none of them; what it says is kept, not scored)
CAUSES = {"data": ("data", None), "data_workers": ("data", None), "forward": ("compute", "forward"),
          "backward": ("compute", "backward"), "optimizer": ("compute", "optimizer"),
          "intermittent": ("compute", "forward"), "two": ("compute", "forward"),
          "between": ("other", None)}


def _median(xs: list) -> float:
    return statistics.median(xs[1:] or xs) if xs else 0.0


def truth(run_dir: str) -> dict:
    """What was injected, by rank, and what the loop's own clock saw, per step (an optimizer
    step: a run that accumulates sums its micro-steps): each rank's mean added ms (after the
    first step), its local work (data wait, forward, backward's compute to its last gradient,
    the optimizer, between steps and gpuscope's rec.step(): no waiting for the other ranks
    inside; medians; runs from before backward's compute was timed leave it out), its data wait,
    and the job's step (the profiler's trace writing left out)."""
    ranks = {}
    for name in os.listdir(run_dir):
        if name.startswith("truth-rank") and name.endswith(".json"):
            with open(os.path.join(run_dir, name)) as fh:
                d = json.load(fh)
            ranks[d["rank"]] = d
    if not ranks:
        raise FileNotFoundError(f"{run_dir}: no truth files (the training did not finish)")
    any_rank = next(iter(ranks.values()))
    # gpuscope's step is the optimizer step (a cycle of micro-steps, when a run accumulates):
    # the truth in the same unit, each cycle's sum
    k = int(any_rank.get("accumulation") or 1)

    def per_step(xs: list) -> list:
        return [sum(xs[i:i + k]) for i in range(0, len(xs) - k + 1, k)] if k > 1 else xs

    added = {r: statistics.fmean(per_step(d["added_ms"])[1:] or per_step(d["added_ms"]))
             for r, d in ranks.items()}

    def step_s(d) -> list:
        sec = d["seconds"]
        prof = sec.get("profiler") or [0.0] * len(sec["step"])
        steps = per_step([s - p for s, p in zip(sec["step"], prof)])
        return steps[1:] or steps

    # the job's step: every rank waits for the slowest at the collective, so the mean over
    # ranks of each rank's mean step
    step_ms = 1e3 * statistics.fmean(statistics.fmean(step_s(d)) for d in ranks.values())
    phases = ("data", "forward", "optimizer", "between", "backward_compute", "record")
    local = {r: 1e3 * sum(_median(per_step(d["seconds"][p])) for p in phases
                          if d["seconds"].get(p))
             for r, d in ranks.items()}
    # ... and each optimizer step's, to confirm a rank over the steps a report analysed
    local_steps = {r: [1e3 * sum(x) for x in zip(*(per_step(d["seconds"][p]) for p in phases
                                                    if d["seconds"].get(p)))]
                   for r, d in ranks.items()}
    data = {r: 1e3 * statistics.fmean(per_step(d["seconds"]["data"])[1:]
                                      or per_step(d["seconds"]["data"]))
            for r, d in ranks.items()}
    # gpuscope's rec.step() on the training thread, per step (its hooks are not in it: they
    # run inside forward and backward; bench_overhead.py measures the whole)
    record = 1e3 * statistics.fmean(_median(per_step(d["seconds"]["record"]))
                                    for d in ranks.values() if d["seconds"].get("record"))
    # each phase's median per step, by rank: where the loop's clock put a rank's extra time
    phase_ms = {r: {p: round(1e3 * _median(per_step(d["seconds"][p])), 3) for p in phases
                    if d["seconds"].get(p)} for r, d in ranks.items()}
    return {"fault": any_rank["fault"], "slowed": any_rank["slowed"], "ms": any_rank["ms"],
            "world": any_rank["world"], "parallel": any_rank["parallel"],
            "workers": any_rank["workers"], "added_ms": added, "step_ms": step_ms,
            "local_ms": local, "local_steps_ms": local_steps, "data_ms": data,
            "phase_ms": phase_ms, "record_ms": record}


def _get(by_rank: dict, r: int, default=None):
    """A value by rank from a dict read back from JSON (string keys) or made here (int keys)."""
    return by_rank.get(r, by_rank.get(str(r), default))


#: a rank whose local work (the loop's clock) is this much longer than its peers' median is
#: really slower: on a shared machine one rank can compute longer for a whole run
CONFIRMS = 1.10
#: loading the workers hide: a slowed loader whose measured wait on that rank exceeds its
#: peers' by less than this part of what was injected slowed no one (its workers hid it)
HIDDEN_DATA = 0.5
#: ... unless what is left of it is at least this part of the job's step (gpuscope's wait
#: threshold): a loader hidden by half still 40 ms late a 100 ms step holds the others back
MATERIAL = 0.10


def analysed_steps(report: dict) -> list[int] | None:
    """The optimizer steps a report analysed: a trace's steps are the loop's (one profiler step
    each); a record's step of several micro-steps is named by its last micro-step."""
    steps = report.get("steps") or []
    if not steps:
        return None
    return sorted({int(s["step"]) // int(s["micro_steps"]) if s.get("micro_steps") else
                   int(s["step"]) for s in steps})


def clock_confirms(ranks: list, t: dict, steps: list[int] | None = None) -> bool:
    """Each of `ranks` did at least CONFIRMS x its peers' median local work (truth's local_ms;
    over `steps` only, the optimizer steps a report analysed, where the truth has them: the
    profiler captures 8 steps of 24, and a rank can be slower in those alone)."""
    local = {int(k): v for k, v in t["local_ms"].items()}
    per = t.get("local_steps_ms")
    if steps and per:
        picked = {int(k): [v[i] for i in steps if i < len(v)] for k, v in per.items()}
        if all(picked.values()):
            local = {k: statistics.median(v) for k, v in picked.items()}
    for r in ranks:
        others = [v for k, v in local.items() if k != r]
        if r not in local or not others or local[r] < CONFIRMS * statistics.median(others):
            return False
    return bool(ranks)


#: a straggler's cause phase, as the truth's phases name it
PHASE_OF = {("compute", "forward"): "forward", ("compute", "backward"): "backward_compute",
            ("compute", "optimizer"): "optimizer", ("data", None): "data",
            ("other", None): "between"}


def clock_puts_in(rank: int, cause: str | None, detail: str | None, excess_ms: float | None,
                  t: dict) -> bool:
    """The loop's own clock shows `rank` longer than its peers' median in the phase a report
    named (cause, detail) by at least half the excess it gave (truth's phase_ms)."""
    phase = PHASE_OF.get((cause, detail))
    if phase is None or not excess_ms:
        return False
    grew = phase_excess(rank, phase, t)
    return grew is not None and grew >= 0.5 * excess_ms


def phase_excess(rank: int, phase: str, t: dict) -> float | None:
    """How much longer `rank` spent in `phase` a step than its peers' median (loop's clock)."""
    phases = {int(k): v for k, v in (t.get("phase_ms") or {}).items()}
    others = [v[phase] for k, v in phases.items() if k != rank and phase in v]
    mine = phases.get(rank, {}).get(phase)
    return None if mine is None or not others else mine - statistics.median(others)


def effective_kind(kind: str, t: dict) -> str:
    """The kind a row is scored as: a loader fault its workers hid (the slowed rank waited for
    data less than HIDDEN_DATA of the injected time more than its peers, by the loop's clock,
    and less than MATERIAL of the step) slowed no one: a control."""
    if kind in ("data", "data_workers"):
        r = t["slowed"][0]
        data = {int(k): v for k, v in t["data_ms"].items()}
        others = [v for k, v in data.items() if k != r]
        injected = _get(t["added_ms"], r, 0.0)
        left = data[r] - statistics.median(others) if others else 0.0
        # what the workers left of it still holds the others back by a material part of the
        # step (the imbalance threshold): a straggler, however much of it they hid
        if others and left < HIDDEN_DATA * injected and left < MATERIAL * t.get("step_ms", 0.0):
            return "control"
    return kind


def left_of_fault(kind: str, rank: int, t: dict) -> float:
    """The ms a step a fault made `rank` late by: what was injected; for a loader its workers
    hide, what the loop's clock saw of it (the rank's local work over its peers' median),
    at most what was injected."""
    added = _get(t["added_ms"], rank, 0.0)
    if kind != "data_workers" or "local_ms" not in t:
        return added
    local = {int(k): v for k, v in t["local_ms"].items()}
    others = [v for k, v in local.items() if k != rank]
    if rank not in local or not others:
        return added
    return min(added, max(0.0, local[rank] - statistics.median(others)))


def _detail(report: dict, rank: int) -> dict | None:
    """The rank's straggler entry, else its minor straggler entry (cause, excess_ms alike)."""
    for s in (*(report.get("straggler_details") or ()), *(report.get("minor_stragglers") or ())):
        if s["rank"] == rank:
            return s
    return None


def _estimate(report: dict) -> float | None:
    """The report's estimate of the step with the slowed rank fixed: its straggler suggestion,
    its advice for an intermittently late rank, else its top one."""
    sugg = report.get("suggestions") or []
    knobs = ["straggler"] + (["rank_jitter"] if (report.get("jitter") or {}).get("intermittent")
                             else [])
    for knob in knobs:
        for s in sugg:
            if s.get("knob") == knob:
                return s.get("estimated_step_ms")
    return sugg[0].get("estimated_step_ms") if sugg else None


def score(kind: str, t: dict, report: dict, control_step_ms: float | None) -> dict:
    """Checks of one report against the row's truth `t` (truth()); `kind` is the row's kind
    (train.py's fault, or `two`). Each check True / False, or None where it does not apply."""
    scored_as = effective_kind(kind, t)
    if scored_as != kind:
        out = score(scored_as, dict(t, slowed=[]), report, control_step_ms)
        out["scored_as"] = scored_as
        return out
    named = list(report.get("stragglers") or [])
    probable = list(report.get("probable_stragglers") or [])
    low = report.get("confidence") == "low"
    slowed = list(t["slowed"])
    out: dict = {"verdict": report.get("verdict"), "confidence": report.get("confidence"),
                 "named": named, "probable": probable,
                 "minor_ranks": [m["rank"] for m in report.get("minor_stragglers") or ()]}
    unsure = False
    unruled = (report.get("straggler_not_ruled_out") or {}).get("rank")
    out["not_ruled_out"] = unruled
    # what the steps could see: a fault whose lateness a step is under it, said so, is unsure
    seen_from = (report.get("straggler_floor") or {}).get("up_to_ms")
    hidden = seen_from is not None and all(
        left_of_fault(kind, r, t) <= seen_from for r in t["slowed"])
    out["below_floor"] = hidden
    if kind in ("control", "rotating"):
        ok = not named
        if named and clock_confirms(named, t, analysed_steps(report)):  # a rank really
            # slower on the shared cores, in the steps the report analysed
            ok = out["real_straggler"] = True
        if kind == "rotating" and ok:  # said as such: the lateness moves between ranks
            ok = report.get("verdict") == "jitter-bound" or bool(
                (report.get("jitter") or {}).get("steps_time_pct"))
    elif kind == "two":
        ok = sorted(named) == sorted(slowed)
        # or, naming no straggler, both first among the minor ones (small faults), as for one
        minor = [m["rank"] for m in report.get("minor_stragglers") or ()]
        out["minor"] = not ok and not named and sorted(minor[:len(slowed)]) == sorted(slowed)
        ok = ok or out["minor"]
        unsure = not ok and not named and (set(probable) <= set(slowed) if probable else
                                           unruled in slowed or hidden
                                           or (low and unruled is None))
    elif kind == "intermittent":
        r = slowed[0]
        d = _detail(report, r)
        said = ((report.get("jitter") or {}).get("intermittent") or {}).get("rank")
        # said as intermittent lateness; or the rank named, and said late in some steps only
        # (not last in every one), or late mostly in a few (its bursts)
        ok = (not named and said == r) or (d is not None and (not named or named[0] == r) and (
            d.get("last_in") is None or d["last_in"][0] < d["last_in"][1]
            or bool(d.get("bursts"))))
        unsure = not ok and not named and (probable == [r] if probable else
                                           unruled == r or hidden or (low and unruled is None))
    else:
        r = slowed[0]
        ok = bool(named) and named[0] == r
        # or, named no straggler, the rank named first among the minor ones: consistently
        # late under the imbalance threshold (a small fault); no estimate promised for it
        minor = [m["rank"] for m in report.get("minor_stragglers") or ()]
        out["minor"] = not ok and not named and minor[:1] == [r]
        ok = ok or out["minor"]
        # not sure, and said so: the rank named probably, or not ruled out, or no one at low
        # confidence (not another rank)
        unsure = not ok and not named and (probable == [r] if probable else
                                           unruled == r or hidden or (low and unruled is None))
        # another rank named (or probably), which the loop's own clock shows really slower
        # in the steps the report analysed while the slowed one was not (its loader's workers
        # hid the fault there, and the shared cores slowed the other): right about the run, as
        # in a control (a data_workers row whose 8 profiled steps had rank 0 the slower)
        # (or the rank it could not rule out)
        blamed = named or probable or ([unruled] if unruled is not None else [])
        steps = analysed_steps(report)
        if not (ok or unsure) and blamed and r not in blamed and "local_ms" in t and clock_confirms(
                blamed, t, steps) and not clock_confirms([r], t, steps):
            ok = out["real_straggler"] = True
    out["straggler"] = ok
    out["unsure_said"] = unsure
    out["right"] = ok or unsure
    late = (report.get("jitter") or {}).get("intermittent") or {}
    if ok and kind == "intermittent" and _detail(report, slowed[0]) is None:
        # said as intermittent lateness: no cause given; its excess is per late step, against
        # the injected time of a slowed step
        got, want = late.get("excess_ms"), t.get("ms", 0.0)
        out["cause"], out["excess_ms"] = None, [got, round(want, 3)]
        out["excess"] = got is not None and want > 0 and abs(got - want) <= EXCESS_TOLERANCE * want
    elif ok and slowed and kind not in ("rotating", "control") and not out.get("real_straggler"):
        # (a rank the clock shows really slower, named instead of the slowed one: the fault's
        # cause and excess are the slowed rank's, not its; nothing to check them against)
        r = slowed[0]
        d = _detail(report, r) or {}
        out["cause_got"] = [d.get("cause"), d.get("cause_detail")]
        cause, detail = CAUSES.get(kind, (None, None))
        out["cause"] = None if cause is None else (
            d.get("cause") == cause and (detail is None or d.get("cause_detail") == detail))
        if out["cause"] is False and kind == "data_workers" and clock_puts_in(
                r, d.get("cause"), d.get("cause_detail"), d.get("excess_ms"), t):
            # the workers hid the loader, and their processes, on the rank's cores, lengthened
            # its compute in the phase named: the loop's clock puts the excess there
            out["cause"] = out["cause_by_clock"] = True
        want = _get(t["added_ms"], r, 0.0)
        if out.get("cause_by_clock"):  # what that phase grew by (loop's clock)
            want = phase_excess(r, PHASE_OF[d["cause"], d.get("cause_detail")], t)
        elif kind in ("data", "data_workers"):  # what the loader's wait grew by (loop's clock)
            data = {int(k): v for k, v in t["data_ms"].items()}
            want = data[r] - statistics.median([v for k, v in data.items() if k != r])
        got = d.get("excess_ms")
        out["excess_ms"] = [got, round(want, 3)]
        out["excess"] = got is not None and want > 0 and abs(got - want) <= EXCESS_TOLERANCE * want
    else:
        out["cause"] = out["excess"] = None
    est = _estimate(report)
    if kind != "control" and control_step_ms and est is not None and ok \
            and not out.get("minor"):
        out["estimate_ms"] = [round(est, 3), round(control_step_ms, 3)]
        out["estimate"] = abs(est - control_step_ms) <= ESTIMATE_TOLERANCE * control_step_ms
    else:
        out["estimate"] = None
    return out
