"""One report, one story: what a user reading a report line by line would find contradicting
itself, as checks (test_one_story.py runs them over every sample and corpus report).

- a rank named (a straggler, probably one) or one the verdict's evidence says arrived last in
  most steps, beside words saying no rank is late;
- one quantity given two figures: a straggler's excess (its line and its suggestion), the step
  a suggestion quotes against the rank table's, the data wait a suggestion quotes against the
  rank table's, a part's ms against its share of the step;
- shares over the step: a part, a collective kind or the verdict's labels above the step;
- a verdict other than compute-bound with neither a suggestion for it nor a line saying why;
- a suggestion whose gain is not its estimate's (the throughput ratio of today's global batch);
- a gain above +100% from a trace without step markers (no per-step evidence: what the GPU
  idled on in it may be one-off work; the estimate's low end is what may be promised).
"""

from __future__ import annotations

import re

MS = 1e6
NO_ONE_LATE = ("no rank is late", "no rank late", "none consistent", "wait for the rest every")


def _said(report) -> str:
    return " ".join([*report.verdict.evidence, *report.warnings,
                     *(f"{s.current} {s.proposed} {s.why}" for s in report.suggestions)])


def contradictions(report) -> list[str]:
    out: list[str] = []
    said = _said(report)
    named = [s.rank for s in report.stragglers]
    leaning = [e for e in report.verdict.evidence if "arrived last in" in e]
    if (named or leaning) and any(w in said for w in NO_ONE_LATE):
        out.append(f"rank(s) {named or leaning} named as late beside 'no rank is late'")
    # one figure per quantity
    for s in report.stragglers:
        fix = next((x for x in report.suggestions if x.knob == "straggler"
                    and x.current.startswith(f"rank {s.rank}")), None)
        if fix is not None and f"busy {s.excess_ns / MS:.1f} ms" not in fix.why:
            out.append(f"rank {s.rank}'s excess {s.excess_ns / MS:.1f} ms not the one its "
                       f"suggestion gives: {fix.why[:160]}")
        for m in re.findall(r"([\d.]+) ms more per step", fix.why if fix else ""):
            out.append(f"a second figure of rank {s.rank}'s excess: {m} ms")
    steps = [r.step_ns / MS for r in report.ranks]
    for s in report.suggestions:
        for m in re.findall(r"of each ([\d.]+) ms step", s.why):
            if steps and abs(float(m) - max(steps)) > 0.051 + 0.001 * max(steps):
                out.append(f"{s.knob} quotes a {m} ms step; the rank table's is "
                           f"{max(steps):.1f}")
        for m in re.findall(r"each step waits ([\d.]+) ms for data", s.why):
            data = sum(r.data_ns for r in report.ranks) / len(report.ranks) / MS
            if abs(float(m) - data) > 0.051 + 0.001 * data:
                out.append(f"{s.knob} quotes {m} ms of data wait; the rank table's is "
                           f"{data:.1f}")
        if s.estimated_step_ms > 0 and steps:
            ratio = (max(steps) / s.estimated_step_ms - 1) * 100
            if s.gain_pct > ratio + 1.0 + 0.01 * abs(ratio):
                out.append(f"{s.knob}: +{s.gain_pct:.0f}% where its estimate gives "
                           f"{ratio:+.0f}%")
    for r in report.ranks:
        for part in ("data", "compute", "comm", "comm_exposed", "wait", "other"):
            ms, pct = r.part_ns(part) / MS, r.part_pct(part)
            if r.step_ns > 0 and abs(ms - pct / 100 * r.step_ns / MS) > 0.01 + 0.002 * ms:
                out.append(f"rank {r.rank}: {part} {ms:.3f} ms beside {pct:.2f}% of a "
                           f"{r.step_ns / MS:.3f} ms step")
        for kind, ns in r.comm_by_kind.items():
            if ns > r.step_ns * 1.001 + 1e3:
                out.append(f"rank {r.rank}: {kind} {ns / MS:.1f} ms in a "
                           f"{r.step_ns / MS:.1f} ms step")
    no_markers = any("no step markers" in e for e in report.verdict.evidence)
    for s in report.suggestions if no_markers else ():
        if s.gain_pct > 100.0 + 1e-6:
            out.append(f"{s.knob}: +{s.gain_pct:.0f}% from a trace without step markers")
    if sum(report.verdict.time_by_label.values()) > 1.001:
        out.append(f"the labels' shares add to {sum(report.verdict.time_by_label.values()):.3f}")
    label = report.verdict.label
    if label != "compute-bound" and not any(s.addresses == label for s in report.suggestions) \
            and not any(label in w for w in report.warnings):
        out.append(f"verdict {label} with no suggestion for it and no line saying why")
    return out
