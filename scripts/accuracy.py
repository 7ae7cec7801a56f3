"""The accuracy corpus: every external trace folder against what is known of it.

    python scripts/accuracy.py                 # checks every folder, writes docs/accuracy.md
                                               # (and the injected-fault tables from
                                               # benchmarks/results/faults.json)
    python scripts/accuracy.py --no-write      # checks only (exit 1 when one fails)

Folders: sample_traces/external/* and, beside the repository, ../shared/traces/external/* and
../shared/traces/hta/*. What is known of each, as checks, is in sample_traces/external/known.json
(from each folder's README). Every report must also add up (analyze/invariants.py) and no
confidence "high" may come with a failed check. tests/test_accuracy_corpus.py runs the same
checks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys

# generated reports are the models' own: what `gpuscope try` kept on this machine stays out
os.environ["GPUSCOPE_CALIBRATION"] = "off"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "traces")
KNOWN = os.path.join(ROOT, "sample_traces", "external", "known.json")
LEVELS = ("low", "medium", "high")


def folders() -> dict[str, str]:
    """{case name: path} of every corpus folder there is (the shared ones where present)."""
    out = {}
    for prefix, base in (("external", os.path.join(ROOT, "sample_traces", "external")),
                         ("shared/external", os.path.join(SHARED, "external")),
                         ("shared/hta", os.path.join(SHARED, "hta"))):
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            if os.path.isdir(os.path.join(base, name)):
                out[f"{prefix}/{name}"] = os.path.join(base, name)
    return out


def known() -> dict:
    with open(KNOWN) as fh:
        return json.load(fh)["cases"]


def _in(v, lohi) -> bool:
    return lohi[0] - 1e-9 <= v <= lohi[1] + 1e-9


def _annotations_not_work(path: str, d: dict) -> tuple[bool, str]:
    """The GPU compute share gpuscope gives equals the one worked out here from the raw events
    with gpu_user_annotation ranges left out (and differs from one that counts them)."""
    (f,) = [os.path.join(path, x) for x in os.listdir(path) if x.endswith(".gz")]
    ev = json.load(gzip.open(f))["traceEvents"]
    dev = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                       "gpu_memset")]
    lo = min(e["ts"] for e in dev)
    hi = max(e["ts"] + e["dur"] for e in dev)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in dev if e["cat"] == "kernel")
    busy, end = 0.0, -1.0
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    want = 100 * busy / (hi - lo)
    got = d["ranks"][0]["gpu_breakdown"]["compute_pct"]
    return abs(got - want) < 0.5, f"GPU compute {got:.2f}% (kernels alone: {want:.2f}%)"


def check(path: str, checks: dict, report) -> list[tuple[str, bool, str]]:
    """(check, passed, what gpuscope gave) for every check of a folder, and the invariants."""
    from gpuscope.analyze.invariants import violations

    d = report.to_dict()
    out = []
    ranks = d["ranks"]
    for key, want in checks.items():
        if key == "verdict_in":
            out.append((key, d["verdict"] in want, d["verdict"]))
        elif key == "verdict_not_in":
            out.append((key, d["verdict"] not in want, d["verdict"]))
        elif key == "confidence_at_most":
            out.append((key, LEVELS.index(d["confidence"]) <= LEVELS.index(want), d["confidence"]))
        elif key == "ranks":
            out.append((key, d["ranks_analysed"] == want, str(d["ranks_analysed"])))
        elif key == "world_size":
            out.append((key, d["world_size"] == want, str(d["world_size"])))
        elif key == "stragglers":
            out.append((key, d["stragglers"] == want, str(d["stragglers"])))
        elif key == "rank_pct":
            for part, lohi in want.items():
                got = [r[f"{part}_pct"] for r in ranks]
                out.append((f"{part}%", all(_in(v, lohi) for v in got),
                            ", ".join(f"{v:.1f}" for v in got)))
        elif key == "gpu_breakdown":
            if want is None:
                out.append((key, all("gpu_breakdown" not in r for r in ranks), "none"
                            if all("gpu_breakdown" not in r for r in ranks) else "present"))
                continue
            for field, lohi in want.items():
                got = [r.get("gpu_breakdown", {}).get(field) for r in ranks]
                ok = all(v is not None and _in(v, lohi) for v in got)
                out.append((f"GPU {field}", ok, ", ".join(str(v) for v in got)))
        elif key == "step_median_ms":
            med = statistics.median(s["step_ms"] for s in d["steps"])
            out.append((key, _in(med, want), f"{med:.1f}"))
        elif key == "hosts_unknown":
            hosts = sorted({r["host"] for r in ranks})
            out.append((key, hosts == [""], str(hosts)))
        elif key == "comm_seen":
            got = max(r["comm_ms"] for r in ranks)
            out.append((key, (got > 0) == want, f"{got:.2f} ms"))
        elif key == "comm_kinds":
            kinds = sorted({k for r in ranks for k in r.get("comm_by_kind", {})})
            out.append((key, set(want) <= set(kinds), str(kinds)))
        elif key == "top_suggestion":
            top = d["suggestions"][0]["knob"] if d["suggestions"] else None
            out.append((key, top == want, str(top)))
        elif key == "text_absent":
            text = " ".join([s["why"] for s in d["suggestions"]] + d["warnings"])
            out.append((key, not any(t in text for t in want), "absent" if not any(
                t in text for t in want) else "present"))
        elif key == "suggestion_has":  # the cause named: in a suggestion's words
            text = " ".join(f"{s['current']} {s['why']}" for s in d["suggestions"])
            missing = [t for t in want if t not in text]
            out.append((key, not missing, "has all" if not missing else
                        "lacks " + "; ".join(missing)))
        elif key == "warning_has":
            out.append((key, all(any(t in w for w in d["warnings"]) for t in want),
                        "; ".join(d["warnings"])[:120]))
        elif key == "estimate_within":  # [{knob, ms, pct, source}]: a published answer
            for w in want:
                got = next((x["estimated_step_ms"] for x in d["suggestions"]
                            if x["knob"] == w["knob"]), None)
                err = None if got is None else 100 * (got - w["ms"]) / w["ms"]
                out.append((f"{w['knob']} estimate", err is not None and abs(err) <= w["pct"],
                            "none" if got is None else
                            f"{got:,.0f} ms against {w['ms']:,.0f} ({err:+.1f}%)"))
        elif key == "slowest_stage":
            p = d.get("pipeline") or {}
            st = next((s["stage"] for s in p.get("stages", [])
                       if s["rank"] == p.get("slowest_rank")), None)
            out.append((key, st == want, str(st)))
        elif key == "annotations_not_work":
            ok, got = _annotations_not_work(path, d)
            out.append((key, ok, got))
        else:
            out.append((key, False, "unknown check"))
    wrong = violations(report) + [w for w in d["warnings"] if w.startswith("did not add up")]
    out.append(("adds up", not wrong, "; ".join(wrong) or "yes"))
    if d["confidence"] == "high":
        out.append(("no wrong high", all(ok for _, ok, _ in out), d["confidence"]))
    return out


def run() -> list[dict]:
    import gpuscope

    facts = known()
    rows = []
    for name, path in folders().items():
        case = facts.get(name)
        if case is None:
            rows.append({"case": name, "known": "(nothing recorded in known.json)", "answer": "",
                         "checks": [("known", False, "no entry")]})
            continue
        rep = gpuscope.analyze(path)
        d = rep.to_dict()
        answer = (f"{d['verdict']} {d['verdict_share']:.0%}, confidence {d['confidence']}"
                  + (f" ({'; '.join(d['confidence_why'])})" if d["confidence_why"] else "")
                  + f"; {d['ranks_analysed']} of {d['world_size']} rank(s), "
                  f"{d['steps_analysed']} step(s)")
        rows.append({"case": name, "known": case["known"], "answer": answer,
                     "checks": check(path, case["checks"], rep)})
    return rows


def write(rows: list[dict], path: str) -> None:
    lines = ["# Accuracy: gpuscope on traces from other people's machines", "",
             "Generated by `python scripts/accuracy.py` (do not edit by hand); the same checks run "
             "in `tests/test_accuracy_corpus.py`. Each case is a folder of real torch.profiler "
             "traces that gpuscope was not built around: `sample_traces/external/` (its "
             "README.md says where each comes from and its licence) and, beside the repository, "
             "`../shared/traces/external/` and `../shared/traces/hta/`. *Known* is what the "
             "trace's own source says (the tool that shipped it, its expected output, the "
             "write-up that published it); *gpuscope* is what `gpuscope analyze FOLDER` gives; "
             "*checks* are the facts of `sample_traces/external/known.json`, plus: every report "
             "adds up (docs/rules.md) and no confidence \"high\" comes with a failed check.", "",
             "| case | known | gpuscope | checks |", "| --- | --- | --- | --- |"]
    for r in rows:
        checks = "; ".join(f"{'ok' if ok else 'FAILED'} {k}: {got}" for k, ok, got in r["checks"])
        cell = lambda s: s.replace("|", "\\|")  # noqa: E731
        lines.append(f"| {r['case']} | {cell(r['known'])} | {cell(r['answer'])} | {cell(checks)} |")
    failed = sum(not ok for r in rows for _, ok, _ in r["checks"])
    lines += ["", f"{len(rows)} cases, {sum(len(r['checks']) for r in rows)} checks, "
              f"{failed} failed."]
    faults = fault_section()
    if faults:
        lines += [""] + faults
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from whatif_tables import section as applied_section

    applied = applied_section(os.path.join(ROOT, "benchmarks", "results", "whatif.json"))
    if applied:
        lines += [""] + applied
    from try_tables import section as trials_section

    tried = trials_section(os.path.join(ROOT, "benchmarks", "results", "try.json"))
    if tried:
        lines += [""] + tried
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def fault_section() -> list[str]:
    """The injected-fault tables (benchmarks/faults/tables.py) from their results file."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "faults"))
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from tables import section

    return section(os.path.join(ROOT, "benchmarks", "results", "faults.json"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "accuracy.md"))
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    rows = run()
    for r in rows:
        bad = [f"{k}: {got}" for k, ok, got in r["checks"] if not ok]
        print(f"{'FAIL' if bad else 'ok  '} {r['case']}: {r['answer']}" + (f"  {bad}" if bad else ""))
    if not args.no_write:
        write(rows, args.out)
    return 1 if any(not ok for r in rows for _, ok, _ in r["checks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
