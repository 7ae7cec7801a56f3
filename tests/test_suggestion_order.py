"""The order of suggestions: the verdict's fixes first (or those of a label in a near tie with it),
by gain; a tie at the top put in one fixed order, so that two measurements of one run (its
record and its traces) give the same first fix."""

from gpuscope.analyze.suggestions import break_ties, in_order, leading_labels
from gpuscope.results import Suggestion, Verdict


def _s(knob, ms, addresses="comm-bound", step=50.0):
    return Suggestion(knob, 1, 2, ms, "", addresses, (step / ms - 1) * 100)


def test_a_near_tie_of_labels_lets_both_labels_fixes_lead():
    # seen at load: the record said comm-bound 51% / imbalanced 49%, the traces of the same steps
    # imbalanced 52% / comm-bound 48%; the verdict's fix first gave "batch 4" and "fix the
    # straggler"
    straggler, batch = _s("straggler", 35.3, "imbalanced"), _s("batch_size", 27.5)
    for label, share, other in (("comm-bound", 0.51, "imbalanced"), ("imbalanced", 0.52, "comm-bound")):
        v = Verdict(label, share, "low", {label: share, other: 1 - share})
        assert leading_labels(v) == {"comm-bound", "imbalanced"}
        assert [s.knob for s in in_order([straggler, batch], leading_labels(v), set())] == \
            ["batch_size", "straggler"]
    # jitter-bound 58% against comm-bound 42% (the traces; the record of the same steps: 53/47):
    # both lead; at 70/30 the verdict's fixes lead alone
    assert leading_labels(Verdict("jitter-bound", 0.58, "medium",
                                  {"jitter-bound": 0.58, "comm-bound": 0.42})) == \
        {"jitter-bound", "comm-bound"}
    assert leading_labels(Verdict("jitter-bound", 0.7, "medium",
                                  {"jitter-bound": 0.7, "comm-bound": 0.3})) == {"jitter-bound"}
    # a clear verdict: its own fix first, however large another label's gain
    clear = Verdict("imbalanced", 0.8, "high", {"imbalanced": 0.8, "comm-bound": 0.2})
    assert leading_labels(clear) == {"imbalanced"}
    assert [s.knob for s in in_order([batch, straggler], leading_labels(clear), set())] == \
        ["straggler", "batch_size"]


def test_a_tie_at_the_top_is_put_in_one_order_whatever_the_measurement():
    lead = {"comm-bound"}
    # sync every 32 steps held at a straggler's floor: 28.94 ms against the batch's 29.43 from the
    # record; the other way round from the traces. Both: the batch (its own estimate, and the
    # smaller change to the training's maths)
    for sync_ms, batch_ms in ((28.94, 29.43), (29.6, 29.43)):
        got = in_order([_s("sync_frequency", sync_ms), _s("batch_size", batch_ms)], lead,
                       {"sync_frequency"})
        assert got[0].knob == "batch_size"
    # not held either: the smaller change to the maths
    assert in_order([_s("sync_frequency", 28.9), _s("batch_size", 29.4)], lead, set())[0].knob \
        == "batch_size"
    # a clear winner stays first (sync 20 ms against the batch's 29.4 ms: 47% more throughput)
    assert in_order([_s("sync_frequency", 20.0), _s("batch_size", 29.4)], lead, set())[0].knob \
        == "sync_frequency"
    # a tie only reorders the top: the rest keep their order by gain
    ordered = [_s("batch_size", 29.0), _s("sync_frequency", 29.5), _s("grad_compression", 40.0)]
    assert [s.knob for s in break_ties(ordered, lead, set())] == \
        ["batch_size", "sync_frequency", "grad_compression"]
