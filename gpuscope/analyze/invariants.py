"""What every report must add up to, checked on every analysis (DESIGN.md, "Every report adds up").

1. On the rank x step table, before anything is judged (`enforce_parts`): every part >= 0 and no
   longer than its step; data + compute + exposed + other = step; exposed <= comm; wait + bubble
   <= exposed; host <= other; a named phase (forward, backward, optimizer) no longer than its step.
   A row that breaks a rule is clipped, in that order, and counted per rule.
2. On the suggestions (`bound_suggestions`): an estimated step is never shorter than the typical
   step minus what the change can recover (`recoverable`), and a gain never above what
   recovering all of it would give. The low end of an estimate's range (the spread of the steps
   it drew on) is held there too, without a warning.
3. On the report as the renderers read it (`violations`): shares of step time in [0, 100], the
   four disjoint parts summing to 100, exposed <= comm, wait <= exposed, per-step shares in
   [0, 1], a verdict share in [0, 1]. Pure: the tests run it over every input they make.
A violation is a bug: at run time the part is clipped, the report's warnings say what did not add
up, and the confidence drops one level (confidence.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..results import ReportData, Suggestion
from ..vocab import IMBALANCED, MS
from .bottlenecks.table import BY_LABEL, TABLE
from .whatif import HIDDEN_COST

#: a bound is broken when it is missed by more than this share of the step (rounding in ms)
TOLERANCE = 0.005


def enforce_parts(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The table with every row's parts clipped to add up (1.), and one warning per rule broken
    ("" rules: none). The frame is copied only when something is clipped."""
    if frame.empty or adds_up(frame):
        return frame, []
    col = lambda c: frame[c].to_numpy(np.int64) if c in frame else None  # noqa: E731
    step = np.maximum(col("step_ns"), 0)
    data, comm, exposed = col("data_ns"), col("comm_ns"), col("comm_exposed_ns")
    compute, other, wait = col("compute_ns"), col("other_ns"), col("wait_ns")
    bubble, host = col("bubble_ns"), col("host_ns")
    broken: dict[str, int] = {}
    fixed: dict[str, np.ndarray] = {}

    def clip(name, value, lo, hi, rule):
        out = value < lo  # rows outside [lo, hi] counted first: most tables have none to clip
        out |= value > hi
        bad = int(np.count_nonzero(out))
        if not bad:
            return value
        got = np.minimum(np.maximum(value, lo), hi)
        broken[rule] = broken.get(rule, 0) + bad
        fixed[name] = got
        return got

    if (col("step_ns") < 0).any():
        broken["a negative step"] = int((col("step_ns") < 0).sum())
        fixed["step_ns"] = step
    data = clip("data_ns", data, 0, step, "data outside [0, step]")
    # the union of the step's collectives: inside the step (a damaged row can say more)
    comm = clip("comm_ns", comm, 0, step, "communication outside [0, step]")
    exposed = clip("comm_exposed_ns", exposed, 0, np.minimum(comm, step - data),
                   "exposed communication above communication or the step's rest")
    compute = clip("compute_ns", compute, 0, step - data - exposed,
                   "compute above the step's rest")
    rest = step - data - exposed - compute
    if other is not None and (other != rest).any():
        broken["data + compute + exposed + other != step"] = int((other != rest).sum())
        fixed["other_ns"] = rest
    wait = clip("wait_ns", wait, 0, exposed, "waiting above exposed communication")
    if bubble is not None:
        clip("bubble_ns", bubble, 0, exposed - wait, "waiting + bubble above exposed communication")
    if host is not None:
        clip("host_ns", host, 0, rest, "host wait above other")
    for phase in ("forward_ns", "backward_ns", "optimizer_ns"):
        if phase in frame:
            clip(phase, col(phase), 0, step, f"{phase[:-3]} outside [0, step]")
    if not fixed:
        return frame, []
    frame = frame.copy()
    for name, values in fixed.items():
        frame[name] = values
    return frame, [f"{n} row(s) did not add up ({rule}): clipped" for rule, n in broken.items()]


#: rows checked at a time by adds_up: each column's slice stays in the cache between rules
ADDS_UP_ROWS = 1 << 18


