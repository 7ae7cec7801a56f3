"""The `gpuscope` command line. Only here do errors become exit codes: 0 on success, 2 with one
line on bad input, 1 on a failed check or an internal error, 3 when `compare --fail-if-slower`
finds a regression."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager

from .demo import SCENARIOS
from .errors import GpuscopeError, InputError, need


def _need_plotly() -> None:
    need("plotly", "html", "the HTML dashboard")


@contextmanager
def _early_parse(path: str):
    """Profiler traces at `path` are parsed by forked processes from now on, while the block
    imports the analysis stack (readers/kineto/prefetch.py); the block gets what to hand the
    reader (None for a run dir, which is left to its reader)."""
    files = []
    try:
        from .run_format import is_record_file, is_run_dir

        if os.path.exists(path) and not (is_run_dir(path) or is_record_file(path)):
            from .trace_files import find_trace_files

            files = find_trace_files(path)
    except OSError:  # the reader reports it
        files = []
    if not files:
        yield None
        return
    from .readers.kineto.prefetch import prefetching

    with prefetching(files) as ahead:
        yield ahead


def _analyze(args, ahead):
    from .analyze.run import analyze_table, warm_steps
    from .readers import read_path
    from .thresholds import Thresholds

    from .analyze.window import parse_steps

    steps = parse_steps(getattr(args, "steps", None))
    th = Thresholds().with_overrides(args.thresholds)
    return analyze_table(read_path(args.path, parsed=ahead, engine=args.engine,
                                   warm=warm_steps(th, args.skip, steps)),
                         th, skip=args.skip, own=True, steps=steps)


def _flight_recorder_alone(args) -> int | tuple | None:
    """A folder of Flight Recorder dumps and nothing else gpuscope reads (or one dump): who
    stopped the job, where the others wait (analyze/hang_report.py); where it holds none, the
    first file that is not one with why (file, why), or None."""
    from .analyze.hang_report import tell
    from .readers import flight_recorder
    from .render.flight_recorder import render

    if os.path.isdir(args.path):
        dumps, bad = flight_recorder.find(args.path)
    elif os.path.isfile(args.path):
        got = flight_recorder.load(args.path)
        dumps, bad = ({got.rank: got}, []) if not isinstance(got, str) else \
            ({}, [(os.path.basename(args.path), got)])
    else:
        return None
    if not dumps:
        return bad[0] if bad else None
    doc = {"path": args.path, **tell(dumps, bad)}
    if args.html:
        from .render.flight_recorder import html

        with open(args.html, "w") as fh:
            fh.write(html(doc, args.path))
    if args.json:
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            sys.stdout.write(text + "\n")
            return 0
        with open(args.json, "w") as fh:
            fh.write(text)
    if not args.quiet:
        print(render(doc, args.path))
        if args.html:
            print(f"HTML page: {args.html}")
    return 0


def cmd_analyze(args) -> int:
    try:
        return _cmd_analyze(args)
    except InputError as e:
        alone = _flight_recorder_alone(args)
        if alone is None:
            raise
        if isinstance(alone, tuple):  # no dump either: why the first candidate is not one
            raise InputError(f"{e}; {alone[0]}: {alone[1]}") from None
        return alone


def _cmd_analyze(args) -> int:
    if args.engine == "ray":  # the files are read by Ray tasks: nothing parsed here first
        if args.html:
            _need_plotly()
        report = _analyze(args, None)
    else:
        with _early_parse(args.path) as ahead:
            if args.html:
                _need_plotly()
            report = _analyze(args, ahead)
    # the files first: a reader that closes stdout early (| head) must not lose them
    if args.json == "-":  # the JSON to stdout, alone: a pipe's reader gets JSON only
        from .render import json as render_json

        text = render_json.render(report)
        sys.stdout.write(text.decode() if isinstance(text, bytes) else text)
        if args.html:
            report.write_html(args.html)
        return 0
    if args.json:
        report.write_json(args.json)
    if args.html:
        report.write_html(args.html)
    if not args.quiet:
        report.print()
        if args.json:
            print(f"JSON report: {args.json}")
        if args.html:
            print(f"HTML dashboard: {args.html}")
    return 0


def cmd_export(args) -> int:
    if not args.parquet and not args.perfetto:
        raise GpuscopeError("nothing to export: give --parquet FILE and/or --perfetto FILE")
    with _early_parse(args.path) as ahead:
        from .analyze.run import analyze_table
        from .readers import read_path

        table = read_path(args.path, parsed=ahead)
    from .thresholds import Thresholds

    report = analyze_table(table, Thresholds().with_overrides(args.thresholds), skip=args.skip)
    if args.parquet:
        from .render import parquet

        rows = parquet.write(report, args.parquet)
        print(f"Parquet: {args.parquet} ({rows} rows: rank x step, {report.verdict.label})")
    if args.perfetto:
        from .render import perfetto
        from .trace_files import find_trace_files

        from .analyze.timeline import timeline

        from .readers.kineto.raw import raw_trace

        files = find_trace_files(args.path) if table.source == "kineto" else None
        out = perfetto.write(report, table, timeline(table, report), args.perfetto, files,
                             load=raw_trace)
        for w in out["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
        print(f"Perfetto: {args.perfetto} ({out['events']} events, {out['ranks']} ranks; open it "
              "in ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_demo(args) -> int:
    from .demo.launch import DemoFailed, run_demo

    from .demo import NPROC

    args.nproc = args.nproc or NPROC[args.scenario]
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("gpuscope demo: the demo trains a model and needs torch: pip install torch "
              "(gpuscope analyze reads runs and traces without it)", file=sys.stderr)
        return 2
    print(f"gpuscope demo: {args.nproc}-process DDP (gloo, CPU), scenario '{args.scenario}', "
          f"{args.steps} steps ...", flush=True)
    try:
        knobs = [a for flag, v in (("--num-workers", args.num_workers),
                                   ("--sync-every", args.sync_every),
                                   ("--batch-size", args.batch_size)) if v is not None
                 for a in (flag, str(v))]
        result = run_demo(args.scenario, args.out, steps=args.steps, nproc=args.nproc,
                          profile=not args.no_profile, extra=tuple(knobs))
    except DemoFailed as exc:
        print(f"gpuscope demo: {exc}", file=sys.stderr)
        return 1
    result.report.print()
    print(f"JSON report: {result.json_path}\nHTML dashboard: {result.html_path}")
    for line in demo_next(args, result.report):
        print(line)
    if result.trace_dir:
        print(f"\nThe same run as torch.profiler traces: {command('gpuscope')} analyze "
              f"{result.trace_dir}\nIn TensorBoard (gpuscope tab + Scalars): "
              f"{command('tensorboard')} --logdir {result.out}")
    return 0


def demo_next(args, report) -> list[str]:
    """The demo's first suggestion applied with its own options and compared, with this run's
    value (a README's value is another machine's), and `gpuscope try` of all of them."""
    from .demo import FLAGS, NPROC
    from .knob_value import setting

    first = next((s for s in report.suggestions if s.knob in FLAGS
                  and isinstance(setting(s.proposed), int)), None)
    if first is None:
        return []
    knobs = {"num_workers": args.num_workers, "sync_frequency": args.sync_every,
             "batch_size": args.batch_size}
    knobs[first.knob] = setting(first.proposed)
    base = [command("gpuscope"), "demo"] + (
        ["--scenario", args.scenario] if args.scenario != "data" else []) + (
        ["--steps", str(args.steps)] if args.steps != 30 else []) + (
        ["--nproc", str(args.nproc)] if args.nproc != NPROC[args.scenario] else [])
    after = os.path.join(os.path.dirname(os.path.normpath(args.out)) or ".", "after")
    run = [*base, *(a for k, v in knobs.items() if v is not None for a in (FLAGS[k], str(v))),
           "--no-profile", "--out", after]
    before = os.path.join(args.out, "record")
    named = [k for k in FLAGS if any(s.knob == k for s in report.suggestions)]
    trial = [*base, *(a for k, v in knobs.items() if v is not None and k not in named
                      for a in (FLAGS[k], str(v))),
             *(a for k in named for a in (FLAGS[k], "{" + k + "}")), "--no-profile"]
    return ["", f"Next: apply the first suggestion ({first.knob} {setting(first.current)} -> "
            f"{knobs[first.knob]}) and compare the two runs:",
            f"  {' '.join(run)}",
            f"  {command('gpuscope')} compare {before} {os.path.join(after, 'record')}",
            "or measure each suggested value beside this one:",
            f"  {command('gpuscope')} try {before} -- {' '.join(trial)}"]


def command(name: str) -> str:
    """How to run one of this environment's commands from a fresh shell here: its name when the
    shell finds this one, else its path (a venv not activated: .venv/bin/gpuscope)."""
    import shutil

    here = os.path.join(os.path.dirname(sys.executable), name)
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(here) or not os.path.exists(here):
        return name
    rel = os.path.relpath(here)
    return rel if not rel.startswith("..") else here


def cmd_scaling(args) -> int:
    import json

    from . import analyze
    from .analyze.scaling import scaling_dict, scaling_points, stops_paying
    from .render import scaling

    points = scaling_points([analyze(p) for p in args.paths])
    at, why = stops_paying(points)
    if args.json == "-":
        print(json.dumps(scaling_dict(points), indent=2))
        return 0
    if args.json:
        _write(args.json, json.dumps(scaling_dict(points), indent=2))
    print(scaling.render(points, at, why, color=sys.stdout.isatty()), end="")
    return 0


def load_report(path: str):
    """A saved JSON report, or an analysis of a run dir / profiler traces."""
    from . import analyze
    from .report import SCHEMA, Report

    if os.path.isfile(path) and path.endswith(".json"):
        with open(path, "rb") as fh:
            head = fh.read(4096)
        if SCHEMA.encode() in head:
            return Report.read_json(path)
    return analyze(path)


def cmd_compare(args) -> int:
    import json

    from .analyze.compare import compare
    from .render import compare as render_compare

    if args.fail_if_slower is not None and args.fail_if_slower < 0:
        raise GpuscopeError(f"--fail-if-slower must be a percentage >= 0, not {args.fail_if_slower}")
    result = compare(load_report(args.before), load_report(args.after))
    if args.fail_if_slower is not None and result.different and not args.force:
        raise GpuscopeError(f"BEFORE and AFTER look like different trainings ({result.different}):"
                            " the gate compares one training before and after a change; --force "
                            "compares them anyway")
    if args.json == "-":
        print(json.dumps(result.to_dict(), indent=2))
    elif args.json:
        _write(args.json, json.dumps(result.to_dict(), indent=2))
    if not args.quiet and args.json != "-":
        print(render_compare.render(result, color=sys.stdout.isatty()), end="")
    if args.fail_if_slower is not None and result.slower_than(args.fail_if_slower):
        unit = "sample" if result.per_sample else "micro-step"
        print(f"gpuscope: regression: AFTER is {result.slower_pct:.1f}% slower per {unit} than "
              f"BEFORE (limit {args.fail_if_slower:g}%)", file=sys.stderr)
        return 3
    return 0


def cmd_doctor(args) -> int:
    import json

    from rich.console import Console

    from .doctor import render, run_doctor

    checks, code = run_doctor(smoke=not args.no_smoke)
    text = json.dumps({"ok": code == 0, "checks": [c.__dict__ for c in checks]}, indent=2)
    if args.json == "-":  # stdout, as analyze, compare and scaling take it: JSON alone
        print(text)
        return code
    if args.json:
        _write(args.json, text)
    render(checks, Console(highlight=False))
    return code


def cmd_try(args) -> int:
    import json

    from . import trials
    from .render.trials import render

    cmd = args.cmd
    if not cmd:
        raise GpuscopeError("gpuscope try REPORT -- COMMAND: the training command is missing")
    for name, value in (("--steps", args.steps), ("--repeats", args.repeats), ("--top", args.top)):
        if value < 1:
            raise GpuscopeError(f"{name} must be 1 or more, not {value}")
    if args.warmup < 0:
        raise GpuscopeError(f"--warmup must be 0 or more, not {args.warmup}")
    base = {k: v[0] for k, v in trials.parse_knob_values(args.base).items()}
    report = load_report(args.report).to_dict()
    plan = trials.make_plan(report, cmd,
                            trials.parse_knob_values(args.knob), base, args.top, args.warmup,
                            args.steps, args.repeats)
    out = args.out or trials.default_out(args.report)
    say = None if args.quiet or args.json == "-" else (lambda m: print(f"gpuscope try: {m}",
                                                                       flush=True))
    if say:
        say(f"{len(plan.candidates)} configurations x {plan.repeats} rounds"
            + (f" or more, until a repeat of each gain is known within +-{args.precision:g}%" if args.precision
               else "") + f", {plan.warmup} + {plan.steps} steps each"
            + (f" ({plan.steps_why})" if plan.steps_why else "") + f"; run dirs under {out}")
    from . import calibration

    cands = trials.run_plan(plan, out, args.timeout, say, args.precision, args.max_repeats,
                            args.budget_s)
    rows = trials.summary(cands)
    step = max((r.get("step_ms") or 0 for r in report.get("ranks") or []), default=0)
    kept = calibration.add(trials.calibration_trials(cands, rows, os.path.abspath(args.report),
                                                     report.get("knobs") or {}, step or None))
    result = {"command": plan.command, "warmup": plan.warmup, "steps": plan.steps,
              "steps_why": plan.steps_why,
              "repeats": plan.repeats, "out": out, "not_in_command": plan.not_in_command,
              "trials": rows, "calibration": kept}
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        _write(args.json, json.dumps(result, indent=2))
    if not args.quiet and args.json != "-":
        render(result)
    return 0 if rows[0]["step_ms"] is not None else 1


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _add_try(sub) -> None:
    """`gpuscope try`'s options (its command is what follows "--": main)."""
    t = sub.add_parser("try", help="run the suggested changes beside the baseline, each for a "
                       "few steps, and measure what each gains",
                       usage="gpuscope try REPORT [options] -- COMMAND with {knob} placeholders")
    t.add_argument("report", help="the run to improve: its run dir, traces or JSON report")
    t.add_argument("--knob", action="append", metavar="NAME=V1,V2", help="values to try "
                   "(repeatable); default: the report's top suggestions the command holds")
    t.add_argument("--base", action="append", metavar="NAME=VALUE", help="the baseline's value "
                   "of a placeholder the report does not give")
    t.add_argument("--top", type=int, default=3, help="suggestions tried (default 3)")
    t.add_argument("--warmup", type=int, default=5, help="steps left out of each trial (5)")
    t.add_argument("--steps", type=int, default=20, help="steps measured in each trial (20)")
    t.add_argument("--repeats", type=int, default=3, help="rounds, interleaved (3: the fewest "
                   "that tell a spread at all, t = 4.3 for one value tried; with --precision, "
                   "the least)")
    t.add_argument("--precision", type=float, metavar="PCT", help="more rounds (up to "
                   "--max-repeats, within --budget-s) until a repeat of each gain is known within "
                   "+-PCT%% (95%%)")
    t.add_argument("--max-repeats", type=int, default=8, help="rounds at most (8)")
    t.add_argument("--budget-s", type=float, default=900.0, help="seconds of trials at most "
                   "for the rounds --precision adds (900)")
    t.add_argument("--timeout", type=float, default=600.0, help="seconds a trial may take")
    t.add_argument("--out", help="folder for the trials' run dirs (default: try-TIME beside "
                   "the report's run)")
    t.add_argument("--json", metavar="FILE", help="write the results as JSON (-: stdout)")
    t.add_argument("-q", "--quiet", action="store_true", help="no terminal output")
    t.set_defaults(func=cmd_try, cmd=[])  # the command: what follows "--" (main)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpuscope", description="Why is distributed training slow, "
                                 "and what to change.")
    from . import __version__

    ap.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="analyze a run dir, torch.profiler traces or an op "
                       "timeline")
    a.add_argument("path", help="gpuscope run dir (or one of its rank files), a folder/file "
                   "of torch.profiler traces, or an op timeline (.parquet / .csv of ops per rank "
                   "and step, with its layout file)")
    a.add_argument("--json", metavar="FILE", help="write the JSON report here (-: to stdout, "
                   "instead of the terminal report)")
    a.add_argument("--html", metavar="FILE", help="write the HTML dashboard here")
    a.add_argument("--thresholds", metavar="K=V,...",
                   help="override thresholds, e.g. data_high=0.3,wait=0.05")
    a.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where the files are read: here (local), or as Ray tasks on the cluster "
                   "at RAY_ADDRESS, else a local one (ray; paths may be fsspec URLs such as "
                   "s3://...; pip install 'gpuscope[ray]')")
    a.add_argument("--skip", type=int, metavar="N",
                   help="warm-up steps to leave out per rank (default: 1 for a run dir, 0 for "
                   "profiler traces)")
    a.add_argument("--steps", metavar="A-B,...|profiled",
                   help="read these steps only (e.g. 10-50,80-99), or 'profiled': those a "
                   "torch.profiler captured beside the recording, the steps its traces hold "
                   "(then the record and the traces give one story); no warm-up left out")
    a.add_argument("-q", "--quiet", action="store_true", help="no terminal report")
    a.set_defaults(func=cmd_analyze)
    e = sub.add_parser("export", help="export a run for other tools: the rank x step table "
                       "(Parquet), all ranks on one timeline (Perfetto)")
    e.add_argument("path", help="gpuscope run dir or torch.profiler traces")
    e.add_argument("--perfetto", metavar="FILE", help="every rank on one timeline as Chrome trace "
                   "JSON (.gz to compress) for ui.perfetto.dev or chrome://tracing")
    e.add_argument("--parquet", metavar="FILE", help="the analysed rank x step table, with step "
                   "labels and knobs, as Parquet (needs pyarrow: gpuscope[parquet])")
    e.add_argument("--thresholds", metavar="K=V,...", help="as for analyze")
    e.add_argument("--skip", type=int, metavar="N", help="as for analyze")
    e.set_defaults(func=cmd_export)
    d = sub.add_parser("demo", help="run a 2-process CPU DDP training with a known bottleneck, "
                       "record it, analyze it")
    d.add_argument("--scenario", default="data", choices=SCENARIOS)
    d.add_argument("--out", default="runs/demo", help="output folder")
    d.add_argument("--steps", type=int, default=30)
    d.add_argument("--nproc", type=int, help="processes (default 2; 1 for compute: two on a "
                   "2-core machine trade lateness, jitter-bound)")
    d.add_argument("--no-profile", action="store_true", help="skip writing torch.profiler traces")
    # the knobs the demo's suggestions name: apply one, run again, `gpuscope compare` the two
    d.add_argument("--num-workers", type=int, help="DataLoader worker processes (kept across "
                   "epochs: persistent_workers)")
    d.add_argument("--sync-every", type=int, metavar="K", help="synchronize gradients every K "
                   "micro-steps (accumulation with DDP no_sync)")
    d.add_argument("--batch-size", type=int, help="per-rank batch")
    d.set_defaults(func=cmd_demo)
    sc = sub.add_parser("scaling", help="compare runs of one training at several world sizes")
    sc.add_argument("paths", nargs="+", help="run dirs or trace folders, one per world size")
    sc.add_argument("--json", metavar="FILE", help="write the scaling table as JSON (-: stdout)")
    sc.set_defaults(func=cmd_scaling)
    c = sub.add_parser("compare", help="compare two runs of one training: parts, verdict, "
                       "knobs, and how the suggestions' estimates held")
    c.add_argument("before", help="run dir, profiler traces, or a saved JSON report")
    c.add_argument("after", help="the same, after a change")
    c.add_argument("--json", metavar="FILE", help="write the comparison as JSON (-: stdout)")
    c.add_argument("--fail-if-slower", type=float, metavar="PCT",
                   help="exit 3 when AFTER is more than PCT %% slower than BEFORE (per sample "
                   "when both batches are known, else per micro-step): a regression gate for CI")
    c.add_argument("-q", "--quiet", action="store_true", help="no terminal output")
    c.add_argument("--force", action="store_true", help="gate runs that look like different "
                   "trainings (another model, parameters more than 10%% apart) too")
    c.set_defaults(func=cmd_compare)
    _add_try(sub)
    doc = sub.add_parser("doctor", help="check GPUs, versions, topology and run a smoke test")
    doc.add_argument("--no-smoke", action="store_true", help="skip the multi-process smoke test")
    doc.add_argument("--json", metavar="FILE", help="write the checks as JSON (-: stdout)")
    doc.set_defaults(func=cmd_doctor)
    return ap


