"""Write docs/performance.md and the README's budget lines from the benchmark results files (a
figure is never typed by hand).

    python scripts/make_performance_doc.py

Reads benchmarks/results/*.json: overhead.json (benchmarks/bench_overhead.py), row_paths.json
(benchmarks/bench_row_paths.py), modules.json
(benchmarks/bench_modules.py),
overhead_cases.json and overhead_cases_gpu.json (benchmarks/bench_overhead_cases.py),
overhead_gpu.json (bench_overhead.py --device cuda),
whatif.json (benchmarks/bench_whatif.py), vs_hta.json (benchmarks/bench_vs_hta.py), scale.json
(benchmarks/bench_scale.py), same_run.json (scripts/same_run.py), fuzz.json (scripts/fuzz.py),
soak.json (scripts/soak.py), fr.json (benchmarks/bench_fr.py), upstream_2d.json (scripts/upstream_2d.py), scale_large.json
and scale_huge.json (benchmarks/bench_scale.py --out ...: past 1,024 ranks, and more
rank-steps than memory); a missing file leaves
its section out with the command that makes it. The README's lines between
`<!-- budgets:begin -->` and `<!-- budgets:end -->` are rewritten: one per budget, its figure,
and a link to the section here; those between `<!-- firstrun:... -->`, what `make demo` cost on
a fresh clone (first_run.json, benchmarks/bench_first_run.py).
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
OUT = os.path.join(ROOT, "docs", "performance.md")
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- budgets:begin -->", "<!-- budgets:end -->"
FIRST_RUN = ("<!-- firstrun:begin -->", "<!-- firstrun:end -->")
EVERY_RANK = ("<!-- everyrank:begin -->", "<!-- everyrank:end -->")


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
           "fresh process after its imports, median of the runs" + (
               ", timed in pairs back to back with nothing sampling them, the ratio the median "
               "of the pairs'; memory from one more run of each, sampled: "
               if any("time_ratio_pairs" in r for r in d["rows"]) else "; memory is ") +
           "the peak over the "
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


def _fleet(f: dict | None) -> list[str]:
    """A job's many ranks of small traces, this checkout beside another (big_traces.json)."""
    if not f:
        return []
    def said(r):
        return (f"{r['command_s']:.1f} s, {r['command_peak_mb']:,.0f} MB, {r['verdict']}, "
                f"ranks {', '.join(map(str, r['stragglers'])) or 'none'} named")
    base = f.get("base")
    line = (f"A job's many ranks, each a small trace ({f['input']}, {f['raw_json_mb']:,.0f} MB of "
            f"JSON; `--fleet {f['ranks']}`), the command with its process tree's peak PSS: "
            f"{f['this']['commit']} {said(f['this'])}")
    if base:
        line += f"; {base['commit']} beside it, the same files: {said(base)}"
    known = f["known"]
    return ["", line + f" (known: straggler {known['straggler']}, stalled rank "
                       f"{known['stall_rank']})."]


