"""The suggestion dispatch: each bottleneck present (the verdict, a label holding a material share,
or a secondary one) asks its own module (analyze/bottlenecks/) for suggestions; they come back
best estimated gain first, with why none was made where a label got none."""

from __future__ import annotations

from ..results import Suggestion
from ..vocab import COMM, DATA, HOST, IMBALANCED, JITTER_BOUND
from .bottlenecks.comm import suggest_comm
from .bottlenecks.data import suggest_data
from .bottlenecks.host import suggest_host
from .bottlenecks.imbalance import suggest_imbalance, suggest_jitter
from .findings import Findings, TypicalStep, typical_step


def suggest(found: Findings, t: TypicalStep | None = None
            ) -> tuple[list[Suggestion], dict[str, str]]:
    """(suggestions for every bottleneck present (label or secondary), best estimated gain
    first; label -> why none was made for it). `t`: the typical step, when already known.

    Jitter gets a suggestion when its steps hold a material share (>= 20%) of the time."""
    frame, labels, th, knobs = found.frame, found.labels, found.thresholds, found.knobs
    if frame.empty:
        return [], {}
    t = t or typical_step(frame)
    out: list[Suggestion] = []
    why_not: dict[str, str] = {}
    if IMBALANCED in labels:
        out += suggest_imbalance(t, found.stragglers, knobs, found.early_ranks, frame,
                                 found.exposed_by_kind, found.routing)
    if ((JITTER_BOUND in labels or found.jitter.steps_share >= 0.2)
            and found.jitter.wait_share > 0):
        out += suggest_jitter(t, found.jitter, found.stragglers)
    if DATA in labels or found.data_share >= th.data_moderate:
        data, why_not[DATA] = suggest_data(t, knobs, th)
        out += data
    if COMM in labels:
        out += suggest_comm(t, knobs, th, found.exposed_by_kind, found.micro, found.growth,
                            found.grad_share)
        if t.transfer <= 0:
            why_not[COMM] = ("comm-bound steps are a minority: the typical step has no exposed "
                             "transfer, so no change to how often gradients sync is suggested")
    if HOST in labels:
        out += suggest_host(t)
    return sorted(out, key=lambda s: -s.gain_pct), why_not


def unaddressed(why_not: dict[str, str], label: str, suggestions: list[Suggestion]) -> str:
    """Why no suggestion addresses the verdict `label` ("" when one does); `why_not`: what
    suggest() said of the labels it made none for."""
    if any(s.addresses == label for s in suggestions):
        return ""
    why = why_not.get(label) or "no change with a measurable gain could be estimated"
    return f"no suggestion for {label}: {why}"
