"""docs/accuracy.md's applied-fixes section from benchmarks/results/whatif.json
(benchmarks/bench_whatif.py): each pair a row, and the three scores over the rows."""

from __future__ import annotations

import json
import os

GOALS = {"within_15": None, "in_range": 0.9, "useful": 0.8}


def scored(d: dict) -> list[tuple[dict, dict]]:
    return [(c, p) for c in d["cases"] if c.get("applied") for p in c.get("pairs", [])
            if p.get("estimate", True) is not None]


def section(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    d = json.load(open(path))
    if "pairs" not in d:
        return []
    rows = scored(d)
    n = len(rows)
    count = {k: sum(bool(p[k]) for _, p in rows) for k in ("in_range", "useful")}
    count["within_15"] = sum(abs(p["error_pct"]) <= 15 for _, p in rows)
    progs = sorted({c["program"] for c, _ in rows})
    out = ["## Applied fixes", "",
           f"Generated from `benchmarks/results/whatif.json` (`python benchmarks/bench_whatif.py "
           f"--pairs {d['pairs']}`, `make bench-whatif`; commit {d.get('commit', '?')}, "
           f"{d['cpus']} cores, torch {d['torch']}, {d['seconds'] // 60} min). Runs bottlenecked "
           f"on purpose ({', '.join(progs)}; 2 ranks, gloo): the top suggestion (or the one a "
           "case names) applied with the training's own flag and re-run, BEFORE and AFTER "
           f"alternated {d['pairs']} times so the machine's drift falls on both; each pair a row: "
           "the estimate BEFORE's report gives against AFTER's step on BEFORE's basis (its "
           "micro-steps per optimizer step, its batch), measured by the program's own clock "
           "where it has one (nanoGPT's time per iteration), else by `gpuscope compare`.", "",
           f"- point within 15% of the re-run: **{count['within_15']} of {n}**;",
           f"- the re-run inside the stated range: **{count['in_range']} of {n}** (the goal: "
           f"{GOALS['in_range']:.0%});",
           f"- the range useful, within +-25% of its point: **{count['useful']} of {n}** (the "
           f"goal: {GOALS['useful']:.0%}).", "",
           "| case | program | suggestion | before | estimated (range) | measured after | error "
           "| in range | range useful |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in d["cases"]:
        if not c.get("applied"):
            what = (f"{c['knob']}: {c['current']} -> {c['proposed']}" if c.get("knob")
                    else "no suggestion")
            out.append(f"| {c['case']} | {c['program']} | {what} | | | not applied | | | |")
            continue
        for p in c["pairs"]:
            if p.get("estimate", True) is None:
                out.append(f"| {c['case']} | {c['program']} | {c['knob']} | | | {p['note']} "
                           "| | | |")
                continue
            lo, hi = p["range_ms"]
            out.append(f"| {c['case']} | {c['program']} | {c['knob']}: {c['current']} -> "
                       f"{c['proposed']} | {p['before_ms']:.1f} ms | {p['estimated_ms']:.1f} ms "
                       f"({lo:.1f}-{hi:.1f}) | {p['measured_ms']:.1f} ms | "
                       f"{p['error_pct']:+.1f}% | {'yes' if p['in_range'] else 'no'} | "
                       f"{'yes' if p['useful'] else 'no'} |")
    misses = [(c, p) for c, p in rows if not p["in_range"] or abs(p["error_pct"]) > 15]
    if misses:
        out += ["", "Where an estimate missed, and why (the estimate's own `assumes` says what "
                "it rests on):", ""]
        for case, why in d.get("reasons", {}).items():
            out.append(f"- {case}: {why}")
    return out
