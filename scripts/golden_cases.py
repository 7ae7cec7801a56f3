"""The golden cases of tests/test_golden_cases.py, made from this checkout's code: a case is a
folder, so a new one is a folder, not code.

rows: tests/fixtures/golden/rows/<workload>/ holds events.json (each flush's micro-steps as the
recorder's hooks logged them, rank by rank: rows.build's arguments) and rows.json (what the
recorder made of them: rows, all-to-all rows, forwards), captured from a real torchrun run of
scripts/golden_rows.py's workload (scripts/golden_capture.py watches the row builder).

reports: tests/fixtures/golden/reports/<case>/ holds case.json ({"input": a path under
tests/fixtures/, or an input/ folder beside it; "args": analyze's arguments}), and this writes
expected.json (the JSON report, less its input path) and report.txt (the terminal report at
REPORT_WIDTH columns, its input path written <input>).

    python scripts/golden_cases.py rows [--only ddp,experts]
    python scripts/golden_cases.py reports [--only data]
Review the diff before committing it: a changed golden file is a changed behaviour.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

# generated reports are the models' own: what `gpuscope try` kept on this machine stays out
os.environ["GPUSCOPE_CALIBRATION"] = "off"

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
GOLDEN = os.path.join(FIXTURES, "golden")
REPORT_WIDTH = 100
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def capture_rows(name: str) -> dict:
    """Run workload `name` under torchrun with the row builder watched: {rank: [flush, ...]}."""
    from golden_rows import W, WORKLOADS

    n, script, args = WORKLOADS[name]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "golden")
        os.makedirs(out)
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             str(n), os.path.join(ROOT, "scripts", "golden_capture.py"),
             os.path.join(W, script), "--out", os.path.join(d, "run"), *args],
            capture_output=True, text=True, timeout=600,
            env=dict(os.environ, OMP_NUM_THREADS="1", GPUSCOPE_GOLDEN_OUT=out))
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
        ranks = {}
        for path in sorted(glob.glob(os.path.join(out, "rank-*.jsonl"))):
            rank = os.path.basename(path)[5:-6]
            with open(path) as fh:
                ranks[rank] = [json.loads(line) for line in fh]
    return ranks


def write_rows(name: str) -> None:
    ranks = capture_rows(name)
    folder = os.path.join(GOLDEN, "rows", name)
    os.makedirs(folder, exist_ok=True)
    events = {"workload": name, "made_by": "scripts/golden_cases.py rows",
              "ranks": {r: [{"shift": f["shift"], "items": f["items"]} for f in flushes]
                        for r, flushes in ranks.items()}}
    rows = {r: [{k: f[k] for k in ("rows", "routed", "forwards")} for f in flushes]
            for r, flushes in ranks.items()}
    for file, obj in (("events.json", events), ("rows.json", rows)):
        with open(os.path.join(folder, file), "w") as fh:
            json.dump(obj, fh, separators=(",", ":"))
            fh.write("\n")
    steps = sum(len(f["rows"]) for flushes in rows.values() for f in flushes)
    print(f"rows/{name}: {len(rows)} rank(s), {steps} rows")


def analysed_case(folder: str) -> tuple:
    """(the report, as `gpuscope analyze` makes it with the case's arguments; its input path)
    of one case folder."""
    from gpuscope.cli import _analyze, build_parser

    with open(os.path.join(folder, "case.json")) as fh:
        case = json.load(fh)
    here = os.path.join(folder, "input")
    path = here if os.path.exists(here) else os.path.join(FIXTURES, case["input"])
    args = build_parser().parse_args(["analyze", path, *case.get("args", [])])
    return _analyze(args, None), path


def report_case(folder: str) -> tuple[dict, str]:
    """The JSON report (less its input path) and the terminal report of one case folder."""
    from gpuscope.render import json as render_json
    from gpuscope.render.terminal import render

    rep, path = analysed_case(folder)
    data = json.loads(render_json.render(rep))
    data.pop("path", None)
    return data, render(rep, width=REPORT_WIDTH).replace(path, "<input>")


def write_report(folder: str) -> None:
    data, text = report_case(folder)
    with open(os.path.join(folder, "expected.json"), "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    with open(os.path.join(folder, "report.txt"), "w") as fh:
        fh.write(text)
    print(f"reports/{os.path.basename(folder)}: {data.get('verdict')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("rows", "reports"))
    ap.add_argument("--only", default="", help="comma-separated names")
    args = ap.parse_args()
    only = [n for n in args.only.split(",") if n]
    if args.kind == "rows":
        from golden_rows import WORKLOADS

        for name in only or list(WORKLOADS):
            write_rows(name)
    else:
        for folder in sorted(glob.glob(os.path.join(GOLDEN, "reports", "*"))):
            if not only or os.path.basename(folder) in only:
                write_report(folder)


if __name__ == "__main__":
    main()
