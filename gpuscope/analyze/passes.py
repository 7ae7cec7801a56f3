"""What each analysis pass reads and writes of the shared state (run.Analysis), declared on the
pass itself: the order of run.PASSES is checked against it (`out_of_order`: a pass that reads a
field no earlier pass wrote), and tests/test_run_passes.py checks that the declarations are
true by watching every field each pass touches on real inputs."""

from __future__ import annotations

#: the fields an Analysis holds when it is made, before any pass
INPUTS = frozenset({"table", "th", "warnings", "own"})


def declares(reads: str, writes: str):
    """`@declares("frame steps", "stragglers minor")`: the Analysis fields the pass reads
    (written by an earlier pass, or INPUTS) and those it writes (or changes in place)."""
    def mark(fn):
        fn.reads, fn.writes = frozenset(reads.split()), frozenset(writes.split())
        return fn

    return mark


def out_of_order(passes, inputs=INPUTS) -> list[str]:
    """Each read of a pass that neither the inputs nor an earlier pass provides, as text."""
    have, wrong = set(inputs), []
    for p in passes:
        reads = getattr(p, "reads", None)
        if reads is None:
            wrong.append(f"{p.__name__} declares nothing")
            continue
        wrong += [f"{p.__name__} reads {f} before any pass writes it"
                  for f in sorted(reads - have)]
        have |= p.writes
    return wrong
