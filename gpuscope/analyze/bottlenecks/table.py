"""The bottlenecks a step can be labelled with, one entry each (spec.Bottleneck, declared by
its own module): confidence's deciding shares and invariants' recoverable time read them from
here, and tests/test_vocabulary.py checks that every bottleneck label of vocab.LABELS has one
(compute-bound and unexplained name no bottleneck)."""

from __future__ import annotations

from . import comm, data, host, imbalance, pipeline
from .spec import Bottleneck

TABLE: tuple[Bottleneck, ...] = (imbalance.SPEC, imbalance.JITTER_SPEC, data.SPEC, comm.SPEC,
                                 host.SPEC, pipeline.SPEC)
BY_LABEL = {b.label: b for b in TABLE}


def missing(labels, table: tuple[Bottleneck, ...] = TABLE) -> list[str]:
    """The labels of `labels` with no entry in `table`, or more than one."""
    seen = [b.label for b in table]
    return [x for x in labels if seen.count(x) != 1]
