"""What `gpuscope try` measured on a machine, kept for the next estimates made there.

A model tuned elsewhere cannot know a user's node; a trial can. Each trial of a suggested value
leaves its estimate and what it measured (per step of the baseline's batch), with the same
round's baseline, the step of the run the estimate came from and that run's setup. They are
kept in one small JSON file per user (`$GPUSCOPE_CALIBRATION`, else
`$XDG_CACHE_HOME/gpuscope/calibration.json`, else `~/.cache/gpuscope/calibration.json`;
`GPUSCOPE_CALIBRATION=off`: none kept, none used), the last KEEP per host and knob. A trial's
ratio is what it measured against what the model gave, each over the mean baseline of its value's rounds where the machine moved (ratio()).
The next analysis of a run on that host scales each suggestion of a calibrated knob by its
trials' ratio there, and says so ("calibrated on this host by gpuscope try: 2 trial(s) of
num_workers measured 1.18-1.22x what the model gave ..."); its range is the trials' where they
measured this very change (calibrated()): their mean's 95% interval, for
the round-to-round noise of every trial kept for the host (host_noise()). An estimate without calibration says what it
assumes, as before. Anything wrong with the file (missing, damaged, another shape) leaves the
estimates as the model makes them.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time

from .knob_value import setting
from .trial_stats import interval, round_noise

ENV = "GPUSCOPE_CALIBRATION"
KEEP = 8          # trials kept per host and knob (the newest)
#: a ratio outside these is a trial gone wrong (a crash mid-way, another program), not kept
SANE = (0.05, 20.0)


def path() -> str | None:
    """The calibration file, or None when switched off."""
    told = os.environ.get(ENV, "").strip()
    if told.lower() == "off":
        return None
    if told:
        return told
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpuscope", "calibration.json")


def load(where: str | None = None) -> list[dict]:
    """The kept trials ([] when there are none, or the file cannot be read as one)."""
    where = path() if where is None else where
    if not where:
        return []
    try:
        with open(where, encoding="utf-8") as fh:
            got = json.load(fh)
    except (OSError, ValueError):
        return []
    trials = got.get("trials") if isinstance(got, dict) else None
    return [t for t in trials if _ok(t)] if isinstance(trials, list) else []


def _ok(t) -> bool:
    return (isinstance(t, dict) and isinstance(t.get("host"), str) and isinstance(t.get("knob"), str)
            and all(isinstance(t.get(k), (int, float)) and not isinstance(t.get(k), bool)
                    and t[k] > 0 for k in ("estimated_ms", "measured_ms")))


def add(trials: list[dict], where: str | None = None) -> str | None:
    """Keep `trials` ({host, knob, value, estimated_ms, measured_ms, run}) with the others, the
    newest KEEP per host and knob; the file's path, or None (switched off, or it cannot be
    written: the trials' results stand without it)."""
    where = path() if where is None else where
    new = [dict(t, when=time.strftime("%Y-%m-%dT%H:%M:%S")) for t in trials if _ok(t)
           and SANE[0] <= ratio(t) <= SANE[1]]
    if not where or not new:
        return None
    kept = load(where) + new
    out, count = [], {}
    for t in reversed(kept):
        key = (t["host"], t["knob"])
        count[key] = count.get(key, 0) + 1
        if count[key] <= KEEP:
            out.append(t)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(where)), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(where)), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"trials": out[::-1]}, fh, indent=1)
        os.replace(tmp, where)
    except OSError:
        return None
    return where


#: what a run's setup is for calibration: a trial of the same value from a run of the same setup
#: measured the very change an estimate is for
SETUP = ("world_size", "local_world_size", "param_bytes", "params", "batch_size",
         "sync_interval", "num_workers", "cpus_available", "device")


def setup(knobs: dict) -> dict:
    """The knobs of SETUP a run's report holds."""
    return {k: knobs[k] for k in SETUP if isinstance(knobs.get(k), (int, float, str))}


def ratios(hosts: set[str], trials: list[dict] | None = None) -> dict[str, list[float]]:
    """{knob: the measured / estimated ratios of its trials on one of `hosts`}."""
    return {k: [r for r, _ in v] for k, v in _trials_by_knob(hosts, trials).items()}


def _trials_by_knob(hosts: set[str], trials: list[dict] | None) -> dict[str, list[tuple]]:
    """{knob: [(ratio, the trial)]} of the trials on one of `hosts` (ratio(), each over its
    group's mean baseline: _group_baselines)."""
    mine = [t for t in (load() if trials is None else trials) if t["host"] in hosts]
    base = _group_baselines(mine)
    out: dict[str, list[tuple]] = {}
    for t in mine:
        out.setdefault(t["knob"], []).append((ratio(t, base.get(_group(t))), t))
    return out


def _group(t: dict) -> tuple:
    """The rounds of one value tried from one run: one configuration measured again."""
    return (t.get("run"), t["knob"], str(t.get("value")))


def _group_baselines(trials: list[dict]) -> dict[tuple, tuple[float, float]]:
    """{group: (the mean of its rounds' baselines, how far it is known: twice its standard error,
    a share of it; DRIFT for a single round)}: how fast the machine ran the baseline while that
    value was tried (one mean: a round's own baseline is noisy, and over it the rounds of one
    value spread twice as far on this project's 2-core VM)."""
    got: dict[tuple, list[float]] = {}
    for t in trials:
        b = t.get("baseline_ms")
        if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0:
            got.setdefault(_group(t), []).append(float(b))
    out = {}
    for g, v in got.items():
        mean = statistics.mean(v)
        out[g] = (mean, 2 * statistics.stdev(v) / math.sqrt(len(v)) / mean if len(v) > 1
                  else DRIFT)
    return out


