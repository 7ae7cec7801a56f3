"""What a re-run's own noise adds to every estimate's range.

A suggestion's range holds what its model had to assume; the re-run it promises also lands where
the machine's state puts it. Re-runs of unchanged settings on this project's shared 2-core VM
(benchmarks/bench_whatif.py, BEFORE and AFTER alternated) fell outside their model's range by up to
11% where the run itself had not drifted, and further where it had (a run 24% slower in its second
half than its first missed by 16%). So each range is widened both ways by the larger of the
device's RERUN_NOISE and twice the run's own drift: the change of its median step from the first
half of its analysed steps to the second (with at least MIN_STEPS of them; fewer say nothing of
it). A GPU's re-run noise is not measured here: there the run's own drift alone widens it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

#: the least a re-run's noise moves its mean step, as a share of it, by device (re-runs of
#: unchanged settings on a shared 2-core VM: up to 11% beyond their model's range)
RERUN_NOISE = {"cpu": 0.10}
#: the fewest analysed steps whose halves tell a drift
MIN_STEPS = 8
#: the most it is taken to move it: past this a range says little
MOST = 0.5


def drift(step_ns: list[int] | np.ndarray) -> float:
    """|median of the second half - median of the first| / median, over the analysed steps in
    order (medians: a few long steps are the run's spread, not its drift); 0 with fewer than
    MIN_STEPS."""
    s = np.asarray(step_ns, dtype=float)
    if s.size < MIN_STEPS or np.median(s) <= 0:
        return 0.0
    h = s.size // 2
    return float(abs(np.median(s[h:]) - np.median(s[:h])) / np.median(s))


def band(step_ns, knobs: dict, measured: tuple[float, int] | None = None) -> tuple[float, str]:
    """(the share a re-run may move the mean step either way, what sets it). `measured`: how far
    one run strays on this host, as trials measured it (calibration.noise_for: share, degrees of
    freedom): where its 95% band is wider than the device's least (RERUN_NOISE, which also holds
    what moves a machine between sessions), that band."""
    from ..trial_stats import t95
    from .whatif import device_kind

    least, what = RERUN_NOISE.get(device_kind(knobs), 0.0), ""
    if measured is not None and t95(measured[1]) * measured[0] > least:
        share, df = measured
        least = min(t95(df) * share, MOST)
        what = (f"one run on this host strays {share:.1%}, as gpuscope try's rounds measured "
                f"it ({df} degree(s) of freedom): 95% of re-runs within +-{least:.0%}")
    d = drift(step_ns)
    if 2 * d > least:
        return (min(2 * d, MOST),
                f"twice this run's {d:.0%} drift from its first half to its second")
    return least, what


#: a re-run's noise past this share either way: a trial, not a model, tells what a change gains
TRIAL_FROM = 0.25
#: the suggestions' knobs a training command sets (a flag, a config value): `gpuscope try` can
#: run them; a straggler's or a layout's fix is not one value to try
TRIABLE = frozenset({"num_workers", "persistent_workers", "pin_memory", "prefetch_factor",
                     "batch_size", "sync_frequency", "n_microbatches", "grad_compression",
                     "mixed_precision", "reshard_after_forward"})


def widen(suggestions: list, step_ns, knobs: dict,
          measured: tuple[float, int] | None = None) -> list:
    """Each suggestion's range widened by the re-run noise band (band(), said on it): a model's
    range by the band at each end; a range trials of this very change measured (its
    measured_share, a 95% interval of their mean) by what the band adds to it in quadrature,
    the two errors being independent (the point's and the re-run's own). Where the noise alone
    passes TRIAL_FROM, each suggestion a command sets (TRIABLE) says that a trial is the way to
    know, and how to run one (`gpuscope try`)."""
    w, what = band(step_ns, knobs, measured)
    if w <= 0:
        return suggestions
    note = f"; the range also holds a re-run's noise, +-{w:.0%}" + (f" ({what})" if what else "")
    out = []
    for s in suggestions:
        lo, hi = s.estimated_step_ms_range or (s.estimated_step_ms,) * 2
        h = s.measured_share
        grow = w if h is None else (h * h + w * w) ** 0.5 - h
        trial = ""
        if w > TRIAL_FROM and s.knob in TRIABLE:
            trial = (f"; the noise alone is wider than +-{TRIAL_FROM:.0%}: a trial is the way to "
                     f"know: gpuscope try RUN -- COMMAND (RUN: this run; COMMAND: your "
                     f"training's, its {s.knob} written {{{s.knob}}})")
        said = note if h is None else note + ", added to the trials' interval in quadrature"
        out.append(replace(s, estimated_step_ms_range=(lo * (1 - grow), hi * (1 + grow)),
                           why=s.why + said + trial))
    return out
