"""Write docs/performance.md from the benchmark results files (never typed by hand).

    python scripts/make_performance_doc.py

Reads benchmarks/results/vs_hta.json (benchmarks/bench_vs_hta.py), scale.json
(benchmarks/bench_scale.py) and same_run.json (scripts/same_run.py); a missing file leaves its
section out with the command that makes it.
"""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
OUT = os.path.join(ROOT, "docs", "performance.md")


def _load(name: str):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def vs_hta(d: dict) -> list[str]:
    out = ["## Reading traces: against Holistic Trace Analysis", "",
           f"`python benchmarks/bench_vs_hta.py --repeat {d['repeat']}` on {d['cpu_count']} "
           "cores (HTA 0.5.0 in its own venv). gpuscope's time is its whole analysis (read, steps, "
           "verdict, suggestions), HTA's only its load (`TraceAnalysis(trace_dir=...)`), each in a "
           "fresh process after its imports, median of the runs; memory is the peak over the "
           "post-import baseline of the summed PSS of the tool's process tree (in brackets its "
           "anonymous part); end to end is the command a user types, the speed-up the median "
           "of gpuscope / HTA pairs run back to back. Budgets (DESIGN.md): a tenth of HTA's load "
           "time, under 2x the raw JSON in memory, 5x faster end to end.", "",
           "| trace | raw JSON | gpuscope | HTA load | ratio | gpuscope memory (x raw) [heap] "
           "| HTA memory | end to end: gpuscope / HTA | end-to-end peak: gpuscope / HTA |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        out.append(
            f"| {r['trace']} | {r['raw_json_mb']:.2f} MB | {r['gpuscope_s']:.3f} s | "
            f"{r['hta_s']:.3f} s | {r['time_ratio']:.2f} | {r['gpuscope_tree_peak_mb']:.1f} MB "
            f"({r['gpuscope_tree_over_raw']:.2f}x) [{r['gpuscope_tree_anon_over_raw']:.2f}x] | "
            f"{r['hta_tree_peak_mb']:.1f} MB | {r['gpuscope_cli_s']:.2f} s / {r['hta_cli_s']:.2f} s "
            f"({r['cli_speedup']:.1f}x) | {r['gpuscope_cli_peak_mb']:.0f} MB / "
            f"{r['hta_cli_peak_mb']:.0f} MB |")
    return out + [""]


def scale(d: dict) -> list[str]:
    out = ["## Many ranks", "",
           f"`python benchmarks/bench_scale.py --repeat {d['repeat']}` on {d['cpu_count']} cores: "
           "run dirs written by the recorder's own writer (a DDP job, rank 17 computing 15% "
           "longer), analysed end to end in a fresh process, median of the runs (fastest in "
           "brackets); \"JSON only\" is the same run without its column side files; peak memory "
           "is the main process's peak RSS above its post-import baseline. Budget (DESIGN.md): "
           "1,024 ranks x 1,000 steps in under 3 s, memory linear in ranks x steps.", "",
           "| ranks x steps | record files (+ side files) | analysis | JSON only | "
           "`gpuscope analyze DIR -q` (JSON only) | peak memory | per row | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        j = r["json_only"]
        out.append(
            f"| {r['ranks']:,} x {r['steps']:,} | {r['files_mb']:.0f} MB (+{r['side_files_mb']:.0f} MB) "
            f"| {r['analyze_s_median']:.2f} s ({r['analyze_s_min']:.2f}-) | "
            f"{j['analyze_s_median']:.2f} s ({j['analyze_s_min']:.2f}-) | {r['cli_s_median']:.2f} s "
            f"({j['cli_s_median']:.2f} s) | {r['peak_over_base_mb']:.0f} MB | "
            f"{r['bytes_per_row_peak']:.0f} B | {r['verdict']}, rank(s) {r['stragglers']} |")
    loops = [x for r in d["rows"] for x in r.get("python_loop_s", [])]
    if loops:
        out += ["", f"A fixed pure-Python loop timed before and after each size took "
                    f"{min(loops):.2f}-{max(loops):.2f} s during the run (the machine's own "
                    "drift)."]
    return out + [""]


def same_run(d: dict) -> list[str]:
    out = ["## The same run from both sources", "",
           f"`python scripts/same_run.py --runs {d['runs']} --busy {d['busy_cores']}` on "
           f"{d['cpu_count']} cores, {d['busy_cores']} of them kept busy by a spinning process: "
           f"each demo scenario ({d['steps']} steps, 2 ranks, gloo) recorded by gpuscope and "
           "profiled by torch.profiler in the same processes; the record over the steps the "
           "profiler captured and the traces are analysed and compared (\"record_all_steps\": "
           f"the record over all its steps, as a user reads it; {d['seconds']:.0f} s in all).", "",
           "| scenario | runs | same verdict and stragglers from both | the scenario's label |",
           "| --- | --- | --- | --- |"]
    for s, v in d["summary"].items():
        out.append(f"| {s} | {v['runs']} | {v['agree']} of {v['runs']} | {v['right']} of "
                   f"{v['runs']} |")
    verdicts: dict = {}
    for r in d["results"]:
        for src in ("record", "kineto", "record_all_steps"):
            if src not in r:
                continue
            key = (r["scenario"], src)
            verdicts.setdefault(key, {}).setdefault(r[src]["verdict"], 0)
            verdicts[key][r[src]["verdict"]] += 1
    if d.get("trainings_that_failed"):
        out += ["", f"{len(d['trainings_that_failed'])} training(s) failed to run and were run "
                    "again (their output is in the results file)."]
    out += ["", "Verdicts per source: " + "; ".join(
        f"{s} {src}: " + ", ".join(f"{k} x{n}" for k, n in v.items())
        for (s, src), v in verdicts.items()) + "."]
    return out + [""]


def main() -> None:
    lines = ["# Performance figures", "",
             "Generated by `python scripts/make_performance_doc.py` from `benchmarks/results/` "
             "(do not edit by hand); each section names the command that measured it. The "
             "recording overhead and the estimates' accuracy are in the README's figures.", ""]
    for name, fn, cmd in (("vs_hta.json", vs_hta, "benchmarks/bench_vs_hta.py"),
                          ("scale.json", scale, "benchmarks/bench_scale.py"),
                          ("same_run.json", same_run, "scripts/same_run.py")):
        d = _load(name)
        lines += fn(d) if d else [f"(no {name} yet: run `python {cmd}`)", ""]
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