def _quiet_stdout() -> None:
    """stdout was closed by its reader (`| head`): send what is left to /dev/null, so that
    Python's own flush at exit does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest = None
    if argv[:1] == ["try"] and "--" in argv:  # the training command, taken as it is
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    if rest is not None:
        args.cmd = rest
    from . import progress

    # a bar while a big input is read: on a terminal, unless -q (GPUSCOPE_PROGRESS=1/0 forces)
    forced = os.environ.get("GPUSCOPE_PROGRESS")
    progress.enable(forced == "1" if forced in ("0", "1") else
                    sys.stderr.isatty() and not getattr(args, "quiet", False))
    try:
        return args.func(args)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except GpuscopeError as exc:
        print(f"gpuscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug in gpuscope: one line unless asked for the traceback
        if os.environ.get("GPUSCOPE_DEBUG"):
            raise
        print(f"gpuscope: internal error: {exc!r} (set GPUSCOPE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


def entry() -> None:
    """The `gpuscope` command (and `python -m gpuscope`): main(), then straight out. An analysis
    leaves millions of objects that the interpreter would free one by one on its way out (a
    tenth of a second on a 50 MB trace) for nothing: the process is ending. Everything is
    written and closed by then; what is buffered is flushed here. When a process forked by
    the readers were still running (never the case: they are joined or stopped on every
    path), the normal exit is taken."""
    code = main()
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.active_children():
        sys.exit(code)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _quiet_stdout()
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    entry()
