"""The fault benchmark's tables (markdown), from its results file (benchmarks/results/faults.json):
docs/accuracy.md's section "Injected faults" (scripts/accuracy.py writes it)."""

from __future__ import annotations

import json
import os

from run import CONFIGS, KINDS

CHECKS = ("right", "cause", "excess", "estimate")
SOURCES = ("record", "kineto")


def _count(scores: list, check: str) -> str:
    got = [s.get(check) for s in scores if s.get(check) is not None]
    return f"{sum(bool(g) for g in got)}/{len(got)}" if got else "-"


def _table(rows: list, key, keys: list, title: str) -> list[str]:
    out = [f"| {title} | rows | " + " | ".join(f"{src}: {c}" for src in SOURCES
                                              for c in CHECKS) + " |",
           "| --- | --- | " + " | ".join("---" for _ in SOURCES for _ in CHECKS) + " |"]
    for k in keys:
        mine = [r for r in rows if key(r) == k]
        if not mine:
            continue
        cells = [_count([r["scores"][src] for r in mine if src in r["scores"]], c)
                 for src in SOURCES for c in CHECKS]
        out.append(f"| {k} | {len(mine)} | " + " | ".join(cells) + " |")
    return out


def _misses(rows: list) -> list[str]:
    """One line per row a source got wrong: what was injected, what the report said."""
    out = []
    for r in rows:
        for src in SOURCES:
            s = r["scores"].get(src)
            if s is None:
                continue
            if s.get("right"):
                continue
            said = s.get("error") or (f"{s.get('verdict')} ({s.get('confidence')}), stragglers "
                                      f"{s.get('named')}, probable {s.get('probable')}")
            out.append(f"- {r['parallel']} x {r['world']}, {r['kind']} on rank(s) "
                       f"{r.get('ranks', [])} ({r.get('ms', 0):.1f} ms, "
                       f"{100 * r.get('fraction', 0):.0f}% of the step): {src} said {said}")
    return out


def section(path: str) -> list[str]:
    """docs/accuracy.md's "Injected faults" section from the results file at `path` ([] when
    there is none)."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        doc = json.load(fh)
    rows = [r for r in doc["rows"] if "scores" in r]
    failed = [r for r in doc["rows"] if "failed" in r]
    worlds = sorted({r["world"] for r in rows if r["parallel"] != "generated"})
    lines = [
        "## Injected faults", "",
        f"Generated from `benchmarks/results/faults.json` (`python benchmarks/faults/run.py`, "
        f"`make bench-faults`; commit {doc['commit']}, {doc['cpu_count']} cores, "
        f"{doc['seconds'] / 60:.0f} min, seed {doc['seed']}). Real training runs on gloo "
        "(benchmarks/faults/train.py) in which a rank drawn at random is slowed by a known share "
        "of the step (5% to 100%, drawn) in one place, each recorded by gpuscope and profiled "
        "by torch.profiler at once; the truth is the injection and the loop's own perf_counter "
        "(benchmarks/faults/score.py). *right*: the slowed rank named first (both, for two; "
        "said intermittent; nobody named in controls and rotating rows, unless the loop's own "
        "clock shows a rank computing 10% longer on the shared cores; a loader fault its "
        "workers hid counts as a control), or the report saying it is not sure (low "
        "confidence, the rank named probably); *cause*: the phase; *excess*: within 25% of the "
        "injected time; *estimate*: the step with the fault fixed within 15% of the same "
        "configuration's unslowed runs (two per configuration). A dash: the check does not "
        "apply (not named, or a kind without a cause gpuscope can name).", ""]
    lines += _table(rows, lambda r: r["kind"], list(KINDS), "kind") + [""]
    configs = [f"{p} x {w}" for p, w in CONFIGS] + [
        f"generated x {w}" for w in sorted({r["world"] for r in rows
                                            if r["parallel"] == "generated"})]
    lines += _table(rows, lambda r: f"{r['parallel']} x {r['world']}", configs,
                    "parallelism x ranks") + [""]
    trained = [r for r in rows if r["parallel"] != "generated"]
    made = [r for r in rows if r["parallel"] == "generated"]
    right = {src: sum(bool(r["scores"][src].get("right")) for r in trained if src in r["scores"])
             for src in SOURCES}
    lines.append(f"{len(trained)} trained rows on {', '.join(map(str, worlds))} ranks: right "
                 f"from the record in {right['record']}, from the traces in {right['kineto']}"
                 + (f"; {len(failed)} trainings failed" if failed else "") + ".")
    if made:
        gen = doc.get("generated") or {}
        lines.append(f"{len(made)} generated rows (`python benchmarks/faults/many.py`: run dirs "
                     "written by the recorder's writer, a synchronous job of "
                     f"{gen.get('steps', '?')} steps with the fault in the drawn rank's timings, "
                     "2% of the step and above; record only): right in "
                     f"{sum(bool(r['scores']['record'].get('right')) for r in made)}.")
    misses = _misses(rows)
    if misses:
        lines += ["", "Rows a source got wrong:", ""] + misses
    return lines