def big_traces(d: dict) -> list[str]:
    """Every rank's profiler trace at size (big_traces.json, bench_big_traces.py)."""
    out = ["## Every rank's profiler trace, at size", "",
           f"`python benchmarks/bench_big_traces.py` ({d['commit']}, {d['cores']} cores, "
           f"{d['mb_per_rank']:.0f} MB of JSON per rank in the generated runs: "
           "`benchmarks/big_traces.py`, a transformer's steps with NCCL buckets, a straggler and "
           "a data stall on known ranks). Time: the whole analysis in a fresh process after "
           "its imports, a run nothing samples; memory, from one more run: the peak of its "
           "process tree's summed PSS over the post-import baseline (the forked readers "
           "included), sampled every 10 ms; the command is "
           "`gpuscope analyze DIR -q --json F`, start-up included. MB/s per core: the JSON "
           "read over the analysis time and the cores; HTA's load of the same files in the "
           "same run, where it fits.", "",
           "| input | ranks / files | JSON | gpuscope | MB/s per core | events/s | peak over "
           "imports (x largest file) | command | HTA load: time, memory | named |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["generated"] + d["public"]:
        x = (f" ({r['peak_over_largest_file']:.2f}x)" if "peak_over_largest_file" in r else "")
        hta = (f"{r['hta_s']:.2f} s, {r['hta_peak_over_imports_mb']:,.0f} MB "
               f"(gpuscope {r['gpuscope_over_hta_time']:.2f}x its time)" if "hta_s" in r
               else "not run" if "hta" in r else "-")
        said = ""
        if "straggler_named" in r:
            said = ("straggler " + ("yes" if r["straggler_named"] else "NO") + ", stall "
                    + ("yes" if r.get("stall_named") else "NO"))
        out.append(f"| {r['input']} | {r['files']} | {r['raw_json_mb']:,.0f} MB | "
                   f"{r['gpuscope_s']:.2f} s | {r['mb_per_s_per_core']:.0f} | "
                   f"{r['events_per_s']:,} | {r['gpuscope_peak_over_imports_mb']:,.0f} MB{x} | "
                   f"{r['command_s']:.2f} s, {r['command_peak_mb']:,.0f} MB | {hta} | {said} |")
    out.append("")
    for r in d["generated"]:
        if "hta" in r and "hta_s" not in r:
            out.append(f"HTA at {r['ranks']} ranks: {r['hta']}.")
    fl = next((r["floor"] for r in d["generated"] if "floor" in r), None)
    if fl:
        out += ["", f"The floor, one core each on the {fl['file_mb']:.0f} MB file: a typed "
                "msgspec decode of it into the same columns (names and categories interned, ts, "
                f"dur, stream, correlation, thread) takes {fl['floor_s']:.2f} s "
                f"({fl['floor_mb_per_s']:.0f} MB/s); gpuscope's parse into its columns "
                f"{fl['gpuscope_s']:.2f} s ({fl['parse_over_floor']:.2f}x), its whole read of "
                f"the file (steps, collectives, op and kernel views too) "
                f"{fl['gpuscope_read_s']:.2f} s ({fl['read_over_floor']:.2f}x, one core too)."]
    st = d.get("start")
    if st:
        out += ["", f"The command's start: `import gpuscope.cli` (all that runs before the "
                f"readers' processes are forked) takes {st['import_cli_s']:.3f} s over a bare "
                f"interpreter ({st['python_s']:.3f} s); `gpuscope analyze` of HTA's smallest test "
                f"trace {st['analyze_small_trace_s']:.2f} s over it, end to end."]
    out += _fleet(d.get("fleet"))
    ray = next((r["ray"] for r in d["generated"] if "ray" in r), None)
    if ray:
        big = next(r for r in d["generated"] if "ray" in r)
        out += ["", f"`--engine ray` on a local cluster of {ray['nodes']} nodes (two `ray start` "
                "on 127.0.0.1, one CPU and their own memory budget each), the "
                f"{big['ranks']}-rank run: {ray['ray_s']:.1f} s against the local engine's "
                f"{ray['local_s']:.1f} s ({ray['speedup']:.2f}x: the same two cores; Ray "
                "spreads the files over machines that a real cluster has more of); straggler "
                + ("named" if ray.get("straggler_named") else "NOT named") + ", stall "
                + ("named" if ray.get("stall_named") else "NOT named") + "."]
    return out + [""]


def scale(d: dict) -> list[str]:
    out = ["## Many ranks", "",
           f"`python benchmarks/bench_scale.py --repeat {d['repeat']}` on {d['cpu_count']} cores: "
           "run dirs written by the recorder's own writer (a DDP job, rank 17 computing 15% "
           "longer), analysed end to end in a fresh process, median of the runs (fastest in "
           "brackets); \"JSON only\" is the same run without its column side files; peak memory "
           "is the main process's peak RSS above its post-import baseline; \"x json.loads\" is "
           "the JSON-only analysis over the standard library's `json.loads` of every line of the "
           "same files in one process (the least that decoding them once costs). Budget "
           "(DESIGN.md): 1,024 ranks x 1,000 steps in under 3 s, memory linear in ranks x steps.",
           "",
           "| ranks x steps | record files (+ side files) | analysis | JSON only (x json.loads) | "
           "`gpuscope analyze DIR -q` (JSON only) | peak memory | per row | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        j = r["json_only"]
        loads = f" ({j['over_json_loads']:.2f}x)" if "over_json_loads" in j else ""
        out.append(
            f"| {r['ranks']:,} x {r['steps']:,} | {r['files_mb']:.0f} MB (+{r['side_files_mb']:.0f} MB) "
            f"| {r['analyze_s_median']:.2f} s ({r['analyze_s_min']:.2f}-) | "
            f"{j['analyze_s_median']:.2f} s ({j['analyze_s_min']:.2f}-){loads} | {r['cli_s_median']:.2f} s "
            f"({j['cli_s_median']:.2f} s) | {r['peak_over_base_mb']:.0f} MB | "
            f"{r['bytes_per_row_peak']:.0f} B | {r['verdict']}, rank(s) {r['stragglers']} |")
    out += drift_note(d)
    return out + [""]


def drift_note(d: dict) -> list[str]:
    """The machine's speed during a scale run: the fixed loop timed before and after each size."""
    loops = [x for r in d["rows"] for x in r.get("python_loop_s", [])]
    if not loops:
        return []
    return ["", f"A fixed pure-Python loop timed before and after each size took "
                f"{min(loops):.2f}-{max(loops):.2f} s during the run (the machine's own drift)."]


def scale_large(d: dict) -> list[str]:
    """Past 1,024 ranks: the curve toward the 10,000-rank budget (issue 40), cost per rank-step."""
    sizes = ",".join(f"{r['ranks']}x{r['steps']}" for r in d["rows"])
    out = ["## Many ranks, past one thousand", "",
           f"`python benchmarks/bench_scale.py --sizes {sizes} --repeat {d['repeat']} "
           f"--out benchmarks/results/scale_large.json` on {d['cpu_count']} cores, as above. "
           "Budget (issue 40): 10,000 ranks x 1,000 steps in at most 15 s and 4 GB; 10,000 x "
           "10,000 within 24 GB at all, its time linear. Cost per rank-step is the analysis's "
           "time over ranks x steps.", "",
           "| ranks x steps | record files (+ side files) | analysis | per rank-step | "
           "`gpuscope analyze DIR -q` | peak memory | JSON only: analysis | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        j = r["json_only"]
        loads = f" ({j['over_json_loads']:.2f}x json.loads)" if "over_json_loads" in j else ""
        out.append(
            f"| {r['ranks']:,} x {r['steps']:,} | {r['files_mb']:.0f} MB (+{r['side_files_mb']:.0f}"
            f" MB) | {r['analyze_s_median']:.2f} s | {1e6 * r['analyze_s_median'] / r['rows']:.2f}"
            f" us | {r['cli_s_median']:.2f} s | {r['peak_over_base_mb']:.0f} MB | "
            f"{j['analyze_s_median']:.2f} s{loads} | {r['verdict']}, rank(s) {r['stragglers']} |")
    out += drift_note(d)
    big = max(d["rows"], key=lambda x: x["rows"])
    need = 100_000_000 * big["bytes_per_row_peak"] / 2**30
    out += ["", f"At the {big['bytes_per_row_peak']:.0f} bytes per rank-step the largest size "
                f"peaked at, 100 million rank-steps would need about {need:.0f} GB in memory: "
                "more than this machine has (next section)."]
    return out + [""]


def scale_huge(d: dict, large: dict | None) -> list[str]:
    """More rank-steps than memory: the tables kept in files (rowblock.memory_plan), each size in
    a control group of its own (its room in the row)."""
    out = ["## More rank-steps than memory", "",
           f"`python benchmarks/bench_scale.py --sizes RANKSxSTEPS --repeat {d['repeat']} "
           f"--skip-json --sample-every {d['sample_every']:g} --append --out "
           f"benchmarks/results/scale_huge.json` on {d['cpu_count']} cores, once per size, each in "
           "a control group with less memory than its analysis peaks at in memory (a limit set "
           "for the run; the room it left is in the table), the run dirs made by the same writer. "
           "When a run dir's rows times the peak bytes per rank-step measured above exceed the "
           "memory available (the control group's room where that is less), its step and "
           "collectives tables are kept in unlinked files under `$GPUSCOPE_SPILL_DIR` (else the "
           "temporary directory) that the kernel writes out and reads back, and the report says "
           "so; without them such a run is stopped for memory. \"Held\" is the peak of what the "
           "kernel cannot take back (anonymous and shared memory of the process tree, sampled as "
           "the command says), \"resident\" adds the tables' pages in memory at the time.", "",
           "| ranks x steps | record files (+ side files) | memory (room) | analysis | "
           "per rank-step | held | resident | tables in files | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        m = r.get("memory_gb") or {}
        room = m.get("cgroup_room_at_start")
        out.append(
            f"| {r['ranks']:,} x {r['steps']:,} | {r['files_mb'] / 1024:.1f} GB "
            f"(+{r['side_files_mb'] / 1024:.1f} GB) | {m.get('machine', float('nan')):.1f} GB "
            f"({'-' if room is None else f'{room:.1f} GB'}) | {r['analyze_s_median']:.1f} s | "
            f"{1e6 * r['analyze_s_median'] / r['rows']:.2f} us | "
            f"{r.get('tree_held_peak_mb', float('nan')) / 1024:.1f} GB | "
            f"{r.get('tree_resident_peak_mb', float('nan')) / 1024:.1f} GB | "
            f"{'yes' if r.get('spilled') else 'no'} | {r['verdict']}, rank(s) {r['stragglers']} |")
    if large:
        ref = max(large["rows"], key=lambda x: x["rows"])
        per_ref = ref["analyze_s_median"] / ref["rows"]
        out += ["", "Per rank-step, against " + f"{ref['ranks']:,} x {ref['steps']:,} in memory "
                "(above): " + "; ".join(
                    f"{r['ranks']:,} x {r['steps']:,} {r['analyze_s_median'] / r['rows'] / per_ref:.1f}x"
                    for r in d["rows"]) + "."]
    out += drift_note(d)
    return out + [""]


def huge_note(d: dict | None) -> str:
    """The README's words on 10,000 x 10,000 (scale_huge.json)."""
    row = next((r for r in (d or {}).get("rows", [])
                if r["ranks"] == 10_000 and r["steps"] == 10_000), None)
    if row is None:
        return "not yet analysed"
    room = (row.get("memory_gb") or {}).get("cgroup_room_at_start")
    ok = row["analyze_s_median"] <= 120
    return (f"in at most 120 s within 8 GB: measured {row['analyze_s_median']:.0f} s"
            + (f" with {room:.0f} GB of room" if room else "")
            + ("" if ok else " (not yet within it)")
            + (", its tables in files" if row.get("spilled") else ""))


def instructions_note(d: dict | None) -> str:
    """The load-free gate beside the wall-clock figure: instructions per tiny-DDP micro-step."""
    tiny = ((d or {}).get("models") or {}).get("tiny")
    if not tiny:
        return ""
    return (f"; {tiny['added']:,} instructions per micro-step added ({tiny['added_pct']:.1f}% of "
            f"the plain step's, callgrind, {tiny.get('commit', d.get('commit', '?'))})")


def same_run(d: dict) -> list[str]:
    out = ["## The same run from both sources", "",
           f"`python scripts/same_run.py --runs {d['runs']} --busy {d['busy_cores']}` on "
           f"{d['cpu_count']} cores, {d['busy_cores']} of them kept busy by a spinning process: "
           f"each demo scenario ({d['steps']} steps, 2 ranks, gloo) recorded by gpuscope and "
           "profiled by torch.profiler in the same processes; the record over the steps the "
           "profiler captured and the traces are analysed and compared (\"record_all_steps\": "
           f"the record over all its steps, as a user reads it; {d['seconds']:.0f} s in all).", "",
           "| scenario | runs | same verdict and stragglers from both | same top fix (knob, "
           "value, estimates within 15%) | the scenario's label and stragglers in all three "
           "readings |",
           "| --- | --- | --- | --- | --- |"]
    for s, v in d["summary"].items():
        fix = f"{v['same_fix']} of {v['runs']}" if "same_fix" in v else "not measured"
        out.append(f"| {s} | {v['runs']} | {v['agree']} of {v['runs']} | {fix} | {v['right']} "
                   f"of {v['runs']} |")
    verdicts: dict = {}
    named: dict = {}  # stragglers named where the scenario injects none, or others than it does
    injected = d["injected_stragglers"]
    for r in d["results"]:
        for src in ("record", "kineto", "record_all_steps"):
            if src not in r:
                continue
            key = (r["scenario"], src)
            verdicts.setdefault(key, {}).setdefault(r[src]["verdict"], 0)
            verdicts[key][r[src]["verdict"]] += 1
            if r[src]["stragglers"] != injected.get(r["scenario"], []):
                ranks = str(r[src]["stragglers"])
                named.setdefault(key, {}).setdefault(ranks, 0)
                named[key][ranks] += 1
    if d.get("trainings_that_failed"):
        out += ["", f"{len(d['trainings_that_failed'])} training(s) failed to run and were run "
                    "again (their output is in the results file)."]
    out += ["", "Verdicts per source: " + "; ".join(
        f"{s} {src}: " + ", ".join(f"{k} x{n}" for k, n in v.items())
        for (s, src), v in verdicts.items()) + "."]
    if named:
        out += ["", "Stragglers other than the scenario's (a rank slower for a whole run on the "
                    "shared cores is a real straggler): " + "; ".join(
                        f"{s} {src}: " + ", ".join(f"{k} x{n}" for k, n in v.items())
                        for (s, src), v in named.items()) + "."]
    return out + [""]


def instructions(d: dict) -> list[str]:
    names = {"tiny": "tiny 1-rank DDP model (Linear(8, 8), SGD)",
             "nanogpt": "nanoGPT-style GPT, 4 micro-steps per optimizer step (AdamW, clipping)"}
    out = ["## In instructions", "",
           f"`python benchmarks/bench_instructions.py` (valgrind {d['valgrind']}, Python "
           f"{d['python']}): the instructions a micro-step executes, counted by callgrind in one "
           "process (gloo, 1 rank, both threads counted), plain and recorded with every default "
           "on. A count does not move with the machine's speed, as wall-clock rounds on this VM "
           "do; what it leaves out (caches, the GIL, system calls) is in the wall-clock figure "
           "above. Two counts of the same code differ by up to ~2,000 a micro-step (what the "
           "interpreter allocates where varies from run to run).", "",
           "| model | micro-steps | plain | recorded | added by gpuscope | commit |",
           "| --- | --- | --- | --- | --- | --- |"]
    for key, m in d["models"].items():
        out.append(f"| {names.get(key, key)} | {m['micro_steps']:,} | "
                   f"{m['plain_per_micro_step']:,} | {m['recorded_per_micro_step']:,} | "
                   f"+{m['added']:,} ({m['added_pct']:.2f}%) | {m.get('commit', d['commit'])} |")
    return out + [""]


def cuda_calls(d: dict) -> list[str]:
    """The CUDA path's calls per micro-step (the gate beside the instruction count)."""
    out = ["## CUDA calls per step", "",
           "`python benchmarks/bench_cuda_calls.py`: what the recorder asks of CUDA per "
           f"micro-step, counted through a fake of its CUDA seams (benchmarks/cuda_seam.py: it "
           f"counts, nothing runs on a device) on a tiny 1-rank DDP model, {d['steps']} "
           f"micro-steps with every default on (commit {d.get('commit')}). "
           "tests/test_cuda_calls.py fails when a change asks for more; what each call costs "
           "on a GPU is measured there (docs/gpu.md).", "",
           "| call | steps 0-63 (young) | later steps | as recording starts |",
           "| --- | --- | --- | --- |"]
    calls = sorted(set(d["young_per_step"]) | set(d["steady_per_step"]) | set(d["at_start"]))
    for c in calls:
        out.append(f"| `{c}` | {d['young_per_step'].get(c, 0):g} | "
                   f"{d['steady_per_step'].get(c, 0):g} | {d['at_start'].get(c, 0):g} |")
    return out + [""]


def modules(d: dict) -> list[str]:
    """record(modules=...)'s cost (modules.json, benchmarks/bench_modules.py)."""
    v = d["variants"]
    out = ["## Per-module timing (`record(modules=...)`)", "",
           f"`python benchmarks/bench_modules.py` ({d['model']}; Python {d['python']}, torch "
           f"{d['torch']}, {d['rounds']} rounds of {d['steps_per_round']} steps, the variants "
           "interleaved): each timed forward call costs "
           f"{d['hook_ns_per_call'] / 1e3:.1f} us on this CPU (an nn.Identity called in a tight "
           "loop with and without the two hooks, the median of the rounds' differences), what "
           "the column from calls multiplies out. The step medians beside it move by more than "
           "that from round to round: at this step length the hooks are within the noise.", "",
           "| modules | timed | forward calls per step | median step | from calls |",
           "| --- | --- | --- | --- | --- |"]
    for key, r in v.items():
        out.append(f"| {key} | {r['modules_timed']} | {r['forward_calls_per_step']:g} | "
                   f"{r['median_step_ms']:.1f} ms | +{r['added_us_per_step_from_calls']:.1f} us |")
    return out + [""]


def overhead(d: dict) -> list[str]:
    return ["## Recording overhead", "",
            f"`python benchmarks/bench_overhead.py` on {d['cpu_count']} cores ({d['device']}): the "
            f"`{d['scenario']}` demo, {d['ranks']} ranks (gloo), {d['runs_each']} rounds of three runs "
            f"of {d['steps_per_run']} steps (without gpuscope, with it, with it and live diagnosis "
            f"every {d['live_every']} steps; the order rotates every round), and the recorder's "
            "cost per step measured alone. Budget (DESIGN.md): at most 50 us per step and 0.5% of "
            "a 10 ms step.", "",
            "| measure | without gpuscope | with gpuscope | ratio / cost |",
            "| --- | --- | --- | --- |",
            f"| median step time | {d['median_step_ms_without']:.2f} ms | "
            f"{d['median_step_ms_with']:.2f} ms | {d['ratio_with_over_without']:.2f}"
            f"{_rounds(d.get('round_ratios'))} |",
            f"| the same with live diagnosis | {d['median_step_ms_without']:.2f} ms | "
            f"{d['median_step_ms_with_live']:.2f} ms | {d['ratio_with_live_over_without']:.2f}"
            f"{_rounds(d.get('round_ratios_live'))} |",
            f"| the recorder's whole cost per step, tiny 1-rank DDP model (every default timing; "
            f"a recorded and a plain model in one process, "
            f"{len(d.get('recorder_cost_ddp_round_costs_us') or []) or 'sequential'} interleaved "
            f"rounds, each recorded round in a recording of its own, the plain ones with none "
            f"open; the median of their differences{_interval(d)}) "
            f"| {d['ddp_tiny_step_us_without']:,.0f} us | {d['ddp_tiny_step_us_with']:,.0f} us | "
            f"+{d['recorder_cost_ddp_us_per_step']:,.0f} us per step |",
            f"| `rec.data()` + `rec.step()` alone, tight loop | | | "
            f"{d['recorder_cost_us_per_step']:.0f} us per step |",
            f"| live diagnosis, time inside `rec.step()` | | | {d['live_cost_us_per_step']:.0f} us "
            f"per step ({d['live_exchange_step_us_median']:,.0f} us at each exchange) |",
            f"| the column side file, made at each flush on the training thread | | | "
            f"{d['side_file_us_per_row']:.1f} us per step row |"] + _per_collective(
        d.get("recorder_cost_per_collective_us")) + [""]


def _per_collective(c: dict | None) -> list[str]:
    """Rows for what timing one collective adds to its call (bench_overhead.py)."""
    if not c:
        return []
    what = {"blocking": "a blocking all-reduce", "async_wait": "an async all-gather and its "
            "wait (FSDP's)", "functional": "a functional all-reduce and its wait (DTensor's)"}
    return [f"| timing {what.get(k, k)}, 1 rank, interleaved rounds, a `rec.step()` every 16 "
            f"calls (the step's summing included) | {v['without_us']:.1f} us "
            f"| {v['with_us']:.1f} us | +{v['cost_us']:.1f} us per call |" for k, v in c.items()]


def row_paths(d: dict) -> list[str]:
    """The two ways a micro-step becomes its row (row_paths.json, bench_row_paths.py)."""
    us = d["us_per_micro_step"]
    return ["## Making the rows", "",
            f"`python benchmarks/bench_row_paths.py` (Python {d['python']}, {d['commit']}): a "
            "recorded micro-step becomes its row at the flush, off the step's path but on the "
            "training thread. The common shape (forward, backward, optimizer in order, at most "
            "one fetch and one DDP tail) goes straight from its events to its row "
            "(`rows.plain_row`, the fast path of `rows.build`); every other shape is paired into "
            f"intervals and summed (the general path). On {d['micro_steps']} micro-steps of a real recording "
            f"({d['plain_shape']} of the common shape), both paths' rows equal:", "",
            "| path | per micro-step |", "| --- | --- |",
            f"| `plain_row` | {us['plain_row']:.2f} us |",
            f"| general (`interpret`, `sum_steps`) | {us['general']:.2f} us |", "",
            f"The short path saves {d['saved_us_per_micro_step']:.1f} us a micro-step: the reason "
            "a second implementation of the row is kept; `tests/test_rows.py` runs every row "
            "rule on both paths and gives both the same random micro-steps, and "
            "`tests/test_golden_cases.py` the micro-steps of real runs.", ""]


def overhead_gpu(d: dict) -> list[str]:
    """bench_overhead.py on a GPU: the same two figures as on the CPU, CUDA events and NVML on."""
    return ["## Recording overhead on a GPU", "",
            f"`{d.get('command', 'python benchmarks/bench_overhead.py --device cuda')}` on "
            f"{d.get('machine', 'a GPU machine')} ({d.get('commit') or 'commit not recorded'}): "
            "the recorder with CUDA-event timing and NVML sampling on.", "",
            "| what | without | with | cost |", "| --- | --- | --- | --- |",
            f"| the demo's `compute` scenario, {d['ranks']} rank, median step | "
            f"{d['median_step_ms_without']:.3f} ms | {d['median_step_ms_with']:.3f} ms | "
            f"{d['overhead_pct']:+.2f}% |",
            f"| a tiny DDP model (`Linear(8, 8)`), median of interleaved rounds | "
            f"{d['ddp_tiny_step_us_without']:.0f} us | {d['ddp_tiny_step_us_with']:.0f} us | "
            f"+{d['recorder_cost_ddp_us_per_step']:.0f} us per step |", "",
            "On the tiny model's launch-bound step that is far over the 50 us budget; the demo's "
            "step hardly sees it. Where it goes is not measured yet: on a GPU the recorder also "
            "records CUDA events (the fetch, the batch's arrival, DDP's last bucket, the step's "
            "end), reads them once complete, and samples NVML on a thread.", ""]


def overhead_cases(d: dict, title: str) -> list[str]:
    out = [f"## {title}", "",
           f"`python benchmarks/bench_overhead_cases.py --device {d['device']}` on {d['cpu_count']} "
           f"cores, {d['ranks']} rank(s) ({d['backend']}), {d['rounds']} rounds: training loops "
           "shaped like other people's code (`tests/workloads/`), each timed by its own "
           "`perf_counter` at every micro-step, recorded by gpuscope and with it switched off "
           "(`GPUSCOPE_DISABLE=1`, the same code otherwise), the pair's order alternating; the "
           "slower rank's mean micro-step after warm-up, median over the runs, and the median "
           "of the rounds' with / without ratios, with its 95% confidence interval where the "
           "rounds are enough for one (6 or more), else their range"
           + (", over the rounds the table names for the loops that ran more"
              if any(w.get("rounds", d["rounds"]) != d["rounds"] for w in d["workloads"].values())
              else "") + "."
           + ("" if d.get("commit") else " These figures are of an earlier recorder (the file "
              "names no commit), kept until a run of this one replaces them."), "",
           "| loop | micro-step without | with | difference | paired ratio |",
           "| --- | --- | --- | --- | --- |"]
    for w in d["workloads"].values():
        r = w["paired_ratios"]
        out.append(f"| {w['what']} | {w['micro_step_ms_without']:.2f} ms | "
                   f"{w['micro_step_ms_with']:.2f} ms | "
                   f"{w['micro_step_ms_with'] - w['micro_step_ms_without']:+.2f} ms | "
                   f"{w['paired_ratio_median']:.2f} {_ratio_spread(r)}"
                   + (f", {len(r)} rounds" if len(r) != d["rounds"] else "") + " |")
    return out + [""]


def whatif(d: dict) -> list[str]:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from whatif_tables import scored

    rows = scored(d)
    within = sum(abs(p["error_pct"]) <= 15 for _, p in rows)
    inside = sum(p["in_range"] for _, p in rows)
    return ["## Do the estimates hold?", "",
            f"`python benchmarks/bench_whatif.py --pairs {d['pairs']}` on {d['cpus']} cores "
            f"(torch {d['torch']}): the top suggestion applied and re-run, BEFORE and AFTER "
            f"alternated: the point within 15% of the re-run in {within} of {len(rows)} pairs, "
            f"the re-run inside the stated range in {inside}; each pair in "
            "[docs/accuracy.md](accuracy.md#applied-fixes).", ""]


def memory(d: dict) -> list[str]:
    leak, tok, oom = d["leak"], d["tokens"], d["oom"]
    lines = ["## Memory and throughput against independent measurements", "",
             f"`python benchmarks/bench_memory.py --runs {d['runs']}` on {d['cpu_count']} cores "
             "(2 ranks, gloo): a loop in which rank 1 keeps 8 MiB alive every step (the rate "
             "gpuscope reports against the loop's own VmRSS readings from /proc/self/status, "
             "their growth from the first analysed step to the last), the same loop with rank 1 asking for 1 PiB "
             "at step 12 (the post-mortem), and a language model on token ids with its FLOPs "
             "counted (samples/s against the loop's own count over its perf_counter time; the "
             "FLOPs against FlopCounterMode on the same shapes).", "",
             "| run | gpuscope | independent | error |", "| --- | --- | --- | --- |"]
    for i, r in enumerate(leak):
        lines.append(f"| leak {i + 1}: ranks named {r['ranks_named']} | "
                     f"{r['rate_mib_per_step']:.3f} MiB/step, fills the host in "
                     f"~{r['forecast_steps']:,} steps | {r['loop_vmrss_slope_mib_per_step']:.3f} "
                     f"MiB/step | {r['error_pct']:+.2f}% |")
    for i, r in enumerate(tok):
        same = "equal" if r["flops_per_step"] == r["flop_counter_here"] else "differ"
        lines.append(f"| tokens {i + 1} | {r['samples_per_s']:,.1f} samples/s, "
                     f"{r['tokens_per_s']:,.0f} tokens/s, {r['flops_per_step']:,.0f} FLOPs per "
                     f"step | {r['loop_samples_per_s']:,.1f} samples/s; FLOPs {same} | "
                     f"{r['error_pct']:+.2f}% |")
    lines += ["", "Out of memory: " + "; ".join(
        f"run {i + 1}: {r['text'] or 'no post-mortem'}" for i, r in enumerate(oom)) + ".", ""]
    return lines


def upstream_2d(d: dict) -> list[str]:
    lines = ["## pytorch/examples' 2D example, recorded and profiled", "",
             f"`python scripts/upstream_2d.py --examples PATH --runs {len(d['runs'])}`: "
             f"{d['example']} at commit {d['examples_commit']} (FSDP2 over `dp`, tensor + "
             f"sequence parallel over `tp`, its Llama2 model, {d['iterations']} iterations) on "
             f"{d['ranks']} ranks ({d['backend']}, {d['cpu_count']} cores, torch {d['torch']}), "
             "recorded by gpuscope and profiled by torch.profiler in the same run. Changed in a "
             "copy, nothing else: " + "; ".join(d["changes"]) + ". Communication over the "
             "profiled steps, all ranks together; the groups as the record names them.", "",
             "| run | comm: record / trace | groups (dim: kinds, ms per step) | record's verdict "
             "| holds back | trace's verdict | step ms: gpuscope / loop's own |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(d["runs"]):
        dims: dict = {}
        for g in r["groups"]:
            k = dims.setdefault(g["dim"] or g["group"], [set(), 0.0, 0])
            k[0].update(g["kinds"])
            k[1] += g["comm_ms"]
            k[2] += 1
        groups = "; ".join(f"{dim}: {', '.join(sorted(k[0]))}, {k[1] / k[2]:.0f}"
                           for dim, k in sorted(dims.items()))
        steps = ", ".join(f"{p['gpuscope_ms']:,.0f} / {p['loop_ms']:,.0f}" for p in r["step_ms"])
        lines.append(f"| {i + 1} | {r['record_comm_ms']:,.0f} / {r['trace_comm_ms']:,.0f} ms "
                     f"({100 * (r['record_over_trace'] - 1):+.1f}%) | {groups} | "
                     f"{r['record']['verdict']} ({r['record']['confidence']}) | "
                     f"{r['record']['holds_back'] or 'none'} | {r['trace']['verdict']} "
                     f"({r['trace']['confidence']}) | {steps} |")
    return lines + [""]


def fuzz(d: dict) -> list[str]:
    return ["## Damaged input (fuzzing)", "",
            f"`python scripts/fuzz.py --cases {d['cases']} --seed {d['seed']}`: one file of a "
            "sample run or a corpus trace damaged per case (truncation, bit flips, deleted keys, "
            "wrong types, huge and negative numbers, duplicated or reordered lines and events); a "
            "case fails on an exception outside `GpuscopeError`, a NaN, a hang, a process left "
            "behind or a report that does not add up.", "",
            f"{d['cases']:,} cases over {d['inputs']} inputs in {d['wall_s'] / 60:.1f} min: "
            f"{d['failures']} failed.", ""]


def soak(d: dict) -> list[str]:
    kinds: dict = {}
    for r in d["results"]:
        k = kinds.setdefault(r["kind"], [0, 0])
        k[0] += 1
        k[1] += bool(r["ok"])
    lost = [x for r in d["results"] for x in r.get("lost", []) if x >= 0]
    return ["## Killed runs", "",
            f"`python scripts/soak.py --runs {d['runs']}`: 2-rank runs SIGKILLed at the first "
            "step, mid-run, at close, while TensorBoard scalars are written; a run passes when "
            "it analyses and the report says it was cut.", "",
            f"{d['ok']} of {d['runs']} passed (" + ", ".join(f"{k}: {v[1]}/{v[0]}"
                                                         for k, v in kinds.items())
            + f"); at most {max(lost) if lost else 0} steps lost by a rank.", ""]


def _ratio_spread(ratios: list) -> str:
    ci = median_interval(ratios)
    if ci:
        return f"(95% CI {ci[0]:.2f}-{ci[1]:.2f})"
    return f"(range {min(ratios):.2f}-{max(ratios):.2f})"


def _rounds(ratios) -> str:
    """Each round's own ratio, as a range beside the pooled one."""
    return f" (rounds {min(ratios):.2f} to {max(ratios):.2f})" if ratios else ""


def _interval(d: dict) -> str:
    ci = median_interval(d.get("recorder_cost_ddp_round_costs_us") or [])
    return f", its 95% confidence interval {ci[0]:,.0f} to {ci[1]:,.0f} us" if ci else ""


def median_interval(values: list) -> tuple[float, float] | None:
    """A 95% confidence interval of the median of `values`, free of any assumption about their
    distribution: the order statistics k and n+1-k (1-based) with k = floor(n/2 - 0.98 sqrt(n))
    (the binomial's normal approximation); None below 6 values."""
    n = len(values)
    k = int(n / 2 - 0.98 * n ** 0.5)
    if k < 1:
        return None
    s = sorted(values)
    return s[k - 1], s[n - k]


def budgets(docs: dict) -> list[str]:
    """The README's lines: one per budget, with its figure and where it comes from."""
    out = []
    o = docs.get("overhead.json")
    if o:
        rounds = o.get("recorder_cost_ddp_round_costs_us")
        ci = median_interval(rounds or [])
        spread = (f", median of {len(rounds)} interleaved rounds, 95% confidence interval {ci[0]:,.0f} to "
                  f"{ci[1]:,.0f} us" if ci else "")
        cost = o['recorder_cost_ddp_us_per_step']
        plain = o.get("ddp_tiny_step_us_without")
        out.append(f"- Recording: at most 50 us per step and 0.5% of a 10 ms step; measured "
                   f"{cost:,.0f} us per step{' (over budget)' if cost > 50 else ''} on a tiny "
                   "DDP model "
                   f"({o['cpu_count']}-core CPU{spread}"
                   + (f"; its plain step {plain:,.0f} us" if plain else "") + ")"
                   + instructions_note(docs.get("instructions.json"))
                   + " ([recording overhead](docs/performance.md#recording-overhead)).")
    c = docs.get("overhead_cases.json")
    if c:
        r = [w["paired_ratio_median"] for w in c["workloads"].values()]
        spans = [median_interval(w["paired_ratios"]) or (min(w["paired_ratios"]),
                                                         max(w["paired_ratios"]))
                 for w in c["workloads"].values()]
        noise = sum(lo <= 1 <= hi for lo, hi in spans)
        out.append(f"- On six third-party-shaped loops: with / without {min(r):.2f}-{max(r):.2f} "
                   f"(medians of paired rounds; {noise} of {len(spans)} take in 1 within their "
                   "95% interval or range) "
                   "([loops we did not write](docs/performance.md#on-loops-we-did-not-write)).")
    g = docs.get("overhead_cases_gpu.json")
    o = docs.get("overhead_gpu.json")
    if g or o:
        r = [w["paired_ratio_median"] for w in g["workloads"].values()] if g else []
        # a file without a commit was measured on an older recorder: the guide gives no figure
        # of code it does not ship (docs/performance.md keeps the table, with that caveat)
        loops = (f"loops with / without {min(r):.2f}-{max(r):.2f}" if g and g.get("commit") else
                 "the loops not yet measured with this recorder")
        tiny = ""
        if o:
            over = " (over budget)" if o["recorder_cost_ddp_us_per_step"] > 50 else ""
            tiny = (f"; tiny DDP model {o['recorder_cost_ddp_us_per_step']:.0f} us per step"
                    f"{over} (plain step {o['ddp_tiny_step_us_without']:.0f} us), the demo's "
                    f"{o['median_step_ms_without']:.1f} ms step {o['overhead_pct']:+.2f}% "
                    f"({o.get('commit')}, [overhead](docs/performance.md"
                    "#recording-overhead-on-a-gpu))")
        out.append(f"- On a GPU (1 x H200, 1 rank, NCCL): {loops} "
                   f"([on a GPU](docs/performance.md#on-a-gpu)){tiny}.")
    h = docs.get("vs_hta.json")
    if h:
        r = [x["time_ratio"] for x in h["rows"]]
        out.append(f"- Reading traces: a tenth of HTA's load time; measured {min(r):.2f}-{max(r):.2f} "
                   "of it ([against HTA](docs/performance.md"
                   "#reading-traces-against-holistic-trace-analysis)).")
    s = docs.get("scale.json")
    if s:
        big = max(s["rows"], key=lambda x: x["ranks"] * x["steps"])
        out.append(f"- Many ranks: 1,024 ranks x 1,000 steps in under 3 s; measured "
                   f"{big['ranks']:,} x {big['steps']:,} in {big['analyze_s_median']:.2f} s "
                   "([many ranks](docs/performance.md#many-ranks)).")
    s = docs.get("scale_large.json")
    if s:
        big = max(s["rows"], key=lambda x: x["ranks"] * x["steps"])
        ok = big["cli_s_median"] <= 15 and big["peak_over_base_mb"] <= 4096
        out.append(f"- Ten thousand ranks: 10,000 x 1,000 steps in at most 15 s and 4 GB; "
                   f"measured {big['ranks']:,} x {big['steps']:,} in {big['cli_s_median']:.1f} s "
                   f"end to end, {big['peak_over_base_mb'] / 1024:.1f} GB"
                   + ("" if ok else ": not yet within it")
                   + "; 10,000 x 10,000 " + huge_note(docs.get("scale_huge.json"))
                   + " ([past one thousand](docs/performance.md#many-ranks-past-one-thousand)).")
    w = docs.get("whatif.json")
    if w and "pairs" in w:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        from whatif_tables import scored

        rows = scored(w)
        ok = sum(p["in_range"] for _, p in rows)
        out.append(f"- Estimates: on the project's own programs ({w.get('cpus', '?')} cores, "
                   f"{w.get('commit', '?')}), the re-run after a suggestion lands in its stated "
                   f"range in {ok} of {len(rows)} applied pairs ([applied fixes](docs/accuracy.md"
                   "#applied-fixes)); on programs it was not tuned on, or a loaded machine, "
                   "fewer: `gpuscope try` measures the fix instead" + trials_note(docs) + ".")
    fl = docs.get("faults.json")
    if fl:
        trained = [x for x in fl["rows"] if "scores" in x and x["parallel"] != "generated"]
        made = [x for x in fl["rows"] if "scores" in x and x["parallel"] == "generated"]
        right = {src: sum(bool(x["scores"].get(src, {}).get("right")) for x in trained)
                 for src in ("record", "kineto")}
        out.append(f"- Injected faults: every row right, from both sources; measured "
                   f"{right['record']} of {len(trained)} trained rows from the record, "
                   f"{right['kineto']} from the traces, and {sum(bool(x['scores']['record'].get('right')) for x in made)} "
                   f"of {len(made)} generated ones; `make bench-faults` took "
                   f"{fl['seconds'] / 60:.0f} min of training on {fl['cpu_count']} cores "
                   "([injected faults](docs/accuracy.md#injected-faults)).")
    r = docs.get("same_run.json")
    if r:
        agree = sum(v["agree"] for v in r["summary"].values())
        runs = sum(v["runs"] for v in r["summary"].values())
        fixes = [v["same_fix"] for s, v in r["summary"].items() if "same_fix" in v
                 and s != "compute"]
        fix_runs = sum(v["runs"] for s, v in r["summary"].items() if "same_fix" in v
                       and s != "compute")
        fix = (f", and the same top fix (within 15%) in {sum(fixes)} of {fix_runs} runs of the "
               "scenarios that have one" if fixes else "")
        busy = r.get("busy_cores", 1)
        cores = "a core" if busy == 1 else f"{busy} cores"
        out.append(f"- Both sources agree: the same run recorded and profiled gets the same "
                   f"verdict and stragglers in {agree} of {runs} runs{fix}, {cores} kept busy "
                   "([same run](docs/performance.md#the-same-run-from-both-sources)).")
    if docs.get("fr.json"):
        out.append(fr_budget(docs["fr.json"]))
    f = docs.get("fuzz.json")
    if f:
        out.append(f"- Damaged input never crashes the reader: {f['failures']} failures in "
                   f"{f['cases']:,} fuzz cases ([fuzzing](docs/performance.md"
                   "#damaged-input-fuzzing)).")
    return out


def first_run(d: dict | None) -> list[str]:
    """The quickstart's line on what `make demo` costs a newcomer."""
    if not d:
        return ["(`make demo`'s time and size: run `python benchmarks/bench_first_run.py`)"]
    m, s = divmod(round(d["seconds"]), 60)
    busy = d.get("busy")
    if busy:
        bm, bs = divmod(round(busy["seconds"]), 60)
        then = (f"; with {busy['busy_processes']} other processes spinning on the same cores "
                f"(load {busy['load'][1]:g} by its end) it took {bm} min {bs:02d} s")
    else:
        then = "; a machine busy with other work takes longer"
    return [f"On a fresh clone `make demo` took {m} min {s:02d} s and left a "
            f"{d['venv_bytes'] / 2**30:.1f} GiB `.venv` (torch {d['torch_bytes'] / 2**20:.0f} MiB "
            f"of it; {d['cores']} cores{_at_load(d)}, no pip cache, {d['commit']}: "
            f"`benchmarks/bench_first_run.py`){then}."]


def trials_note(docs: dict) -> str:
    """What one calibrating trial did to the estimates (benchmarks/bench_try.py), or ""."""
    t = docs.get("try.json")
    if not t:
        return ""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from try_tables import _count

    rows = [r for r in t["cases"] if "try" in r]
    c = _count(rows, "calibrated")
    progs = ", ".join(sorted({r["program"] for r in rows}))
    return (f"; after one trial, the next estimates land within 15% of the re-run in "
            f"{c['within_15']} of {c['n']} and their range holds it in {c['in_range']} ({progs}; "
            f"{t.get('commit', '?')}, [trials](docs/accuracy.md#trials-and-calibration))")


def _at_load(d: dict) -> str:
    """The machine's load while it ran, where measured (1-minute averages, start and end)."""
    load = d.get("load")
    return f" at load {load[0]:.1f}-{load[1]:.1f}" if load else ""


def every_rank(d: dict | None) -> list[str]:
    """The README's figures for profiling every rank (big_traces.json)."""
    if not d or not d.get("generated"):
        return ["(not measured yet: `python benchmarks/bench_big_traces.py`)"]
    big = max(d["generated"], key=lambda r: r["ranks"])
    one = min(d["generated"], key=lambda r: r["ranks"])
    both = big.get("straggler_named") and big.get("stall_named")
    return [f"Measured here ({d['cores']} cores): {big['ranks']} ranks x "
            f"{d['mb_per_rank']:.0f} MB of JSON ({big['raw_json_mb'] / 1e3:.1f} GB) analysed in "
            f"{big['command_s'] / 60:.1f} min end to end, peak {big['command_peak_mb'] / 1e3:.1f} "
            f"GB for the whole command" + (", the straggler and the data stall named" if both
                                          else "") + f"; one rank's file in "
            f"{one['gpuscope_s']:.1f} s, at {one.get('peak_over_largest_file', 0):.2f}x its JSON "
            "over the imports" + _fleet_said(d.get("fleet")) +
            " ([figures](docs/performance.md#every-ranks-profiler-trace-at-size))."]


def _fleet_said(f: dict | None) -> str:
    """The many-ranks row in a few words (big_traces.json's fleet), or ""."""
    if not f:
        return ""
    r = f["this"]
    return (f"; {f['ranks']:,} ranks' small traces ({f['raw_json_mb'] / 1e3:.1f} GB) in "
            f"{r['command_s'] / 60:.1f} min, peak {r['command_peak_mb'] / 1e3:.1f} GB")


def write_block(marks: tuple[str, str], lines: list[str], path: str = README) -> None:
    """Rewrite the lines between the two markers of `path` (the README), if it has them."""
    if not os.path.exists(path):
        return
    with open(path) as fh:
        text = fh.read()
    if marks[0] not in text or marks[1] not in text:
        return
    head, rest = text.split(marks[0], 1)
    _, tail = rest.split(marks[1], 1)
    with open(path, "w") as fh:
        fh.write(head + marks[0] + "\n" + "\n".join(lines) + "\n" + marks[1] + tail)


def flight_recorder(d: dict) -> list[str]:
    """Flight Recorder dumps at scale (fr.json): gpuscope beside the floor and torch's tool."""
    out = ["## Hangs: Flight Recorder dumps at scale", "",
           f"`benchmarks/bench_fr.py` ({d['commit']}, {d['cpu_count']} cores, median of "
           f"{d['repeat']}, each in a fresh process): a Megatron-style job in five kinds of "
           "group hung by one rank that stops before its expert-parallel all-to-all, every "
           "rank's ring of 2,000 entries pickled as torch writes it (benchmarks/fr_dumps.py). "
           "The floor is `pickle.load` of every dump in one process; gpuscope is the command, "
           "start-up included (it reads half the files in a forked process); torch's is "
           "`python -m torch.distributed.flight_recorder.fr_trace DIR --prefix _dump_`.", "",
           "| ranks | dumps | floor | gpuscope | over the floor | peak | blamed (truth) "
           "| report | torch's fr_trace | its missing ranks | its lines |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |"]
    for r in d["rows"]:
        out.append(f"| {r['ranks']:,} | {r['dumps_mb']:.0f} MB | {r['floor_pickle_load_s']:.2f} s "
                   f"| {r['gpuscope_cli_s']:.2f} s | {r['gpuscope_over_floor']:.2f}x "
                   f"| {r['gpuscope_peak_mb']} MB | {r['gpuscope_blamed']} "
                   f"({r['truth']['culprit']}) | {r['gpuscope_report_lines']} lines "
                   f"| {r['torch_fr_trace_s']:.1f} s "
                   f"| {r['torch_fr_trace_missing_ranks'] or 'none'} "
                   f"| {r['torch_fr_trace_lines']:,} |")
    return out + [""]


def deaths_public(d: dict) -> list[str]:
    """Deaths and hangs injected into public programs (deaths_public.json)."""
    out = [f"`benchmarks/deaths_public.py` ({d['commit']}, pytorch/examples {d['examples_commit']}, "
           f"{d['cpu_count']} cores, 4 ranks, gloo on CPU): **{d['right']} of {d['of']} told "
           "right** (the rank, the step, and a death as a death, a hang as a stall, a mismatch as "
           "the mismatch with the rank the odd one out). The truth is the fault's own log line "
           "as it fired; `job` is the launcher's run, `after TERM` how long the job took to end "
           "once a scheduler's SIGTERM came.", "",
           "| program | scenario: fault | right | job | after TERM | the report's first line |",
           "| --- | --- | --- | ---: | ---: | --- |"]
    for r in d["rows"]:
        f = r["fault"]
        line = (r["first_line"] or "").replace("|", "/")
        out.append(f"| {r['program']} | {r['scenario']}: {f['how']}, rank {f['rank']}, step "
                   f"{f['step']} | "
                   f"{'yes' if r['right'] else 'NO'} | {r['job_s']:.0f} s | "
                   + (f"{r['after_term_s']:.1f} s" if r["after_term_s"] is not None else "-")
                   + f" | {line[:180]}{'...' if len(line) > 180 else ''} |")
    return out + [""]


def fr_budget(d: dict) -> str:
    big = max(d["rows"], key=lambda r: r["ranks"])
    right = big["gpuscope_blamed"] == [big["truth"]["culprit"]]
    return (f"- Hangs from dumps: 1,024 ranks' Flight Recorder dumps read in seconds, matched by "
            f"process group; measured {big['ranks']:,} ranks ({big['dumps_mb']:.0f} MB) in "
            f"{big['gpuscope_cli_s']:.1f} s end to end, {big['gpuscope_over_floor']:.2f}x the "
            f"floor of unpickling them, the rank that stopped the job "
            f"{'named' if right else 'NOT named'} in a {big['gpuscope_report_lines']}-line report "
            "([hangs](docs/performance.md#hangs-flight-recorder-dumps-at-scale)).")


def write_budgets(lines: list[str]) -> None:
    write_block((BEGIN, END), lines)


def main() -> None:
    lines = ["# Performance figures", "",
             "Generated by `python scripts/make_performance_doc.py` from `benchmarks/results/` "
             "(do not edit by hand); each section names the command that measured it and the "
             "machine it ran on. The accuracy corpus is in [accuracy.md](accuracy.md).", ""]
    docs = {}
    for name, fn, cmd in (
            ("overhead.json", overhead, "benchmarks/bench_overhead.py"),
            ("instructions.json", instructions, "benchmarks/bench_instructions.py"),
            ("cuda_calls.json", cuda_calls, "benchmarks/bench_cuda_calls.py"),
            ("row_paths.json", row_paths, "benchmarks/bench_row_paths.py"),
            ("modules.json", modules, "benchmarks/bench_modules.py"),
            ("overhead_cases.json", lambda d: overhead_cases(d, "On loops we did not write"),
             "benchmarks/bench_overhead_cases.py"),
            ("overhead_cases_gpu.json", lambda d: overhead_cases(d, "On a GPU"),
             "benchmarks/bench_overhead_cases.py --device cuda"),
            ("overhead_gpu.json", overhead_gpu, "benchmarks/bench_overhead.py --device cuda "
             "--nproc 1"),
            ("whatif.json", whatif, "benchmarks/bench_whatif.py"),
            ("vs_hta.json", vs_hta, "benchmarks/bench_vs_hta.py"),
            ("big_traces.json", big_traces, "benchmarks/bench_big_traces.py"),
            ("scale.json", scale, "benchmarks/bench_scale.py"),
            ("scale_large.json", scale_large,
             "benchmarks/bench_scale.py --sizes 2048x1000,4096x1000,10000x1000 --repeat 1 "
             "--out benchmarks/results/scale_large.json"),
            ("scale_huge.json", lambda d: scale_huge(d, docs.get("scale_large.json")),
             "benchmarks/bench_scale.py --sizes 10000x10000 --repeat 1 --skip-json "
             "--sample-every 2 --out benchmarks/results/scale_huge.json"),
            ("same_run.json", same_run, "scripts/same_run.py"),
            ("memory.json", memory, "benchmarks/bench_memory.py"),
            ("upstream_2d.json", upstream_2d, "scripts/upstream_2d.py --examples PATH"),
            ("fuzz.json", fuzz, "scripts/fuzz.py"),
            ("soak.json", soak, "scripts/soak.py"),
            ("fr.json", flight_recorder, "benchmarks/bench_fr.py")):
        d = docs[name] = _load(name)
        lines += fn(d) if d else [f"(no {name} yet: run `python {cmd}`)", ""]
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines))
    docs["faults.json"] = _load("faults.json")  # its tables are in accuracy.md
    docs["try.json"] = _load("try.json")  # its tables too
    write_budgets(budgets({k: v for k, v in docs.items() if v}))
    write_block(FIRST_RUN, first_run(_load("first_run.json")))
    write_block(EVERY_RANK, every_rank(_load("big_traces.json")))
    dp = _load("deaths_public.json")
    if dp:
        write_block(("<!-- deaths:begin -->", "<!-- deaths:end -->"), deaths_public(dp),
                    os.path.join(ROOT, "docs", "hangs.md"))
    if docs.get("fr.json"):
        write_block(("<!-- fr:begin -->", "<!-- fr:end -->"),
                    flight_recorder(docs["fr.json"])[2:],
                    os.path.join(ROOT, "docs", "hangs.md"))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