def adds_up(frame: pd.DataFrame) -> bool:
    """Whether no row breaks a rule enforce_parts enforces: the same rules, a slice of rows at
    a time (each column read once, no row-long temporaries), for the tables that need no
    clipping, most of them (a big table's columns may be in a file, paged in per pass)."""
    names = ("step_ns", "data_ns", "comm_ns", "comm_exposed_ns", "compute_ns", "other_ns",
             "wait_ns", "bubble_ns", "host_ns", "forward_ns", "backward_ns", "optimizer_ns")
    cols = {c: frame[c].to_numpy() for c in names if c in frame}
    if any(v.dtype != np.int64 for v in cols.values()) or \
            not {"step_ns", "data_ns", "comm_ns", "comm_exposed_ns", "compute_ns",
                 "wait_ns"} <= set(cols):
        return False  # the careful path works it out
    for a in range(0, len(frame), ADDS_UP_ROWS):
        c = {k: v[a:a + ADDS_UP_ROWS] for k, v in cols.items()}
        step, data, comm = c["step_ns"], c["data_ns"], c["comm_ns"]
        exposed, compute, wait = c["comm_exposed_ns"], c["compute_ns"], c["wait_ns"]
        if (step < 0).any() or (data < 0).any() or (data > step).any() or (comm < 0).any() \
                or (comm > step).any():
            return False
        left = step - data
        if (exposed < 0).any() or (exposed > comm).any() or (exposed > left).any():
            return False
        left -= exposed
        if (compute < 0).any() or (compute > left).any():
            return False
        left -= compute  # the step's rest: other
        if "other_ns" in c and (c["other_ns"] != left).any():
            return False
        if (wait < 0).any() or (wait > exposed).any():
            return False
        if "bubble_ns" in c and ((c["bubble_ns"] < 0).any()
                                 or (c["bubble_ns"] > exposed - wait).any()):
            return False
        if "host_ns" in c and ((c["host_ns"] < 0).any() or (c["host_ns"] > left).any()):
            return False
        for phase in ("forward_ns", "backward_ns", "optimizer_ns"):
            if phase in c and ((c[phase] < 0).any() or (c[phase] > step).any()):
                return False
    return True


def _per_rank(frame: pd.DataFrame, col: str) -> float:
    """Mean over ranks of each rank's mean of a column: the statistic the sync-frequency
    model (whatif.Micro) reads its micro-step from."""
    if col not in frame or frame.empty:
        return 0.0
    return float(frame[col].groupby(frame["rank"].to_numpy()).mean().mean())


def recoverable(s: Suggestion, typical, frame: pd.DataFrame,
                knobs: dict | None = None) -> float | None:
    """ns of the typical step that suggestion `s` can recover at most; None when no bound
    applies (a change of parallelism may recover anything).

    Syncing gradients less often saves a micro-step all of its communication, hidden or not
    (and what hidden communication slowed backward by, up to 1.1x its time), and the optimizer
    step; a larger batch may also make compute per sample cheaper (no bound
    but its own arithmetic); the other communication changes save the exposed part; data changes
    the data wait (workers for a loop that loads in its own thread, also what its work lost to
    starting cold after each load); a straggler or jitter fix the
    waiting; fewer
    launches the GPU's wait on the host; a pipeline change the bubble and the waiting."""
    label = s.addresses
    if s.knob == "batch_size":  # more samples per step: compute per sample may shrink too
        return None
    if s.knob == "sync_frequency":  # the model lets hidden communication cost backward up to
        # HIDDEN_COST's upper end of its own time (1.1x on CPU, where it shares the cores)
        worst = max(hi for _, _, hi in HIDDEN_COST.values())
        # a DDP record times the backward's exposed tail: what hid behind backward is DDP's own
        # measure (hidden_comm_ns), on top of the rows' communication
        knobs = knobs or {}
        hidden = max(knobs.get("hidden_comm_ns") or 0.0, (knobs.get("hidden_comm_share") or 0.0)
                     * _per_rank(frame, "backward_ns"))
        return worst * (_per_rank(frame, "comm_ns") + hidden) + _per_rank(frame, "optimizer_ns")
    if s.knob == "num_workers" and s.current == 0 and typical.busy_fast is not None:
        # the load out of the training thread: its wait, and what the loop's own work lost to
        # starting cold after it (bottlenecks/data.py's warm_rest, its low end)
        from .bottlenecks.data import warm_rest

        return typical.data + max(typical.busy - warm_rest(typical)[1], 0.0)
    spec = BY_LABEL.get(label)  # what removing the bottleneck it addresses recovers
    return spec.recover(typical, frame) if spec is not None else None


#: what each change can recover, in words (recoverable() computes it)
RECOVERS = {"sync_frequency": "the skipped syncs' communication, what it cost backward, and the "
                              "optimizer steps",
            "num_workers": "the data wait, and what the loop's own work lost to starting cold "
                           "after the load in its thread",
            **{b.label: b.recovers for b in TABLE}}


