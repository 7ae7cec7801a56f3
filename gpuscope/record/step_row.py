"""Turns the intervals one training step recorded into one row of the record file."""

from __future__ import annotations

from ..vocab import COMPUTE_PHASES
from . import intervals as iv


def sum_step(step: int, start: int, now: int, data_ns: int, data_cpu_ns: int, raw_phases: list,
             comm_phases: list, comm: list, fwd_end, start_unix: int) -> list:
    """Sum one step's intervals (host perf_counter ns) into a row of STEP_COLUMNS, plus a
    trailing {name: ns} for phases that are not one of the fixed columns.

    1. backward, when not named by the user, runs from the end of forward to the optimizer (or
       to the last gradient bucket when no optimizer step was seen);
    2. exposed communication is the tail from the last bucket launch (the end of backward
       compute) to the last bucket done, plus blocking `comm` phases;
    3. compute is the union of the compute phases minus what overlaps exposed communication;
       with no phase at all, everything that is not data or exposed comm counts as compute;
    4. other is what remains of the step.
    """
    step_ns = now - start
    hook_comm = iv.clip(comm, start, now)
    named: dict[str, int] = {}
    phases = [(n, a, b) for n, a, b in raw_phases if b > a]
    if fwd_end is not None and not any(n == "backward" for n, _, _ in phases):
        # backward (with loss) runs from the end of forward to the optimizer, or to the end of
        # the last gradient bucket when no optimizer step was seen
        opt_starts = [a for n, a, _ in phases if n == "optimizer" and a >= fwd_end]
        end = min(opt_starts) if opt_starts else max((b for _, b in hook_comm), default=None)
        if end is not None:
            phases.append(("backward", fwd_end, end))
    for n, a, b in phases:
        named[n] = named.get(n, 0) + (b - a)

    # exposed communication: the tail from the last bucket launch (end of backward compute)
    # to the last bucket done, plus blocking comm phases
    exposed_iv = list(comm_phases)
    if hook_comm:
        last_launch = max(a for a, _ in hook_comm)
        last_done = max(b for _, b in hook_comm)
        if last_done > last_launch:
            exposed_iv.append((last_launch, last_done))
    exposed_m = iv.merge(exposed_iv)
    comm_m = iv.merge(hook_comm + list(comm_phases))
    comm_ns = iv.total(comm_m)
    exposed_ns = min(iv.total(exposed_m), step_ns)

    data_ns = min(data_ns, step_ns)
    if phases:
        compute_m = iv.merge([(a, b) for _, a, b in phases])
        compute_ns = iv.total(compute_m) - iv.overlap(compute_m, exposed_m)
        compute_ns = max(0, min(compute_ns, step_ns - data_ns - exposed_ns))
    else:  # nothing named: all that is not data or comm counts as compute
        compute_ns = max(0, step_ns - data_ns - exposed_ns)
    other_ns = max(0, step_ns - data_ns - exposed_ns - compute_ns)
    fixed = [named.pop(k, 0) for k in COMPUTE_PHASES]  # the fixed columns, in their order
    row = [step, start_unix, step_ns, data_ns, compute_ns, comm_ns, exposed_ns,
           other_ns, *fixed, len(hook_comm), data_cpu_ns]
    if named:
        row.append(named)
    return row
