"""`gpuscope try`: the suggested changes measured, not only modelled.

From a report (a run dir, traces, or its JSON) and the user's own command with the knobs as
placeholders (``torchrun ... train.py --num-workers {num_workers} --batch-size {batch_size}``),
the baseline and each value to try are run for a short, fixed number of micro-steps after a
warm-up, interleaved (A B C A B C ...), each recording into a run dir of its own
($GPUSCOPE_RUN_DIR) and ended by the recorder after the same micro-step on every rank
($GPUSCOPE_STOP_AFTER). Each trial's run dir is analysed like any other (its warm-up left out);
its step is the report's (the slowest rank's mean), per today's global batch where the batch
changes. What is printed beside each value: the measured step over the repeats, the gain
against the baseline of the same round (its spread over the rounds), gpuscope's estimate and
whether the measured step fell inside its range. A knob a suggestion names that the command
does not hold is named, never guessed; a trial that fails (a crash, an out-of-memory at a larger
batch) is reported as such and the others go on.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import time
from dataclasses import dataclass, field

from .analyze.rerun_noise import TRIABLE
from .errors import GpuscopeError
from .knob_value import setting
from .trial_stats import interval, round_noise
from .record.options import RUN_DIR_ENV, STOP_AFTER_ENV

#: {knob}, or {knob*N} where the command counts the knob N times over (nanoGPT's
#: gradient_accumulation_steps counts micro-steps over all ranks: {sync_frequency*8} on 8 ranks)
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\*([0-9]+))?\}")
#: a suggestion's knob -> the report knob that holds its current value, where they differ
CURRENT_KNOB = {"sync_frequency": "sync_interval"}
#: knobs whose value scales the samples a step trains (the step is compared per global batch)
BATCH_KNOBS = ("batch_size",)


@dataclass
class Candidate:
    """One configuration to run: the baseline or one knob at one value."""

    label: str
    values: dict                      # every placeholder's value
    knob: str | None = None           # the knob changed (None: the baseline)
    estimate: float | None = None     # gpuscope's estimated step (ms), where it made one
    estimate_range: tuple | None = None
    steps_ms: list = field(default_factory=list)   # measured step per round (None: failed)
    failures: list = field(default_factory=list)   # what went wrong, per failed round
    rel_se: list = field(default_factory=list)     # per round: its mean's error, a share (None)
    host: str = ""                    # where its trials ran (their record's rank 0)


@dataclass
class Plan:
    """What `gpuscope try` will run."""

    command: list[str]
    candidates: list[Candidate]
    not_in_command: list[str]         # suggestions whose knob the command does not hold
    warmup: int
    steps: int
    repeats: int
    #: micro-steps per optimizer step in the report's run (its estimates' basis), None unknown
    base_every: int | None = None
    #: why the measured steps are more than asked ("" when they are not)
    steps_why: str = ""


#: an epoch of at most this many batches sets a trial's measured steps to a whole epoch: each
#: epoch's start (an empty loader queue, workers restarting) then weighs in a trial as in the
#: training (the demo's 32-batch epochs: one epoch start took 51-128 ms against ~5 ms steps);
#: longer epochs spread it too thin to matter
EPOCH_TRIAL_MOST = 200


def placeholders(command: list[str]) -> list[str]:
    """The {knob} names of the command, in order of first appearance."""
    seen: list[str] = []
    for arg in command:
        for name in (m.group(1) for m in PLACEHOLDER.finditer(arg)):
            if name not in seen:
                seen.append(name)
    return seen


def filled(command: list[str], values: dict) -> list[str]:
    """The command with each {knob} it holds replaced by its value, {knob*N} by N times it
    (other braces untouched)."""
    def value(m: re.Match) -> str:
        if m.group(1) not in values:
            return m.group(0)
        v = values[m.group(1)]
        if m.group(2) is None:
            return str(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GpuscopeError(f"{m.group(0)}: {m.group(1)} is {v!r}, not a number to multiply")
        return str(v * int(m.group(2)))
    return [PLACEHOLDER.sub(value, arg) for arg in command]


def parse_knob_values(specs: list[str]) -> dict[str, list]:
    """--knob NAME=V1,V2 (repeatable) -> {name: [values]}; integers as ints."""
    out: dict[str, list] = {}
    for spec in specs or []:
        name, sep, values = spec.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise GpuscopeError(f"--knob {spec!r}: expected NAME=VALUE[,VALUE...]")
        out.setdefault(name.strip(), []).extend(_value(v.strip()) for v in values.split(",")
                                                if v.strip())
    return out


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def make_plan(report: dict, command: list[str], knob_values: dict[str, list] | None = None,
              base: dict | None = None, top: int = 3, warmup: int = 5, steps: int = 20,
              repeats: int = 3) -> Plan:
    """The baseline and the values to try: `knob_values` where given, else the report's top
    suggestions whose knob the command holds as a placeholder. The baseline's values: `base`,
    else each suggestion's current value, else the report's knob; a placeholder none of them
    gives is an error that names it."""
    names = placeholders(command)
    if not names:
        raise GpuscopeError("the command holds no {knob} placeholder to vary (e.g. "
                            "--num-workers {num_workers})")
    knobs = report.get("knobs") or {}
    suggestions = [{**s, "current": setting(s.get("current")),
                    "proposed": setting(s.get("proposed"))}
                   for s in report.get("suggestions") or [] if s.get("knob")]
    current: dict = {}  # each knob's current value, as its first suggestion says it
    for s in suggestions:
        if s.get("current") is not None:
            current.setdefault(s["knob"], s["current"])
    values = {}
    for name in names:
        if base and name in base:
            values[name] = base[name]
        elif name in current:
            values[name] = current[name]
        elif knobs.get(CURRENT_KNOB.get(name, name)) is not None:
            values[name] = knobs[CURRENT_KNOB.get(name, name)]
        else:
            raise GpuscopeError(f"{{{name}}}: the report does not say its current value; give "
                                f"the baseline's with --base {name}=VALUE")
    cands = [Candidate("baseline", dict(values))]
    not_in: list[str] = []
    if knob_values:
        for name, vals in knob_values.items():
            if name not in names:
                raise GpuscopeError(f"--knob {name}: the command has no {{{name}}} placeholder")
            for v in vals:
                cands.append(_candidate(name, v, values, suggestions))
    else:
        for s in suggestions:
            if s["knob"] not in names and s["knob"] not in TRIABLE:
                continue  # a straggler's or a layout's fix: no value a command takes
            if s["knob"] not in names:
                not_in.append(f"{s['knob']} -> {s.get('proposed')}: the command has no "
                              f"{{{s['knob']}}} placeholder (add the flag that sets it to try it)")
                continue
            if len(cands) - 1 < top and s.get("proposed") is not None:
                cands.append(_candidate(s["knob"], s["proposed"], values, suggestions))
    if len(cands) == 1:
        raise GpuscopeError("nothing to try: no suggestion names a knob of the command"
                            + (f" ({'; '.join(not_in)})" if not_in else "")
                            + "; name values with --knob NAME=V1,V2")
    every = knobs.get("sync_interval")
    every = every if isinstance(every, int) and every > 0 else None
    epoch, why = knobs.get("batches_per_epoch"), ""
    if isinstance(epoch, int) and epoch <= EPOCH_TRIAL_MOST:
        whole = math.ceil(epoch / (every or 1))  # optimizer steps that load an epoch's batches
        if whole > steps:
            steps, why = whole, (f"a whole epoch ({epoch} batches), so that its start weighs in "
                                 "as in the training")
    return Plan(list(command), cands, not_in, warmup, steps, repeats, every, why)


def _candidate(name: str, value, values: dict, suggestions: list) -> Candidate:
    sug = next((s for s in suggestions if s["knob"] == name and s.get("proposed") == value),
               None)
    rng = sug.get("estimated_step_ms_range") if sug else None
    return Candidate(f"{name}={value}", {**values, name: value}, name,
                     sug.get("estimated_step_ms") if sug else None,
                     tuple(rng) if rng else None)


def micro_steps(plan: Plan, cand: Candidate) -> int:
    """Micro-steps a trial records: the warm-up and the measured steps, each an optimizer step
    of as many micro-steps as the candidate syncs every (sync_frequency), else one."""
    every = cand.values.get("sync_frequency", 1)
    every = every if isinstance(every, int) and every > 0 else 1
    return (plan.warmup + plan.steps) * every


def run_trial(plan: Plan, cand: Candidate, run_dir: str, timeout_s: float) -> tuple:
    """(measured step ms per today's global batch or None, what failed or None)."""
    env = dict(os.environ, **{RUN_DIR_ENV: run_dir, STOP_AFTER_ENV: str(micro_steps(plan, cand))})
    try:
        proc = subprocess.run(filled(plan.command, cand.values), env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"did not end within {timeout_s:.0f} s"
    except OSError as exc:
        return None, f"could not start: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or [""]
        oom = "out of memory" in (proc.stderr or "").lower()
        return None, (("out of memory: " if oom else "") + f"exit status {proc.returncode}: "
                      f"{tail[0][:200]}")
    return measured_step(run_dir, plan, cand)


def measured_step(run_dir: str, plan: Plan, cand: Candidate) -> tuple:
    """The trial's step (ms): its report's (the slowest rank's mean over the analysed steps),
    on the estimates' basis: per optimizer step of the report's run (its micro-steps per
    optimizer step; per micro-step where the report does not say), scaled to the baseline's
    batch where the batch size changed."""
    from .analyze.run import analyze_table
    from .errors import InputError, TraceFormatError
    from .readers import read_path
    from .thresholds import Thresholds

    try:  # with accumulation the analysis's steps are optimizer steps: the warm-up is of those
        table = read_path(run_dir)  # read once: its micro-steps counted, then analysed
        recorded = table.frame.groupby("rank").size()
        rep = analyze_table(table, Thresholds(), skip=plan.warmup, own=True).to_dict()
    except (InputError, TraceFormatError) as exc:
        return None, f"its record could not be analysed: {exc}"
    need = micro_steps(plan, cand)
    if len(recorded) and int(recorded.min()) < need:  # it ended on its own, before the trial's end
        return None, (f"the command ended after {int(recorded.min())} of the {need} micro-steps "
                      "this trial records: let it run longer (its own step count)")
    ranks = [r.get("step_ms") for r in rep.get("ranks") or [] if r.get("step_ms")]
    if not ranks:
        return None, "no step recorded (is gpuscope.record around the loop?)"
    cand.host = str((rep.get("ranks") or [{}])[0].get("host") or "")
    # on the estimates' basis: an optimizer step of K micro-steps over K, times the report's
    every = (rep.get("knobs") or {}).get("sync_interval")
    step = max(ranks) / (every if isinstance(every, int) and every > 0 else 1)
    step *= plan.base_every or 1
    for knob in BATCH_KNOBS:
        now, then = cand.values.get(knob), None
        if isinstance(now, (int, float)) and now > 0:
            then = plan.candidates[0].values.get(knob)
        if isinstance(then, (int, float)) and then > 0 and now != then:
            step *= then / now
    cand.rel_se.append(rel_se([x.get("step_ms") for x in rep.get("steps") or []]))
    return step, None


def rel_se(steps_ms: list) -> float:
    """The standard error of a trial's mean step, as a share of it: what its own steps' spread
    leaves unknown of the mean (a step of 80 ms at each epoch's start among 5 ms ones leaves
    much); 0 under 2 steps."""
    x = [v for v in steps_ms if isinstance(v, (int, float))]
    if len(x) < 2 or statistics.mean(x) <= 0:
        return 0.0
    return statistics.stdev(x) / len(x) ** 0.5 / statistics.mean(x)


def round_ratios(base: Candidate, c: Candidate) -> list:
    """Each round's candidate step over the same round's baseline (None where either failed)."""
    return [s / b if b and s else None for b, s in zip(base.steps_ms, c.steps_ms)]


def gain_spread(cands: list[Candidate], c: Candidate) -> tuple[float, float] | None:
    """(the rounds' mean step ratio of c over the baseline, the half-width, as a share of it, of
    the 95% interval a repeat of as many rounds falls in): the round-to-round noise pooled over
    every candidate of the trial (trial_stats); None without a round that ran both."""
    base = cands[0]
    noise = round_noise([round_ratios(base, o) for o in cands[1:]])
    q = round_ratios(base, c)
    errs = [math.hypot(_at(base.rel_se, i), _at(c.rel_se, i)) for i in range(len(q))]
    return interval(q, noise, errs, repeat=True)


def spread_pct(cands: list[Candidate], c: Candidate) -> float | None:
    """gain_spread's half-width in % of the ratio; None under two rounds that both ran."""
    got = gain_spread(cands, c)
    if got is None or sum(1 for q in round_ratios(cands[0], c) if q) < 2:
        return None
    return 100 * got[1]


def settled(cands: list[Candidate], precision_pct: float) -> bool:
    """Whether a repeat of every candidate's gain is known to fall within +-precision_pct
    (spread_pct)."""
    for c in cands[1:]:
        w = spread_pct(cands, c)
        if w is None or w > precision_pct:
            return False
    return True


def run_plan(plan: Plan, out_dir: str, timeout_s: float = 600.0, say=None,
             precision_pct: float | None = None, most: int = 8,
             budget_s: float = 900.0) -> list[Candidate]:
    """Every candidate, interleaved, `plan.repeats` rounds; with `precision_pct`, more rounds
    (up to `most`) while a repeat of a gain is not known within +-that much and another round
    fits in `budget_s`, the seconds the added rounds may take (the least rounds run whatever
    they take). Each trial in out_dir/NN-label-rR."""
    os.makedirs(out_dir, exist_ok=True)
    r, added = 0, 0.0  # rounds run; seconds the rounds past the least have taken
    while True:
        t = time.perf_counter()
        _round(plan, out_dir, r, timeout_s, say)
        r += 1
        per = time.perf_counter() - t
        if r > plan.repeats:
            added += per
        if r < plan.repeats:
            continue
        if precision_pct is None or r >= most or settled(plan.candidates, precision_pct) \
                or added + per > budget_s:
            break
        if say is not None:
            say(f"a repeat of a gain is not known within +-{precision_pct:g}% yet: round {r + 1}")
    plan.repeats = r
    return plan.candidates


def _round(plan: Plan, out_dir: str, r: int, timeout_s: float, say) -> None:
    """One round: every candidate once, in order."""
    for i, cand in enumerate(plan.candidates):
        where = os.path.join(out_dir, f"{i:02d}-{_safe(cand.label)}-r{r + 1}")
        t = time.perf_counter()
        step, failed = run_trial(plan, cand, where, timeout_s)
        cand.steps_ms.append(step)
        if step is None:  # measured_step keeps a measured round's error
            cand.rel_se.append(None)
        if failed:
            cand.failures.append(f"round {r + 1}: {failed}")
        if say is not None:
            said = f"{step:.2f} ms/step" if step is not None else f"failed ({failed})"
            say(f"round {r + 1}: {cand.label}: {said} [{time.perf_counter() - t:.0f} s]")


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:60]


def summary(cands: list[Candidate]) -> list[dict]:
    """Per candidate: its measured step (median and range of the rounds, and each round's), the
    gain against the baseline of the same round (that of the rounds' mean ratio, and where a
    repeat lands: gain_interval), the estimate and whether the measured step fell inside its
    range."""
    out = []
    for c in cands:
        ok = [s for s in c.steps_ms if s is not None]
        row: dict = {"label": c.label, "knob": c.knob, "value": c.values.get(c.knob) if c.knob
                     else None, "rounds": len(c.steps_ms), "failed": len(c.steps_ms) - len(ok),
                     "failures": c.failures,
                     "step_ms": round(statistics.median(ok), 3) if ok else None,
                     "step_ms_range": [round(min(ok), 3), round(max(ok), 3)] if ok else None,
                     "rounds_ms": [None if s is None else round(s, 3) for s in c.steps_ms]}
        got = gain_spread(cands, c) if c.knob is not None else None
        if got is not None:
            row["gain_pct"] = round((1 / got[0] - 1) * 100, 1)
            lo, hi = gain_interval(got)
            # a repeat may measure any gain above lo: no upper end (None)
            row["gain_pct_range"] = [round(lo, 1), round(hi, 1) if math.isfinite(hi) else None]
        if c.estimate is not None:
            row["estimated_step_ms"] = c.estimate
            row["estimated_step_ms_range"] = list(c.estimate_range) if c.estimate_range else None
            if ok and c.estimate_range:
                lo, hi = c.estimate_range
                row["within_range"] = bool(lo <= row["step_ms"] <= hi)
        out.append(row)
    best = min((r for r in out if r["step_ms"] is not None), key=lambda r: r["step_ms"],
               default=None)
    for r in out:
        r["best"] = r is best
    return out


def gain_interval(spread: tuple[float, float]) -> tuple[float, float]:
    """(low, high) gain %: where a repeat of as many rounds lands 95 times in 100, from a
    candidate's gain_spread (its mean step ratio and the interval's half-width as a share of
    it); high is infinite where the interval reaches a step of 0."""
    r, h = spread
    return (1 / (r * (1 + h)) - 1) * 100, (1 / (r * (1 - h)) - 1) * 100 if h < 1 else math.inf


def _at(values: list, i: int) -> float:
    v = values[i] if i < len(values) else None
    return v if isinstance(v, (int, float)) else 0.0


def default_out(report_path: str) -> str:
    """Where the trials' run dirs go: beside the report's run, try-<time>."""
    parent = os.path.dirname(os.path.abspath(report_path.rstrip("/"))) or "."
    return os.path.join(parent, time.strftime("try-%Y%m%d-%H%M%S"))


def calibration_trials(cands: list[Candidate], rows: list[dict], run: str,
                       knobs: dict | None = None, report_step_ms: float | None = None
                       ) -> list[dict]:
    """What the trials teach the next estimates on their host (calibration.py): per candidate
    with an estimate, each round's measured step against it, with the same round's baseline and
    the step of the report the estimate was made from (a machine slower during the trials than
    during that run moves both: calibration compares the ratios), and the setup of the report's
    run (calibration.setup)."""
    from .calibration import setup

    out, where = [], setup(knobs or {})
    for c, row in zip(cands, rows):
        if c.knob is None or c.estimate is None or not c.host:
            continue
        base = cands[0]
        for i, m in enumerate(c.steps_ms):
            if m is None:
                continue
            t = {"host": c.host, "knob": c.knob, "value": row["value"], "estimated_ms": c.estimate,
                 "measured_ms": m, "rel_se": _at(c.rel_se, i), "run": run, "setup": where}
            b = base.steps_ms[i] if i < len(base.steps_ms) else None
            if b and report_step_ms:
                t.update(baseline_ms=b, report_step_ms=report_step_ms,
                         baseline_rel_se=_at(base.rel_se, i))
            out.append(t)
    return out