def bound_suggestions(suggestions: list[Suggestion], typical, frame: pd.DataFrame,
                      knobs: dict | None = None) -> tuple[list[Suggestion], list[str]]:
    """The suggestions with estimates and gains held to what their change can recover (2.);
    each one that had to be held says so in its own `why` (the verdict's evidence is not what
    was wrong), and the notes come back as well (what was held, one line each)."""
    out, warnings = [], []
    step = typical.step
    for s in suggestions:
        rec = recoverable(s, typical, frame, knobs)
        if rec is None or step <= 0:
            said = (step / MS / max(s.estimated_step_ms, 1e-9) - 1) * 100
            if step > 0 and s.gain_pct > said + 100 * TOLERANCE:  # the gain its estimate gives
                note = (f"a gain of {s.gain_pct:.0f}% where its estimate gives {said:.0f}%: held "
                        "at that")
                warnings.append(f"suggestion {s.knob}: {note}")
                s = replace(s, gain_pct=said, why=f"{s.why}; {note}")
            out.append(s)
            continue
        rec = min(max(rec, 0.0), step)
        floor_ms = (step - rec) / MS  # today's batch, all of it recovered
        tol = TOLERANCE * step / MS
        max_gain = (step / max(step - rec, 1.0) - 1) * 100 if rec < step else float("inf")
        rng = s.estimated_step_ms_range
        if rng is not None and rng[0] < floor_ms:  # the range's low end is the spread of the
            # steps the model drew on (a quartile): no step can beat all of it recovered
            rng = (floor_ms, max(rng[1], floor_ms))
            s = replace(s, estimated_step_ms_range=rng)
        if s.estimated_step_ms >= floor_ms - tol and s.gain_pct <= max_gain + 100 * TOLERANCE:
            out.append(s)
            continue
        est = max(s.estimated_step_ms, floor_ms)
        if rng is not None:
            rng = (max(rng[0], floor_ms), max(rng[1], est))
        gain = min(s.gain_pct, (step / MS / max(est, 1e-9) - 1) * 100, max_gain)
        gave = (f"{s.estimated_step_ms:.2f} ms per step" if s.estimated_step_ms
                < floor_ms - tol else f"a gain of {s.gain_pct:.0f}%")
        what = RECOVERS.get(s.knob) or RECOVERS.get(s.addresses) or f"{s.addresses} time"
        note = (f"the model gave {gave}, beyond "
                f"the {step / MS:.2f} ms step less all that the change can recover "
                f"({rec / MS:.2f} ms: {what}): held at {est:.2f} ms (+{gain:.0f}% at most)")
        warnings.append(f"suggestion {s.knob}: {note}")
        out.append(replace(s, estimated_step_ms=est, estimated_step_ms_range=rng, gain_pct=gain,
                           why=f"{s.why}; {note}"))
    return out, warnings


def violations(report: ReportData) -> list[str]:
    """What in a finished report does not add up (3.); empty when all holds. Pure."""
    out = []
    eps = 0.01  # % rounding
    for r in report.ranks:
        for part in ("data", "compute", "comm", "comm_exposed", "wait", "other"):
            pct = r.part_pct(part)
            if not -eps <= pct <= 100 + eps or not np.isfinite(pct):
                out.append(f"rank {r.rank}: {part} {pct:.2f}% of step time")
            if r.part_ns(part) < 0:
                out.append(f"rank {r.rank}: {part} {r.part_ns(part) / MS:.3f} ms")
        total = r.data_pct + r.compute_pct + r.comm_exposed_pct + r.other_pct
        if r.steps and abs(total - 100) > 0.1:
            out.append(f"rank {r.rank}: data + compute + exposed + other = {total:.2f}%")
        if r.comm_exposed_pct > r.comm_pct + eps:
            out.append(f"rank {r.rank}: exposed {r.comm_exposed_pct:.2f}% > comm {r.comm_pct:.2f}%")
        if r.wait_pct > r.comm_exposed_pct + eps:
            out.append(f"rank {r.rank}: wait {r.wait_pct:.2f}% > exposed "
                       f"{r.comm_exposed_pct:.2f}%")
    for s in report.steps:
        for name in ("data_share", "comm_share", "wait_share", "compute_share", "host_share",
                     "bubble_share"):
            v = getattr(s, name)
            if not -1e-9 <= v <= 1 + 1e-9:
                out.append(f"step {s.step}: {name} {v:.4f}")
        if s.step_ns < 0:
            out.append(f"step {s.step}: step {s.step_ns} ns")
    if not 0 <= report.verdict.share <= 1 + 1e-9:
        out.append(f"verdict share {report.verdict.share}")
    for s in report.suggestions:
        if not (s.estimated_step_ms >= 0 and np.isfinite(s.gain_pct)):
            out.append(f"suggestion {s.knob}: {s.estimated_step_ms} ms, {s.gain_pct}%")
    out += below_floors(report)
    return out


def below_floors(report: ReportData) -> list[str]:
    """Estimates below what a straggler of the same report holds the step at (floors.py), for
    suggestions that do not fix it (another straggler's fix included) and do not move it."""
    from .floors import MOVES_FLOOR, fixes, floor_ms, rank_means

    frame = report.table.frame if report.table is not None else None
    if frame is None or not report.stragglers:
        return []
    out = []
    for st in report.stragglers:
        m = rank_means(frame, st.rank)
        for s in report.suggestions:
            if fixes(s, IMBALANCED, st.rank) or s.knob in MOVES_FLOOR:
                continue
            floor = floor_ms(m, s, report.knobs)
            if st.probable:  # it may be chance: the range reaches its floor (floors.py)
                rng = s.estimated_step_ms_range
                if rng is not None and rng[1] < floor - 0.01:
                    out.append(f"suggestion {s.knob}: range up to {rng[1]:.2f} ms, below the "
                               f"{floor:.2f} ms probable straggler rank {st.rank} holds the "
                               "step at")
                continue
            if s.estimated_step_ms < floor - 0.01:
                out.append(f"suggestion {s.knob}: {s.estimated_step_ms:.2f} ms below the "
                           f"{floor:.2f} ms straggler rank {st.rank} holds the step at")
    return out
