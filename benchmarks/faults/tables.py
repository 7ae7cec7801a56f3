"""The fault benchmark's tables (markdown), from its results file (benchmarks/results/faults.json):
docs/accuracy.md's section "Injected faults" (scripts/accuracy.py writes it)."""

from __future__ import annotations

import json
import os

from design import CONFIGS, KINDS


CHECKS = ("right", "cause", "excess", "estimate")


def write(doc: dict, path: str) -> None:
    """The results file as the repository keeps it: one line, times rounded to 0.1 us (ms with 4
    decimals; a generated row's per-rank truth made it 7.5 MB indented)."""
    def rounded(o):
        if isinstance(o, float):
            return round(o, 4)
        if isinstance(o, dict):
            return {k: rounded(v) for k, v in o.items()}
        if isinstance(o, list):
            return [rounded(v) for v in o]
        return o
    with open(path, "w") as fh:
        json.dump(rounded(doc), fh, separators=(",", ":"))
#: what the results file keeps of a report: enough to score it again (run.py --rescore)
KEPT = ("verdict", "confidence", "confidence_why", "time_by_label", "stragglers",
        "probable_stragglers", "straggler_details", "minor_stragglers", "jitter",
        "steps_analysed", "straggler_not_ruled_out", "straggler_floor")


def brief(rep: dict) -> dict:
    """A report as the results file keeps it: its verdict, stragglers and suggestions."""
    if "error" in rep:
        return rep
    out = {k: rep.get(k) for k in KEPT}
    out["straggler_details"] = [{k: v for k, v in d.items() if k not in ("telemetry", "ops")}
                                for d in out.get("straggler_details") or ()]
    out["suggestions"] = [{k: s.get(k) for k in ("knob", "proposed", "estimated_step_ms",
                                                 "estimated_step_ms_range", "addresses")}
                          for s in rep.get("suggestions") or []]
    # the steps it analysed (score.analysed_steps: the loop's clock over those alone)
    out["steps"] = [{k: s[k] for k in ("step", "micro_steps") if k in s}
                    for s in rep.get("steps") or []]
    return out
SOURCES = ("record", "kineto")


def _count(scores: list, check: str) -> str:
    got = [s.get(check) for s in scores if s.get(check) is not None]
    if not got:
        return "-"
    cell = f"{sum(bool(g) for g in got)}/{len(got)}"
    unsure = sum(bool(s.get("unsure_said")) for s in scores) if check == "right" else 0
    return cell + (f" ({unsure} unsure)" if unsure else "")


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


def _share(r: dict) -> str:
    """What the fault added per step on its rank, in ms and as a share of the unslowed step
    (the injection in the truth's unit: an optimizer step)."""
    t, ctl = r.get("truth") or {}, r.get("control_step_ms")
    added = max((t.get("added_ms") or {}).values(), default=0.0)
    if not added:
        return "nothing added"
    return f"+{added:.1f} ms a step" + (f", {100 * added / ctl:.0f}% of the step" if ctl else "")


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
                                      f"{s.get('named')}, probable {s.get('probable')}"
                                      + (f", minor {s['minor_ranks']}" if s.get("minor_ranks")
                                         else ""))
            out.append(f"- {r['parallel']} x {r['world']}, {r['kind']} on rank(s) "
                       f"{r.get('ranks', [])} ({_share(r)}): {src} said {said}")
    return out


def overhead(rows: list) -> list[str]:
    """The recorder's cost on the same runs: gpuscope's rec.step() per step against the step,
    by configuration (medians over the rows)."""
    import statistics

    by: dict = {}
    for r in rows:
        t = r.get("truth") or {}
        if t.get("record_ms") is not None and t.get("step_ms"):
            by.setdefault(f"{r['parallel']} x {r['world']}", []).append(
                (t["record_ms"], t["step_ms"]))
    if not by:
        return []
    cells = [f"{k}: {1e3 * statistics.median(x for x, _ in v):.0f} us "
             f"({100 * statistics.median(x / s for x, s in v):.2f}% of the step)"
             for k, v in by.items()]
    return ["", "The recorder on the same runs: gpuscope's `rec.step()` per step, timed by the "
            "loop's own clock (its hooks inside forward and backward are not in it: the whole "
            "cost is measured apart, [recording overhead](performance.md#recording-overhead)): "
            + "; ".join(cells) + "."]


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
        "workers hid counts as a control), or the report saying it is not sure (the rank "
        "named probably a straggler, or not ruled out as one, or the fault under what the steps "
        "could see, or no one at low confidence: counted apart as unsure); "
        "*cause*: "
        "the phase; *excess*: within 25% of the injected time; *estimate*: the step with the fault fixed within 15% of the same "
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
        steps = ", ".join(f"{w:,} ranks x {s} steps" for w, s in sorted(
            {(r["world"], r.get("steps", "?")) for r in made}))
        lines.append(f"{len(made)} generated rows (`python benchmarks/faults/many.py`: run dirs "
                     f"written by the recorder's writer, a synchronous job ({steps}) with the "
                     "fault in the drawn rank's timings, 2% of the step and above; record "
                     f"only): right in {sum(bool(r['scores']['record'].get('right')) for r in made)}.")
    lines += overhead(trained)
    misses = _misses(rows)
    if misses:
        lines += ["", "Rows a source got wrong:", ""] + misses
    return lines
