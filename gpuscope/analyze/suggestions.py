"""The suggestion dispatch: each bottleneck present (the verdict, a label holding a material share,
or a secondary one) asks its own module (analyze/bottlenecks/) for suggestions; they come back
best estimated gain first, with why none was made where a label got none."""

from __future__ import annotations

from ..results import Suggestion
from .bottlenecks.table import TABLE
from .findings import Findings, TypicalStep, typical_step


def suggest(found: Findings, t: TypicalStep | None = None
            ) -> tuple[list[Suggestion], dict[str, str]]:
    """(suggestions for every bottleneck present, best estimated gain first; label -> why none
    was made for it). `t`: the typical step, when already known. Each bottleneck of the table
    (bottlenecks/table.py) that the findings ask (its SPEC's `asks`: its label, or a share that
    matters, e.g. jitter steps holding 20% of the time) makes its own (its `suggest`)."""
    if found.frame.empty:
        return [], {}
    t = t or typical_step(found.frame)
    out: list[Suggestion] = []
    why_not: dict[str, str] = {}
    for b in TABLE:
        if b.asks is None or not b.asks(found):
            continue
        got, why = b.suggest(found, t)
        out += got
        if why:
            why_not[b.label] = why
    return sorted(out, key=lambda s: -s.gain_pct), why_not


def unaddressed(why_not: dict[str, str], label: str, suggestions: list[Suggestion]) -> str:
    """Why no suggestion addresses the verdict `label` ("" when one does); `why_not`: what
    suggest() said of the labels it made none for."""
    if any(s.addresses == label for s in suggestions):
        return ""
    why = why_not.get(label) or "no change with a measurable gain could be estimated"
    return f"no suggestion for {label}: {why}"


#: suggestions whose throughput gains are this close (relative, on 1 + gain) are a tie: two
#: measurements of one run (its record and its traces, or two runs) put them either way round
#: (seen: "sync every 32 steps" 28.94 ms and "batch 4" 29.43 ms from a record, the other order
#: from the traces of the same steps)
TIE = 0.05
#: how far a change alters the training's maths, for a tie: changes that leave it alone come
#: first, then the smaller change (2x the batch before 32x the global batch by accumulating)
MATHS_CHANGE = {"batch_size": 1, "reshard_after_forward": 0, "mixed_precision": 2,
                "grad_compression": 2, "sync_frequency": 3}


#: a label holding at least this part of the verdict's share of time leads with it: its fixes
#: compete with the verdict's by gain. Two measurements of one run put the verdict's lead either
#: side of a near tie's edge (seen: jitter-bound 53% / comm-bound 47% from a record, 58% / 42%
#: from the traces of the same steps), never 2:1 one way and 1:2 the other.
LEAD_RATIO = 0.5


def leading_labels(verdict) -> set[str]:
    """The verdict's label and any other holding at least LEAD_RATIO of its share of time (a
    near tie, "either could be the verdict", among them): the labels whose fixes come first."""
    return {verdict.label} | {k for k, v in verdict.time_by_label.items()
                              if v >= LEAD_RATIO * verdict.share}


def in_order(suggestions: list, leading: set[str], held: set[str]) -> list:
    """The fixes of the leading labels first (leading_labels: in a near tie of two labels, either
    could be the verdict and the record and the traces of one run can name either), each group
    by gain; then break_ties; then each suggestion that names a label to come after (`after`)
    behind that label's fixes that gain."""
    ordered = sorted(suggestions, key=lambda s: (s.addresses not in leading, -s.gain_pct))
    return _after_their_fixes(break_ties(ordered, leading, held))


def _after_their_fixes(ordered: list) -> list:
    """Each suggestion with `after` moved behind the suggestions of that label that gain and
    come after it: a straggler late in its data where every rank loads with one DataLoader
    configuration behind the data's fixes (more workers, ...), which fix its loading whether it
    is slower there or as short on every rank (the record cannot tell them apart:
    imbalance._straggler_fix), where matching the median rank pays in the first reading only
    (an own 2-rank script, 1 worker each: the straggler first in 2 of 3 runs, a different rank
    each time, no straggler in the third)."""
    for s in [s for s in ordered if s.after]:
        at = next(i for i, x in enumerate(ordered) if x is s)
        first = [x for x in ordered[at + 1:] if x.addresses == s.after and x.gain_pct > 0]
        rest = [x for x in ordered[at:] if not any(x is f for f in first)]
        ordered = ordered[:at] + first + rest
    return ordered


def break_ties(ordered: list, leading: set[str], held: set[str]) -> list:
    """`ordered` (best first) with the suggestions tied with the first (TIE) put in one fixed
    order: an estimate of its own before one held at another finding's floor (floors.py: that
    finding is the constraint), then the smaller change to the training's maths, then by knob.
    Only the lead is reordered; a clear winner stays first."""
    if len(ordered) < 2:
        return ordered
    lead = 1 + ordered[0].gain_pct / 100
    first = ordered[0].addresses in leading
    n = 1
    while n < len(ordered) and lead <= (1 + TIE) * (1 + ordered[n].gain_pct / 100) and (
            (ordered[n].addresses in leading) == first):
        n += 1
    tied = sorted(ordered[:n], key=lambda s: (s.knob in held, MATHS_CHANGE.get(s.knob, 0),
                                              s.knob))
    return tied + ordered[n:]

