"""Imbalanced and jitter-bound: ranks waiting for others. A straggler (the same rank late step
after step: stragglers.py, consistency.py) gets the fix for its own cause; waiting whose late
rank moves between steps (jitter) gets the fix for noise. Each with its estimate.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...op_names import excess_words
from ...results import Jitter, Straggler, Suggestion
from ...vocab import DATA, IMBALANCED, JITTER_BOUND, MS
from .. import order_stats
from ..findings import Findings, TypicalStep, gain
from ..consistency import Roles, persistent_steps
from ..routing import routing_note
from ..rowgroups import count_distinct
from .spec import Bottleneck


LABEL, JITTER_LABEL = IMBALANCED, JITTER_BOUND


def waiting_steps(steps: pd.DataFrame, th, roles: Roles | None) -> tuple[np.ndarray, np.ndarray]:
    """(imbalanced, jitter) masks over classify's steps: a rank waits at least th.wait of the
    step; that waiting is imbalance when it follows a persistent pattern (a consistently or
    probably late rank arrived last, or was the busiest rank of the step; a consistently early
    one waited: consistency.py), jitter when the roles are decided and it does not (another
    rank was the late and busiest one). Undecided roles: all imbalance."""
    waits = steps["wait_share"].to_numpy() >= th.wait
    jitter = np.zeros(len(steps), dtype=bool)
    if roles is not None and roles.decided:
        jitter = waits & ~persistent_steps(roles, steps["step"].to_numpy())
        waits = waits & ~jitter
    return waits, jitter


def same_loaders(knobs: dict) -> bool:
    """Whether every rank loads with one DataLoader configuration the record knows (its
    num_workers: one knob for all ranks)."""
    return knobs.get("dataloader") is not False and isinstance(knobs.get("num_workers"), int)


#: the share of the exposed time in all-to-all at which the waiting is taken for expert routing
EXPERT_SHARE = 0.5


def _straggler_fix(s: Straggler, knobs: dict, exposed_by_kind: dict | None,
                   routing: dict | None, data_ns: float = 0.0) -> str:
    """What to look at for a straggler: by the part its excess is in, the profiler's ops that
    hold it, a few late steps, or uneven expert routing. `data_ns`: the ranks' mean data wait
    per step: where it is as large as the straggler's excess, every rank is short of loading
    and this one loses the race; its storage is not the first suspect."""
    if s.cause == "data" and data_ns >= s.excess_ns > 0:
        return (f"every rank waits for its batches (~{data_ns / MS:.1f} ms a step on average, "
                f"this one {s.excess_ns / MS:.1f} ms more): loading is short on all of them and "
                "this one comes last; more DataLoader workers fix both (the data suggestion); "
                "if it stays behind after that, check its storage/decoder and whether its shard "
                "holds larger samples")
    if s.cause == "data" and same_loaders(knobs):
        return (f"every rank loads with the same DataLoader ({knobs['num_workers']} worker(s)), "
                "and the record cannot tell a loader slower on this rank from loaders as short "
                "on all of them, where this one fell behind and the others' prefetched batches "
                "hide theirs (another run of the same setup may name another rank, or none); "
                "more DataLoader workers fix either (the data suggestion); if it stays behind "
                "after that, check its storage/decoder and whether its shard holds larger "
                "samples")
    fixes = {
        "data": "its data loading is slower: check its storage/decoder, its DataLoader workers "
                "and whether its shard holds larger samples",
        "compute": "it computes longer: check for uneven inputs (sort or bucket by length), "
                   "extra work on that rank (logging, metrics, eval), other processes on its "
                   "device, GPU clocks and temperature"
                   + ("; with DataParallel, switch to DDP"
                      if knobs.get("parallel") == "DataParallel" else ""),
        "other": "it spends longer outside data and compute: host overhead, Python work or "
                 "synchronization specific to that rank",
    }
    fix = fixes[s.cause]
    if s.ops:  # the profiler's ops say where the excess is
        alone = [o["name"] for o in s.ops if o.get("only_here")]
        fix = (f"by the profiler's ops, {excess_words(s.ops)}; "
               + (f"{alone[0]} runs on this rank alone: remove it from the step or "
                  "spread it over the ranks" if alone else
                  "look for why these take longer here (uneven inputs, other processes "
                  "on its device, clocks)") + f"; else {fix}")
    if s.bursts:  # late mostly in a few steps: what it does only then
        fix = ("most of its lateness comes in a few steps: look for work it does only then "
               "(a checkpoint or log written by it, garbage collection, a slow batch or "
               f"file); else {fix}")
    by_kind = exposed_by_kind or {}
    total = sum(by_kind.values())
    in_a2a = total > 0 and by_kind.get("all_to_all", 0) >= EXPERT_SHARE * total
    routed = routing_note(routing) if routing is not None and routing.busiest_rank == s.rank \
        else ""
    if s.cause == "compute" and (in_a2a or routed):  # expert parallel: routing is uneven
        seen = [f"the waiting is in all-to-all ({by_kind['all_to_all'] / total:.0%} of the "
                "exposed communication)"] if in_a2a else []
        seen += [routed] if routed else []
        fix = ("; ".join(seen) + ": with experts, the router sends rank "
               f"{s.rank}'s expert(s) more tokens than the others; balance them (a capacity "
               "factor, an auxiliary load-balancing loss, expert placement), or check for "
               "uneven inputs")
    return fix


def suggest_imbalance(t: TypicalStep, stragglers: list[Straggler], knobs: dict,
                      early: set[int] | None = None,
                      frame: pd.DataFrame | None = None,
                      exposed_by_kind: dict | None = None,
                      routing: dict | None = None) -> list[Suggestion]:
    if not stragglers:
        if early:
            names = ", ".join(str(r) for r in sorted(early))
            current = f"rank(s) {names} wait for the rest every step"
            why = (f"rank(s) {names} consistently finish first and wait up to {t.wait / MS:.1f} ms "
                   "for the others, which are all slower: look at what those ranks do less of "
                   "(a smaller data shard, skipped logging or eval) or what slows the rest (shared "
                   "hosts, clocks); DataParallel's master GPU is the classic case")
        else:
            current = "none consistent"
            why = (f"ranks wait up to {t.wait / MS:.1f} ms per step for each other, but too few "
                   "steps show who is late: record more steps to name a straggler")
        est = t.step - t.wait
        return [Suggestion("straggler", current, "match the median rank", est / MS,
                           why, IMBALANCED, gain(t.step, est), _straggler_range(t, est))]
    out = []
    fixed = without_stragglers(frame, {s.rank for s in stragglers}) if frame is not None else None
    floor = t.step - t.wait  # all the waiting gone: no estimate goes below it
    for s in stragglers:
        est = floor
        rng = _straggler_range(t, est)
        if fixed is not None and fixed[0] < t.step:
            est = max(fixed[0], floor)
            rng = (max(min(fixed[1], fixed[0]), floor) / MS, max(min(fixed[2], t.step), est) / MS)
        pace = ""
        if s.cause == "data" and same_loaders(knobs) and t.data < s.excess_ns:
            # the others' pace may be their own loaders', as short as its: no gain at all
            rng, pace = (rng[0], t.step / MS), (" (if their loaders are as short as its, no "
                                                 "gain: the range's upper end)")
        grow, shared = shared_cores(knobs, len(stragglers))
        if grow > 1:  # the others computed on the straggler's core while it waited
            rng = (rng[0], max(rng[1], min(est * grow, t.step) / MS))
        where = f" on host {s.host}" if s.host else ""
        part = f"{s.cause} ({s.cause_detail})" if s.cause_detail else s.cause
        fix = _straggler_fix(s, knobs, exposed_by_kind, routing, t.data)
        evidence = s.telemetry
        # against the ranks of its own group where the layout names them (another pipeline
        # stage does other work)
        ref = ("the median rank" if not s.peers else f"rank {s.peers[0]} (its group)"
               if len(s.peers) == 1 else
               f"the median of ranks {', '.join(map(str, s.peers))} (its group)")
        late = (f"rank {s.rank} is probably a straggler ({s.probable}): it"
                if s.probable else f"rank {s.rank}")
        out.append(Suggestion(
            "straggler", f"rank {s.rank}{where}", f"match {ref}", est / MS,
            f"{late} is busy {s.excess_ns / MS:.1f} ms per step longer than {ref}, "
            f"mostly in {part}, and the others wait for it ({s.lateness})"
            + (f"; {evidence}" if evidence else "") + f": {fix}; assumes the other "
            "ranks keep their pace and their own step-to-step variation (the step then waits "
            "for the last of them)" + pace + shared, IMBALANCED, gain(t.step, est), rng,
            rank=s.rank, after=DATA if s.cause == "data" and same_loaders(knobs) else ""))
    return out


def shared_cores(knobs: dict, late: int) -> tuple[float, str]:
    """(how much slower the other ranks may compute once `late` stragglers keep pace, in words):
    on a CPU whose ranks share the host's cores with more work than it has cores (their own
    threads, or other work: the load average), a rank that waits gives its core to the others,
    who then compute faster than they will beside it; at most local / (local - late) times (its
    core shared again), at most the host's demand over its cores; 1 elsewhere (a GPU each, or
    cores to spare)."""
    from ..whatif import device_kind

    cpus = knobs.get("cpus_available") or knobs.get("cpu_count")
    local = knobs.get("local_world_size")
    if device_kind(knobs) != "cpu" or not isinstance(cpus, int) or not isinstance(local, int) \
            or local <= late or cpus <= 0:
        return 1.0, ""
    threads = knobs.get("torch_threads") if isinstance(knobs.get("torch_threads"), int) else 1
    load = knobs.get("load_avg")
    other = max(float(load) - local, 0.0) if isinstance(load, (int, float)) else 0.0
    demand = local * threads + other
    if demand <= cpus:
        return 1.0, ""
    grow = min(local / (local - late), demand / cpus)
    return grow, (f"; its host's {cpus} core(s) run {local} rank(s) of {threads} thread(s)"
                  + (f" beside other work (load {load:.1f})" if other > 0 else "")
                  + f": while it waits the others compute on its core, and may run up to "
                  f"{grow:.1f}x slower beside it (the range's upper end, to no gain at all)")


#: E[max of n standard normals]: how much later than the mean the last of n ranks arrives
_EXPECTED_MAX = {1: 0.0, 2: 0.564, 3: 0.846, 4: 1.029, 5: 1.163}


def without_stragglers(frame: pd.DataFrame, slow: set[int]) -> tuple[float, float, float] | None:
    """(point, lo, hi) ns of a step once the slow ranks keep pace: the other ranks' busy time
    (step minus waiting), its mean plus how late the last of n ranks with that per-step spread
    (robust: the median absolute deviation's) comes (the synchronous step waits for it); lo:
    the median, hi: twice the spread's share."""
    if frame.empty or "wait_ns" not in frame:
        return None
    keep = ~np.isin(frame["rank"].to_numpy(), list(slow))  # columns, not a copy of the frame
    if not keep.any():
        return None
    busy = (frame["step_ns"].to_numpy(dtype=float) - frame["wait_ns"].to_numpy(dtype=float))[keep]
    n = count_distinct(frame["rank"].to_numpy())
    c = _EXPECTED_MAX.get(n, math.sqrt(2 * math.log(max(n, 2))))
    # the spread of a typical step (1.4826 x the median absolute deviation): one step slowed by
    # a profiler starting or a checkpoint is in the mean, but says nothing of how late the last
    # of the ranks comes in the others
    # (the busy times are not needed after: partitioned, then made the deviations, in place)
    mean, median = float(np.mean(busy)), float(order_stats.median(busy, axis=0, overwrite=True))
    dev = np.abs(busy - median, out=busy)
    sd = float(1.4826 * order_stats.median(dev, axis=0, overwrite=True))
    point = mean + c * sd
    return point, median, point + c * sd


def _straggler_range(t: TypicalStep, est: float) -> tuple[float, float]:
    """Without the straggler the others still wait for each other now and then: up to a tenth
    of the step and half the wait the straggler caused."""
    return (est / MS, min(t.step, est * 1.1 + 0.1 * t.wait) / MS)


def suggest_jitter(t: TypicalStep, jitter: Jitter,
                   stragglers: list[Straggler] | None = None) -> list[Suggestion]:
    """Waiting that moves between ranks: no one rank to fix, so even out the per-step work.
    The estimate takes the typical step less the waiting in jitter steps, per step on average.
    Beside a straggler (named or probable) the jitter is the waiting of the other steps."""
    wait_share = jitter.wait_share
    # the time lost in jitter steps, per step on average; never more than the longest wait of a
    # step on average (the jitter share is each rank's wait over its own step, which can be
    # shorter than the slowest rank's: share x step may exceed the wait itself)
    saved = min(wait_share * t.step, t.wait)
    est = max(t.step - saved, 0.0)
    late = jitter.intermittent
    if late:  # one rank, late only in some steps: that rank's work in those steps
        when = (f"every {late['every']} steps" if late["every"]
                else f"{len(late['late_steps'])} of {late['steps']} steps")
        # its lateness, per step on average, goes; the rest of the waiting may go too, or not
        own = min(late["excess_ms"] * MS * len(late["late_steps"]) / max(late["steps"], 1),
                  saved)
        point = max(t.step - own, 0.0)
        return [Suggestion(
            "rank_jitter", f"rank {late['rank']} late {when}",
            f"find what rank {late['rank']} does only in those steps", point / MS,
            f"ranks lose {wait_share:.1%} of step time waiting in steps with no steady late "
            f"rank; rank {late['rank']} arrived last in {len(late['late_steps'])} of the "
            f"{late['of_steps']} steps where the waiting stands out ({when}), "
            f"{late['excess_ms']:.1f} ms late in each: look for work that rank does only then "
            "(a checkpoint or log written by it, garbage collection, a slow batch or file); "
            f"assumes its {own / MS:.1f} ms a step on average goes (range: all the waiting to "
            "none of it)", JITTER_BOUND, gain(t.step, point), (est / MS, t.step / MS))]
    return [Suggestion(
        "rank_jitter", f"waiting moves between ranks ({jitter.steps_share:.0%} of step time)",
        "even out per-step work", est / MS,
        f"ranks lose {wait_share:.1%} of step time waiting for each other in steps where "
        + (f"rank(s) {', '.join(str(s.rank) for s in stragglers)} did not arrive last, and the "
           "late rank changes between them" if stragglers else
           "the late rank changes from step to step, no rank late step after step")
        + ": look for uneven inputs (sort or bucket samples by length), noisy "
        "neighbours or CPU oversubscription on the hosts, and host work that runs on some steps "
        "(logging, checkpointing, garbage collection); assumes all the waiting goes (range: "
        "none of it)", JITTER_BOUND, gain(t.step, est), (est / MS, t.step / MS))]


def jitter_asks(found: Findings) -> bool:
    """Jitter-bound, or jitter steps holding a material share (20%) of the time, with waiting."""
    j = found.jitter
    return (JITTER_LABEL in found.labels or j.steps_share >= 0.2) and j.wait_share > 0


def _waiting(column: str):
    """The evidence of a waiting label: the wait share in the steps whose `column` (classify's
    waiting_steps) marks them, else -1."""
    return lambda steps, th: np.where(steps[column].to_numpy(), steps["wait_share"].to_numpy(),
                                      -1.0)


SPEC = Bottleneck(
    LABEL, "wait_share", "wait", "the waiting", lambda t, _: t.wait,
    lambda found: LABEL in found.labels,
    lambda found, t: (suggest_imbalance(t, found.stragglers, found.knobs, found.early_ranks,
                                        found.frame, found.exposed_by_kind, found.routing), ""),
    evidence=_waiting("waiting"))
JITTER_SPEC = SPEC._replace(label=JITTER_LABEL, asks=jitter_asks, suggest=lambda found, t: (
    suggest_jitter(t, found.jitter, found.stragglers), ""), evidence=_waiting("jitter"))