#: a single round's baseline this far from the step of the run its estimate came from: the
#: machine ran slower or faster during the trials (two runs of one configuration on this
#: project's shared 2-core VM moved by 1-33%, median 9%: within it, the baseline's own noise)
DRIFT = 0.10


def _normalized(t: dict, baseline: tuple[float, float] | None = None) -> bool:
    """Whether a trial's ratio is taken over the baseline: its group's mean where that is
    further from the report's step than it is known to (twice its standard error), else its own
    round's where that is further than DRIFT (ratio())."""
    b, margin = baseline or (t.get("baseline_ms"), DRIFT)
    r = t.get("report_step_ms")
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
               for x in (b, r)) and abs(b / r - 1) > margin


def ratio(t: dict, baseline: tuple[float, float] | None = None) -> float:
    """What a trial measured over what the model gave: the measured step over the estimate;
    where the machine moved between the run the estimate came from and the trials (_normalized:
    `baseline` the group's mean baseline and its margin, else the trial's own round's), each over
    its own basis: within that margin a baseline's own noise, a comm-bound one's above all,
    would move the ratio more than it corrects. Every round of a group is taken alike."""
    if _normalized(t, baseline):
        b = baseline[0] if baseline else t["baseline_ms"]
        return (t["measured_ms"] / b) / (t["estimated_ms"] / t["report_step_ms"])
    return t["measured_ms"] / t["estimated_ms"]


def _same_change(found: list[tuple], s, knobs: dict | None) -> list[tuple]:
    """(ratio, its trial's mean error as a share) of the trials that measured this very change:
    the value this suggestion proposes, tried from a run of this run's setup (knobs None:
    none)."""
    if knobs is None:
        return []
    here, value = setup(knobs), setting(s.proposed)
    return [(r, _se(t)) for r, t in found if t.get("setup") == here and t.get("value") == value]


def _se(t: dict) -> float:
    """A trial's ratio's standard error, a share of it: its mean's, and its baseline's where the
    ratio is over it."""
    def share(key: str) -> float:
        se = t.get(key)
        return float(se) if isinstance(se, (int, float)) and 0 <= se < 1 else 0.0
    own = share("rel_se")
    return math.hypot(own, share("baseline_rel_se")) if _normalized(t) else own


def host_noise(found: dict[str, list[tuple]]) -> tuple[float, int] | None:
    """How far one round of a trial strays from its configuration's mean on this host, pooled
    over every configuration tried there (the rounds of one `try` of one value: one group), with
    its degrees of freedom (trial_stats.round_noise); None under two rounds of one."""
    groups: dict[tuple, list[float]] = {}
    for knob, got in found.items():
        for r, t in got:
            groups.setdefault(_group(t), []).append(r)
    return round_noise(list(groups.values()))


def calibrated(suggestions: list, hosts: set[str], typical_ms: float,
               trials: list[dict] | None = None, knobs: dict | None = None) -> list:
    """Each suggestion of a knob trials calibrated on one of `hosts`: its estimate times their
    median ratio, its gain again, said. Its range: where trials measured this very change (the
    same value from a run of this setup, `knobs`), what they measured, scaled to the point: the
    model's assumptions are settled, their spread is the trials'; otherwise the model's range
    times their lowest and highest ratio."""
    from dataclasses import replace

    found = _trials_by_knob({h for h in hosts if h}, trials)
    if not found:
        return suggestions
    noise = host_noise(found)
    out = []
    for s in suggestions:
        rs = [r for r, _ in found.get(s.knob, ())]
        if not rs:
            out.append(s)
            continue
        same = _same_change(found[s.knob], s, knobs)
        lo, hi = s.estimated_step_ms_range or (s.estimated_step_ms,) * 2
        if same:  # what they measured: their mean ratio's 95% interval
            r, h = interval([x for x, _ in same], noise, [e for _, e in same])
            point = s.estimated_step_ms * r
            rng = (point * max(1 - h, 0.05), point * (1 + h))
            what = (f"{len(same)} trial(s) of this change ({s.knob} -> {setting(s.proposed)}, "
                    f"from a run of this setup) measured {min(x for x, _ in same):.2f}-"
                    f"{max(x for x, _ in same):.2f}x what the model gave; the range is theirs: "
                    "their mean's 95% interval" + (
                        f" (a round strays {noise[0]:.1%} on this host, {noise[1]} degree(s) of "
                        "freedom)" if noise else ", from their steps' spread"))
        else:
            r = statistics.median(rs)
            point = s.estimated_step_ms * r
            rng = (min(lo * min(rs), point), max(hi * max(rs), point))
            what = (f"{len(rs)} trial(s) of {s.knob} measured {min(rs):.2f}-{max(rs):.2f}x what "
                    "the model gave")
        said = (f"; calibrated on this host by gpuscope try: {what}, so "
                f"{s.estimated_step_ms:.1f} -> {point:.1f} ms ({path()})")
        out.append(replace(s, estimated_step_ms=point, estimated_step_ms_range=rng,
                           gain_pct=(typical_ms / max(point, 1e-9) - 1) * 100,
                           why=s.why + said, measured_share=h if same else None))
    return out


def noise_for(hosts: set[str], trials: list[dict] | None = None) -> tuple[float, int] | None:
    """How far one run strays on one of `hosts`, measured by the rounds of the trials kept for
    it (host_noise): (share, degrees of freedom); None without two rounds of one
    configuration there."""
    return host_noise(_trials_by_knob({h for h in hosts if h}, trials))
