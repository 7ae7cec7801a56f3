"""The `gpuscope` command line: analyze, demo. Only here do errors become exit codes."""

from __future__ import annotations

import argparse
import os
import sys

from .errors import GpuscopeError


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def cmd_analyze(args) -> int:
    from rich.console import Console

    from .pipeline import analyze_path
    from .render_terminal import render
    from .thresholds import Thresholds

    if args.html:
        try:
            import plotly  # noqa: F401
        except ImportError:
            raise GpuscopeError("the HTML dashboard needs plotly: pip install 'gpuscope[html]'") \
                from None
    th = Thresholds().with_overrides(args.thresholds)
    if args.skip is not None:
        th = th.with_overrides(f"warmup_steps={args.skip}")
    report = analyze_path(args.path, th)
    if not args.quiet:
        render(report, Console(highlight=False))
    if args.json:
        import orjson

        _write(args.json, orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
        if not args.quiet:
            print(f"JSON report: {args.json}")
    if args.html:
        from .render_html import render_html

        _write(args.html, render_html(report))
        if not args.quiet:
            print(f"HTML dashboard: {args.html}")
    return 0


def cmd_demo(args) -> int:
    from .demo.launch import run_demo

    return run_demo(args.scenario, args.out, steps=args.steps, nproc=args.nproc,
                    profile=not args.no_profile)


def cmd_scaling(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .pipeline import analyze_path
    from .scaling import scaling_dict, scaling_points

    points = scaling_points([analyze_path(p) for p in args.paths])
    d = scaling_dict(points)
    unit = "samples/s" if points[0].batch_per_rank else "steps/s"
    t = Table(title="Scaling", title_justify="left")
    for col in ("ranks", "step ms", unit, "eff.", "exp. comm %", "wait %", "verdict"):
        t.add_column(col, justify="left" if col == "verdict" else "right", no_wrap=True)
    for p in points:
        t.add_row(str(p.world_size), f"{p.step_ms:.1f}", f"{p.throughput:,.1f}",
                  f"{p.efficiency:.0%}", f"{p.comm_exposed_pct:.0f}", f"{p.wait_pct:.0f}",
                  p.verdict)
    console = Console(highlight=False)
    console.print(t)
    for p in points:
        console.print(f"[dim]{p.world_size} ranks: {p.path}[/dim]")
    console.print(("Adding ranks stops paying at " + str(d["stops_paying_at"]) + ": "
                   if d["stops_paying_at"] else "") + d["why"])
    if args.json:
        import json

        _write(args.json, json.dumps(d, indent=2))
    return 0


def cmd_doctor(args) -> int:
    from rich.console import Console

    from .doctor import render, run_doctor

    checks, code = run_doctor(smoke=not args.no_smoke)
    render(checks, Console(highlight=False))
    if args.json:
        import json

        _write(args.json, json.dumps({"ok": code == 0, "checks": [c.__dict__ for c in checks]},
                                     indent=2))
    return code


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpuscope", description="Why is distributed training slow, "
                                 "and what to change.")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="analyze a run dir or torch.profiler traces")
    a.add_argument("path", help="gpuscope run dir, or folder/file of torch.profiler traces")
    a.add_argument("--json", metavar="FILE", help="write the JSON report here")
    a.add_argument("--html", metavar="FILE", help="write the HTML dashboard here")
    a.add_argument("--thresholds", metavar="K=V,...",
                   help="override thresholds, e.g. data_high=0.3,wait=0.05")
    a.add_argument("--skip", type=int, metavar="N", help="warm-up steps to leave out (default 1)")
    a.add_argument("-q", "--quiet", action="store_true", help="no terminal report")
    a.set_defaults(func=cmd_analyze)
    d = sub.add_parser("demo", help="run a 2-process CPU DDP training with a known bottleneck, "
                       "record it, analyze it")
    d.add_argument("--scenario", default="data", choices=("data", "comm", "imbalanced", "compute"))
    d.add_argument("--out", default="runs/demo", help="output folder")
    d.add_argument("--steps", type=int, default=30)
    d.add_argument("--nproc", type=int, default=2)
    d.add_argument("--no-profile", action="store_true", help="skip writing torch.profiler traces")
    d.set_defaults(func=cmd_demo)
    sc = sub.add_parser("scaling", help="compare runs of one training at several world sizes")
    sc.add_argument("paths", nargs="+", help="run dirs or trace folders, one per world size")
    sc.add_argument("--json", metavar="FILE", help="write the scaling table as JSON")
    sc.set_defaults(func=cmd_scaling)
    doc = sub.add_parser("doctor", help="check GPUs, versions, topology and run a smoke test")
    doc.add_argument("--no-smoke", action="store_true", help="skip the multi-process smoke test")
    doc.add_argument("--json", metavar="FILE", help="write the checks as JSON")
    doc.set_defaults(func=cmd_doctor)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
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


if __name__ == "__main__":
    sys.exit(main())
