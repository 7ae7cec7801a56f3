"""The same run recorded and profiled at once gets the same verdict, stragglers and top fix from
both sources.

    python scripts/same_run.py --runs 10 --busy 1     # the accuracy figure (~6 min on 2 cores)
    python scripts/same_run.py --runs 2 --only comm   # quicker

Each run is one demo scenario (2-rank gloo DDP on CPU, 24 steps; the balanced one at batch 8192
as in the tests), recorded by
gpuscope and profiled by torch.profiler in the same processes. `--busy N` keeps N cores busy with
spinning processes meanwhile, as a shared machine would. The profiler captures some of the steps
(two cycles); a run agrees when the record over those same steps and the traces give the same
verdict and name the same stragglers, or when both say their differing verdicts are a close
call (low confidence) and name the same stragglers (the record over all its steps is kept beside, as a user
reads it: its other steps may differ, e.g. the profiler's own trace writing lengthens the steps
it runs in); the top suggestion must be the same knob and proposed value with estimates within
15% of each other (same_fix; adjacent_fix: the workers one rung apart, estimates as close); the scenario's own label is checked for all three (the balanced `compute` scenario may come out
jitter-bound on shared cores, from both sources alike; and where no straggler is injected, a rank
the loop's own clock shows computing 10% longer, its vCPU shared more with the busy processes,
is rightly named: `loop_ms`). Results go to benchmarks/results/same_run.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "faults"))
from measured import commit  # noqa: E402  (benchmarks/measured.py)

EXPECTED = {"data": {"data-bound"}, "comm": {"comm-bound"}, "imbalanced": {"imbalanced"},
            "compute": {"compute-bound", "jitter-bound"}}
STRAGGLERS = {"imbalanced": [1]}
#: the balanced scenario at the batch the tests and the samples use (its comm share stays away
#: from the threshold)
EXTRA = {"compute": ("--batch-size", "8192")}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _ends(text: str, n: int = 6000) -> str:
    """The head and the tail of a long output (a rank's own error comes before torchrun's)."""
    return text if len(text) <= 2 * n else text[:n] + "\n[...]\n" + text[-n:]


def leaning_call(a: dict, b: dict) -> bool:
    """One source names one straggler and the other names the same rank as probably one: it
    arrived last in most steps but not enough of them for the tests (Roles.probable), which its
    straggler line says ("too few steps to rule out chance"): the two differ on one step's order
    of arrival (seen: the traces had rank 1 last in 8 of 8 profiled steps, the record in 7 of 8).
    The same rank and the same label from both; one of them less sure, and saying so. (Where
    the straggler decides the label, imbalanced or jitter-bound, a probable one also makes the
    verdict's confidence low; a comm-bound verdict does not rest on it, and stays as sure.)"""
    return _named_and_said(a, b, "probable_stragglers")


def threshold_call(a: dict, b: dict) -> bool:
    """One source names one straggler and the other names the same rank a minor straggler
    (consistently late, under the imbalance threshold): the same late rank, its lateness
    measured either side of the threshold (seen at load 4: rank 0 waiting 16% of the step by
    the record, 11.9% by the traces). The same label from both."""
    return _named_and_said(a, b, "minor_stragglers")


def _named_and_said(a: dict, b: dict, said: str) -> bool:
    """Either reading names one straggler, and the other, with the same label, names none but
    lists that rank under `said` (probable or minor stragglers)."""
    return any(len(named["stragglers"]) == 1 and named["verdict"] == other["verdict"]
               and not other["stragglers"] and other.get(said) == named["stragglers"]
               for named, other in ((a, b), (b, a)))


def names(g: dict, ranks: list) -> bool:
    """The reading names these stragglers: confirmed, or (one rank) probably, at low confidence."""
    return g["stragglers"] == ranks or (
        bool(ranks) and not g["stragglers"] and g.get("probable_stragglers") == ranks
        and g["confidence"] == "low")


#: how far apart the two sources' estimates of the same fix may be (DESIGN: within 15%)
FIX_TOLERANCE = 0.15


def fixes_adjacent(a: dict | None, b: dict | None) -> bool:
    """The same knob with estimates within FIX_TOLERANCE, its proposed values next to each other
    on the knob's ladder (DataLoader workers: analyze/bottlenecks/data.WORKER_COUNTS; the sync
    interval: whatif.SYNC_MULTIPLES of the current one): a rung
    rounds a measured need up, and two measurements of one run can fall either side of a rung
    (a busy core: 1 run of 10, 4 against 6 workers, estimates 10.75 and 10.41 ms). Not counted
    as the same fix; the test accepts it, said."""
    from gpuscope.analyze.bottlenecks.data import WORKER_COUNTS
    from gpuscope.analyze.whatif import SYNC_MULTIPLES

    if a is None or b is None or a["knob"] != b["knob"]:
        return False
    lo, hi = sorted((a["estimated_step_ms"], b["estimated_step_ms"]))
    try:
        if a["knob"] == "num_workers":
            i, j = (WORKER_COUNTS.index(int(x["proposed"])) for x in (a, b))
        elif a["knob"] == "sync_frequency":  # "every K steps" / "accumulation K", per current
            if a.get("current") != b.get("current"):
                return False
            cur = _first_int(a.get("current"))
            i, j = (SYNC_MULTIPLES.index(_first_int(x["proposed"]) // cur) for x in (a, b))
        else:
            return False
    except (ValueError, TypeError, ZeroDivisionError):
        return False
    return abs(i - j) == 1 and hi <= (1 + FIX_TOLERANCE) * lo


def _first_int(text) -> int:
    """The first whole number in a suggestion's value ("every 12 steps" -> 12)."""
    import re

    m = re.search(r"\d+", str(text))
    if m is None:
        raise ValueError(text)
    return int(m.group())


def fixes_agree(a: dict | None, b: dict | None) -> bool:
    """The same top fix: the same knob and proposed value, estimates within FIX_TOLERANCE of
    each other (both none: agree)."""
    if a is None or b is None:
        return a is None and b is None
    lo, hi = sorted((a["estimated_step_ms"], b["estimated_step_ms"]))
    return (a["knob"], a["proposed"]) == (b["knob"], b["proposed"]) and hi <= (1 + FIX_TOLERANCE) * lo


def loop_clock(path: str, steps=None) -> dict:
    """ms of local work per step by rank, on the training loop's own clock (the demo's
    `--timings`: perf_counter around forward, backward's compute to its last gradient and the
    optimizer step, no communication inside), medians after the first step; over `steps` only
    (the profiled ones, the steps the readings analysed) where given."""
    import statistics

    own = {}
    for line in open(path):
        d = json.loads(line)
        parts = [d["forward_s"], d.get("backward_compute_s") or [], d.get("optimizer_s") or []]
        if steps:
            parts = [[x[i] for i in sorted(steps) if i < len(x)] for x in parts]
        else:
            parts = [x[1:] or x for x in parts]
        own[d["rank"]] = round(1e3 * sum(statistics.median(xs) for xs in parts if xs), 3)
    return own


def clock_confirms(ranks: list, loop_ms: dict) -> bool:
    """Every rank in `ranks` did at least 10% more local work per step than the others' median,
    by the loop's own clock: on a busy 2-core machine one rank can really compute longer for a
    whole run (its vCPU shared with the spinning processes more than the other's); the tool is
    right to name it. The fault benchmark's rule (benchmarks/faults/score.py)."""
    from score import clock_confirms as confirms

    return bool(loop_ms) and confirms(ranks, {"local_ms": loop_ms})


def one(scenario: str, steps: int, out: str, extra: tuple = ()) -> dict:
    from gpuscope.demo.launch import run_training

    run_training(scenario, os.path.join(out, "record"), steps,
                 profile_dir=os.path.join(out, "kineto"),
                 extra=(*extra, "--timings", os.path.join(out, "timings.jsonl")))
    return read(scenario, out)


def read(scenario: str, out: str) -> dict:
    """The three readings of one run kept in `out` (record/, kineto/, timings.jsonl), judged."""
    from dataclasses import replace

    import gpuscope
    from gpuscope.analyze.run import analyze_table
    from gpuscope.readers import read_path

    def summary(r) -> dict:
        top = r.suggestions[0] if r.suggestions else None
        return {"verdict": r.verdict.label, "confidence": r.verdict.confidence,
                "evidence": list(r.verdict.evidence),
                "stragglers": r.straggler_ranks,
                "probable_stragglers": r.probable_straggler_ranks,
                "minor_stragglers": [m.rank for m in r.minor_stragglers],
                "fix": ({"knob": top.knob, "current": str(top.current),
                         "proposed": str(top.proposed),
                         "estimated_step_ms": round(top.estimated_step_ms, 2)} if top else None),
                "shares": {k: round(v, 3) for k, v in r.verdict.time_by_label.items()},
                "wait_pct": [round(x.wait_pct, 1) for x in r.ranks],
                "exposed_pct": [round(x.comm_exposed_pct, 1) for x in r.ranks]}

    kin = gpuscope.analyze(os.path.join(out, "kineto"))
    record = read_path(os.path.join(out, "record"))
    # the profiler captured some of the steps (two cycles): the record over those same steps,
    # and over all of its steps as a user would read it
    profiled = set(kin.table.frame["step"].tolist())
    keep = record.frame["step"].isin(profiled)
    same = replace(record, frame=record.frame[keep].reset_index(drop=True),
                   comm=(record.comm[record.comm["step"].isin(profiled)].reset_index(drop=True)
                         if record.comm is not None else None))
    got = {"record": summary(analyze_table(same, skip=0)), "kineto": summary(kin),
           "record_all_steps": summary(gpuscope.analyze(os.path.join(out, "record")))}
    timings = os.path.join(out, "timings.jsonl")
    got_clock = {"loop_ms": loop_clock(timings, profiled), "loop_ms_all": loop_clock(timings)}
    return {"scenario": scenario, **judge(scenario, got, got_clock["loop_ms"],
                                          got_clock["loop_ms_all"]),
            "steps": sorted(profiled), **got, **got_clock,
            **in_flight(kin.table.frame, same.frame)}


def in_flight(traced, recorded) -> dict:
    """The communication each source has behind compute (comm_ns - comm_exposed_ns, ms a step,
    mean over ranks and steps): for DDP on a CPU both hold the window its synchronization was in
    flight for, from its first bucket's launch (record/ddp_timing.py, readers/kineto/steps.py),
    and their ratio says how closely the two clocks agree on it. Empty without any."""
    if not len(recorded) or not len(traced):
        return {}
    hid = lambda f: float((f["comm_ns"] - f["comm_exposed_ns"]).mean()) / 1e6  # noqa: E731
    t, r = hid(traced), hid(recorded)
    return {"hidden_ms": {"traced": round(t, 3), "recorded": round(r, 3),
                          "ratio": round(t / r, 3) if r > 0 else None}}


def right_reading(scenario: str, g: dict, loop_ms: dict) -> bool:
    """The scenario's own label and stragglers; or, in a scenario with none injected, a rank the
    loop's own clock shows computing longer named as a straggler (the verdict imbalanced, or
    the scenario's own label)."""
    injected = STRAGGLERS.get(scenario, [])
    if g["verdict"] in EXPECTED[scenario] and names(g, injected):
        return True
    named = g["stragglers"] or g.get("probable_stragglers") or []
    return (not injected and g["verdict"] in EXPECTED[scenario] | {"imbalanced"}
            and clock_confirms(named, loop_ms))


def judge(scenario: str, got: dict, loop_ms: dict | None = None,
          loop_ms_all: dict | None = None) -> dict:
    """agree, close_call, right and same_fix of one run's three readings (the loop's clock over
    the profiled steps, or over all steps for the record read whole, `loop_ms_all`)."""
    rec, k = got["record"], got["kineto"]
    agree = rec["verdict"] == k["verdict"] and rec["stragglers"] == k["stragglers"]
    # the verdicts differ, but each report says its verdict is a close call (low confidence:
    # a near tie, or one step decides it); the stragglers are the same
    close = (not agree and rec["stragglers"] == k["stragglers"]
             and rec["confidence"] == k["confidence"] == "low") or leaning_call(rec, k) \
        or threshold_call(rec, k)
    right = all(right_reading(scenario, g, (loop_ms_all if name == "record_all_steps"
                                            and loop_ms_all else loop_ms) or {})
                for name, g in got.items())
    return {"agree": agree, "close_call": close, "right": right,
            "same_fix": fixes_agree(rec["fix"], k["fix"]),
            "adjacent_fix": fixes_adjacent(rec["fix"], k["fix"])}


def summarize(results: list, scenarios) -> dict:
    import statistics

    def hidden_ratio(s) -> dict:
        """The traced hidden communication over the recorded (in_flight), its range."""
        xs = sorted(r["hidden_ms"]["ratio"] for r in results if r["scenario"] == s
                    and (r.get("hidden_ms") or {}).get("ratio") is not None)
        return {"hidden_ratio": {"min": xs[0], "median": statistics.median(xs), "max": xs[-1],
                                 "runs": len(xs)}} if xs else {}

    return {s: {"runs": sum(r["scenario"] == s for r in results),
                "agree": sum(r["agree"] for r in results if r["scenario"] == s),
                "close_calls": sum(r["close_call"] for r in results if r["scenario"] == s),
                "same_fix": sum(r["same_fix"] for r in results if r["scenario"] == s),
                "adjacent_fix": sum(r.get("adjacent_fix", False) for r in results
                                    if r["scenario"] == s),
                "right": sum(r["right"] for r in results if r["scenario"] == s),
                **hidden_ratio(s)}
            for s in scenarios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--busy", type=int, default=1, help="cores kept busy meanwhile")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--only", nargs="*", default=list(EXPECTED))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "same_run.json"))
    ap.add_argument("--keep", metavar="DIR", help="keep the runs whose sources disagree, or "
                    "miss the scenario's label or stragglers, here")
    ap.add_argument("--judge", metavar="FILE", help="judge the readings a results file holds "
                    "again, by this script's rules, and write the file back (no training)")
    args = ap.parse_args()
    if args.judge:
        with open(args.judge) as fh:
            doc = json.load(fh)
        for r in doc["results"]:
            r.update(judge(r["scenario"], {k: r[k] for k in ("record", "kineto",
                                                           "record_all_steps")},
                           r.get("loop_ms"), r.get("loop_ms_all")))
        doc["summary"] = summarize(doc["results"], doc["summary"])
        doc["judged_by"] = commit()
        with open(args.judge, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(json.dumps(doc["summary"]))
        return
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    results, failed = [], []
    t0 = time.perf_counter()
    try:
        for i in range(args.runs):
            for scenario in args.only:
                res = None
                for attempt in range(2):  # a training that fails to start is run again, said
                    with tempfile.TemporaryDirectory(prefix="gpuscope-same-") as tmp:
                        try:
                            res = one(scenario, args.steps, tmp, EXTRA.get(scenario, ()))
                        except subprocess.CalledProcessError as exc:
                            failed.append({"scenario": scenario, "run": i, "attempt": attempt,
                                           "stderr": _ends(exc.stderr or ""),
                                           "stdout": _ends(exc.stdout or "")})
                            print(f"{scenario:10s} run {i}: the training failed (exit "
                                  f"{exc.returncode}); {'again' if attempt == 0 else 'given up'}",
                                  flush=True)
                            continue
                        if args.keep and (not res["agree"] or not res["right"]
                                          or not (res["same_fix"] or res["adjacent_fix"])):
                            shutil.copytree(tmp, os.path.join(args.keep, f"{scenario}-{i}"))
                        break
                if res is None:
                    continue
                res["run"] = i
                results.append(res)
                print(f"{scenario:10s} run {i}: record {res['record']['verdict']} "
                      f"{res['record']['stragglers']}, kineto {res['kineto']['verdict']} "
                      f"{res['kineto']['stragglers']}: {'agree' if res['agree'] else 'DIFFER'}"
                      f"{' (both say low: a close call)' if res['close_call'] else ''}"
                      f"{'' if res['right'] else ' (not the scenario label)'}; record, all "
                      f"steps: {res['record_all_steps']['verdict']}; fix "
                      f"{res['record']['fix']} / {res['kineto']['fix']}: "
                      f"{'same' if res['same_fix'] else 'DIFFER'}", flush=True)
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=5)
    summary = summarize(results, args.only)
    doc = {"commit": commit(), "runs": args.runs, "busy_cores": args.busy, "cpu_count": os.cpu_count(),
           "steps": args.steps, "injected_stragglers": STRAGGLERS, "seconds": round(time.perf_counter() - t0, 1),
           "summary": summary, "trainings_that_failed": failed, "results": results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
