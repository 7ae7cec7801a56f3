"""docs/accuracy.md's trials section from benchmarks/results/try.json (benchmarks/bench_try.py):
per case, what `gpuscope try` found and whether a repeat agreed, and the estimates of the
applied change before and after one calibrating trial against re-runs."""

from __future__ import annotations

from whatif_tables import results

KINDS = ("model", "calibrated")
SCORES = ("within_15", "in_range", "useful")


def _count(rows: list[dict], kind: str) -> dict:
    sc = [p[kind] for r in rows for p in r.get("pairs", []) if kind in p]
    return {"n": len(sc), **{k: sum(bool(s[k]) for s in sc) for k in SCORES}}


def table(rows: list[dict]) -> list[str]:
    """A row per case: the change applied, try's best and its repeat's, the repeat's gains
    inside the first's interval, the re-runs, and per estimate kind its scores over the pairs."""
    out = ["| case | program | change | try's best (repeat's), rounds | repeat's gains in the "
           "first's interval | before -> after (re-runs) | model's estimate: within 15% / in range / "
           "useful | calibrated: within 15% / in range / useful |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "try" not in r:
            out.append(f"| {r['case']} | {r['program']} | {r.get('nothing_to_try', '')} "
                       "| | | | | |")
            continue
        t = r["try"]
        held = [g["held"] for g in t["gains"].values()]
        runs = "; ".join(f"{p['before_ms']:.1f} -> {p['measured_ms']:.1f} ms"
                         for p in r["pairs"] if p.get("measured_ms") and p.get("before_ms"))
        cells = []
        for kind in KINDS:
            c = _count([r], kind)
            ests = ", ".join(f"{p[kind]['estimated_ms']:.1f}" for p in r["pairs"] if kind in p)
            cells.append(f"{ests} ms: " + " / ".join(f"{c[k]} of {c['n']}" for k in SCORES))
        out.append(f"| {r['case']} | {r['program']} | {r['knob']} -> {r['proposed']} | "
                   f"{t['best']} ({t['repeat_best']}), {_rounds(t)} | {sum(held)} of {len(held)} | {runs} | "
                   f"{cells[0]} | {cells[1]} |")
    return out


def _rounds(t: dict) -> str:
    got = t.get("rounds") or [next((r["rounds"] for r in t["first"]), "?")] * 2
    return str(got[0]) if got[0] == got[1] else f"{got[0]} ({got[1]})"


def section(path: str) -> list[str]:
    d = results(path)
    if d is None:
        return []
    rows = [r for r in d["cases"] if "try" in r]
    same = sum(r["try"]["same_best"] for r in rows)
    gains = [g["held"] for r in rows for g in r["try"]["gains"].values()]
    faster = [p["measured_ms"] < p["before_ms"] for r in rows for p in r["pairs"]
              if p.get("measured_ms") and p.get("before_ms") and r["try"]["best"] != "baseline"]
    progs = sorted({r["program"] for r in d["cases"]})
    out = ["## Trials and calibration", "",
           f"Generated from `benchmarks/results/try.json` (`python benchmarks/bench_try.py "
           f"--pairs {d['pairs']}`; run at {d.get('commit', '?')}"
           + (f", estimated again at {d['rescored_by']} (`--rescore`)" if d.get("rescored_by")
              else "") + f"; {d['cpus']} cores, load "
           f"{d['load'][0]:.1f} at the end, {d['seconds'] // 60} min). Programs: "
           f"{', '.join(progs)}; 2 ranks, gloo, one command line per case with the knobs as "
           "placeholders. Per case: BEFORE is run and analysed; `gpuscope try BEFORE --top 3 "
           f"{d.get('try_rounds', '--repeats 2')}` runs its suggestions beside it and keeps what "
           "it measured in the case's calibration file; the same `try` is repeated with "
           "calibration off and as many rounds; then the top "
           "change is re-run, AFTER and BEFORE alternated, and each AFTER is scored against "
           "the estimates its two neighbouring BEFOREs give, the model's and the calibrated "
           "one.", "",
           f"- try names the same best in its repeat: **{same} of {len(rows)}** cases;",
           f"- the repeat's gain inside the first's interval (where a repeat lands 95 times in "
           f"100): **{sum(gains)} of {len(gains)}** values tried;",
           f"- the re-runs of the change try found faster are faster: **{sum(faster)} of "
           f"{len(faster)}**;"]
    for kind, what in zip(KINDS, ("the model's estimate (no trial)",
                                  "after one calibrating trial")):
        c = _count(rows, kind)
        out.append(f"- {what}: point within 15% of the re-run **{c['within_15']} of {c['n']}**, "
                   f"re-run in its range **{c['in_range']} of {c['n']}**, range useful (within "
                   f"+-25% of its point) **{c['useful']} of {c['n']}**;")
    out[-1] = out[-1][:-1] + "."
    out += [""] + table(d["cases"])
    plain = [(r["case"], p["calibrated"]) for r in rows for p in r["pairs"]
             if "calibrated" in p and not p["calibrated"]["useful"]]
    if plain:
        out += ["", "Where a calibrated range was wider than +-25% of its point, what its "
                "suggestion says of it:", ""]
        out += [f"- {case}: {_range(c)}" for case, c in plain]
    return out


def _range(c: dict) -> str:
    lo, hi = c["range_ms"]
    said = c.get("range_why") or "(not kept by this run of the benchmark)"
    return (f"{c['estimated_ms']:.1f} ({lo:.1f}-{hi:.1f}) ms, {c['error_pct']:+.1f}% from the "
            f"re-run: \"{said.strip()}\"")
