"""The interval algebra has two implementations of one meaning: the recorder's on Python lists
(record/intervals.py: no numpy inside the training process) and the readers' on numpy arrays
(readers/kineto/spans.py). On random intervals, with touching, nested, empty and repeated ones,
they agree on every operation both have (merge, total / length, overlap, clip)."""

import random

import numpy as np

from gpuscope.readers.kineto import spans
from gpuscope.record import intervals as iv


def _random_intervals(rng: random.Random, n: int) -> list[tuple[int, int]]:
    out = []
    for _ in range(n):
        a = rng.randrange(0, 200)
        b = a + rng.choice((0, 0, 1, rng.randrange(0, 60)))  # empty and unit ones too
        out.append((a, b))
    if out and rng.random() < 0.3:
        out.append(out[0])  # a repeated one
    return out


def _arrays(xs):
    return (np.array([a for a, _ in xs], np.int64), np.array([b for _, b in xs], np.int64))


def test_the_two_implementations_agree():
    for seed in range(500):
        _agree(random.Random(seed))


def _agree(rng: random.Random) -> None:
    a = _random_intervals(rng, rng.randrange(0, 12))
    b = _random_intervals(rng, rng.randrange(0, 12))
    ma, mb = iv.merge(a), iv.merge(b)
    sa, sb = spans.merge(*_arrays(a)), spans.merge(*_arrays(b))
    assert ma == list(zip(sa[0].tolist(), sa[1].tolist()))
    assert iv.total(ma) == spans.length(sa) == iv.length(a)  # length: the union's, unmerged
    assert iv.overlap(ma, mb) == spans.overlap(sa, sb)
    lo, hi = sorted((rng.randrange(0, 260), rng.randrange(0, 260)))
    clipped = spans.clip(sa, lo, hi)
    assert [(x, y) for x, y in iv.clip(ma, lo, hi) if y > x] == \
        list(zip(clipped[0].tolist(), clipped[1].tolist()))


def _cells(xs) -> set[int]:
    """The unit cells [t, t+1) a set of intervals covers: the reference the operations are
    checked against."""
    return {t for a, b in xs for t in range(a, b)}


def _runs(cells: set[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for t in sorted(cells):
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return out


def test_subtract_intersect_and_window_match_the_cells_they_cover():
    """spans.subtract, intersect and window on random sets (touching, nested, repeated points,
    empty pieces) give exactly the merged runs of cells a - b, a & b and a within [lo, hi)."""
    for seed in range(500):
        rng = random.Random(10_000 + seed)
        a = _random_intervals(rng, rng.randrange(0, 12))
        b = _random_intervals(rng, rng.randrange(0, 12))
        sa, sb = spans.merge(*_arrays(a)), spans.merge(*_arrays(b))
        as_list = lambda s: list(zip(s[0].tolist(), s[1].tolist()))  # noqa: E731
        assert as_list(spans.subtract(sa, sb)) == _runs(_cells(a) - _cells(b))
        assert as_list(spans.intersect(sa, sb)) == _runs(_cells(a) & _cells(b))
        lo, hi = sorted((rng.randrange(0, 260), rng.randrange(0, 260)))
        assert as_list(spans.window(sa, lo, hi)) == _runs(_cells(a) & set(range(lo, hi)))
