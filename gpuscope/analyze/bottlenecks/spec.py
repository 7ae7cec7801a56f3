"""What each bottleneck module declares of its label (SPEC): the per-step share column classify
computes for it, the Thresholds field that share is held to, and what a change that removes
the bottleneck can recover at most, in words and in ns (invariants.bound_suggestions).
when the findings ask it for suggestions, and how it makes them (one signature for all).
bottlenecks/table.py gathers them; confidence, invariants and the suggestions' dispatch read
them from there, and
tests/test_vocabulary.py fails when a label of vocab.LABELS has none."""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np


class Bottleneck(NamedTuple):
    label: str
    #: classify's per-step share column that holds the evidence
    share: str
    #: the Thresholds field the share is held to
    threshold: str
    #: what removing it can recover at most, in words
    recovers: str
    #: ... in ns of the typical step: (TypicalStep, the rows) -> ns, or None where no bound holds
    recover: Callable
    #: whether the findings ask it for suggestions: (Findings) -> bool; None: it makes none in
    #: the dispatch (analyze/suggestions.py)
    asks: Callable | None = None
    #: its suggestions: (Findings, TypicalStep) -> (suggestions, why none where it made none)
    suggest: Callable | None = None
    #: its own rule for the evidence per step (held()), (steps, Thresholds) -> shares; None:
    #: the share at or past its threshold
    evidence: Callable | None = None

    def held(self, steps, th) -> np.ndarray:
        """The evidence per step of classify's table: its share where its label holds, else -1
        (`evidence` where the module has its own rule, else the share at or past its
        threshold)."""
        if self.evidence is not None:
            return self.evidence(steps, th)
        s = steps[self.share].to_numpy()
        return np.where(s >= getattr(th, self.threshold), s, -1.0)
