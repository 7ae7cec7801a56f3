"""Write the README's demo output, its compare and scaling walk-throughs and the live line
from real runs.

1. `gpuscope demo` (the data scenario, as `make demo` runs it) at 100 columns: its report's head
   and rank table, then its suggestions through the first one's head and two lines of its why
   (the lines the README leaves out are marked "(...)"), between `<!-- demo:begin -->` and `<!-- demo:end -->`.
2. That first suggestion applied (`gpuscope demo --num-workers N ...`, the knob it names), then
   `gpuscope compare` of the two: the commands and what compare said, between
   `<!-- compare:begin -->` and `<!-- compare:end -->`.

3. The comm demo at 1 and 2 ranks, then `gpuscope scaling` of the two (`<!-- scaling:... -->`).
4. The imbalanced demo's training with live diagnosis every 10 steps: the last line rank 0 logs
   (`<!-- live:... -->`).
5. `gpuscope try` of the first demo's suggestions: the command and its table of trials
   (`<!-- try:... -->`).

    python scripts/make_readme_demo.py

tests/test_docs.py checks the blocks against what the demo prints today (its label and the
order of its parts) and against each other (the walk-through applies the suggestion shown).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

# generated reports are the models' own: what `gpuscope try` kept on this machine stays out
os.environ["GPUSCOPE_CALIBRATION"] = "off"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DEMO = ("<!-- demo:begin -->", "<!-- demo:end -->")
COMPARE = ("<!-- compare:begin -->", "<!-- compare:end -->")
SCALING = ("<!-- scaling:begin -->", "<!-- scaling:end -->")
LIVE = ("<!-- live:begin -->", "<!-- live:end -->")
TRY = ("<!-- try:begin -->", "<!-- try:end -->")
sys.path.insert(0, ROOT)
from gpuscope.demo import FLAGS  # noqa: E402  the demo's option for each knob its suggestions name
BEFORE, AFTER = os.path.join("runs", "demo"), os.path.join("runs", "after")


def block(printed: str) -> list[str]:
    """The README's lines of a demo's printed output: the report's head and rank table, then its
    suggestions through the first one."""
    lines = [x.rstrip() for x in printed.splitlines()]
    start = next(i for i, x in enumerate(lines) if x.startswith("gpuscope record "))
    table_end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    sug = next(i for i, x in enumerate(lines) if x.startswith("Suggestions"))
    second = next((i for i in range(sug + 3, len(lines)) if lines[i].startswith(" 2. ")
                   or not lines[i].strip()), len(lines))
    # the first suggestion's head and the start of its why (its assumptions: the run's report)
    cut = lines[sug:second] if second <= sug + 6 else lines[sug:sug + 5] + ["    (...)"]
    return lines[start:table_end + 1] + ["(...)", ""] + cut


def walk_through(first: dict, cmp: dict) -> list[str]:
    """The compare walk-through: the two commands, then what compare said of the suggestion."""
    knob, value = first["knob"], first["proposed"]
    pred = next(p for p in cmp["predictions"] if p["knob"] == knob)
    lo, hi = pred["predicted_range"]
    said = ("less" if cmp["slower_pct"] < 0 else "more")
    said = textwrap.fill(
        f"Here it began `AFTER takes {abs(cmp['slower_pct']):.1f}% {said} time per "
        f"{cmp['unit']}`, and its table of BEFORE's suggestions gave `{knob} "
        f"{first['current']} -> {value}`: predicted {pred['predicted_ms']:.1f} ms (range "
        f"{lo:.1f}-{hi:.1f}), measured {pred['measured_ms']:.1f} ({pred['error_pct']:+.1f}%), "
        f"with AFTER's steps varying ±{pred['noise_pct']:.0f}%. The demo's options "
        f"`--sync-every` and `--batch-size` apply the other knobs its suggestions name.",
        width=100, break_long_words=False, break_on_hyphens=False)
    return [
        f"After `make demo`, apply its first suggestion and compare: the demo's last lines print "
        f"these two commands with your run's own value (here `{knob}` {first['current']} -> "
        f"{value}; another machine's may differ):",
        "",
        "```bash",
        f".venv/bin/gpuscope demo {FLAGS[knob]} {value} --no-profile --out {AFTER}",
        f".venv/bin/gpuscope compare {BEFORE}/record {AFTER}/record",
        "```",
        "",
        said,
    ]


def scaling() -> list[str]:
    """The comm demo at one and two ranks, and what `gpuscope scaling` says of them."""
    cmds = [f".venv/bin/gpuscope demo --scenario comm --nproc {n} --no-profile --out runs/comm{n}"
            for n in (1, 2)]
    cmds.append(".venv/bin/gpuscope scaling runs/comm1/record runs/comm2/record")
    for cmd in cmds[:2]:
        gpuscope(*cmd.split()[1:])
    said = gpuscope(*cmds[2].split()[1:]).splitlines()
    table = next(i for i, x in enumerate(said) if x.startswith("┏"))
    # the table and the sentence (the column notes and the paths aside)
    notes = next(i for i, x in enumerate(said) if x.startswith("step ms:"))
    stops = next(i for i, x in enumerate(said) if x.startswith("Adding ranks"))
    kept = said[table:notes] + said[stops:]
    return ["```bash", *cmds, "```", "", "```", *kept, "```"]


def tried() -> list[str]:
    """`gpuscope try` of the demo's suggestions, as the README prints it: the command, and the
    table of trials with the sentence on what it measured."""
    cmd = (f".venv/bin/gpuscope try {BEFORE}/record -- .venv/bin/gpuscope demo --no-profile "
           "--num-workers {num_workers}")
    head, _, training = cmd.split(maxsplit=1)[1].partition(" -- ")
    training = training.replace(".venv/bin/gpuscope", f"{sys.executable} -m gpuscope")
    js = os.path.join(ROOT, "runs", "try.json")
    said = gpuscope(*head.split(), "--out", os.path.join("runs", "try"), "--json", js, "--",
                    *training.split())
    lines = [x.rstrip() for x in said.splitlines()]
    top = next(i for i, x in enumerate(lines) if x.startswith("Trials"))
    end = next(i for i in range(top, len(lines)) if lines[i].startswith("└"))
    with open(js) as fh:
        rows = json.load(fh)["trials"]
    base, best = rows[0], min(rows[1:], key=lambda r: r["step_ms"] or 1e18)
    held = {True: "inside", False: "outside"}.get(best.get("within_range"))
    note = (f"Here {best['label']}: {best['step_ms']:.1f} ms a step against "
            f"{base['step_ms']:.1f}" + (f", {held} gpuscope's range" if held else "") + ".")
    return ["```", f"$ {cmd}", *lines[top:end + 1], "```", note]


def live() -> list[str]:
    """The last line rank 0 logs in the imbalanced demo's training with live_every=10."""
    sys.path.insert(0, ROOT)
    from gpuscope.demo.launch import torchrun_cmd

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    got = subprocess.run(torchrun_cmd(2, "--scenario", "imbalanced", "--steps", "40",
                                      "--run-dir", os.path.join(ROOT, "runs", "live"),
                                      "--live-every", "10"),
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    lines = [x[x.index("gpuscope live"):] for x in (got.stdout + got.stderr).splitlines()
             if "gpuscope live [" in x]
    return ["```", lines[-1], "```"]


def replace(text: str, marks: tuple[str, str], lines: list[str]) -> str:
    a, b = text.index(marks[0]) + len(marks[0]), text.index(marks[1])
    return text[:a] + "\n" + "\n".join(lines) + "\n" + text[b:]


def gpuscope(*args: str) -> str:
    env = dict(os.environ, COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "gpuscope", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def main() -> None:
    printed = gpuscope("demo", "--out", BEFORE)
    with open(os.path.join(ROOT, BEFORE, "report.json")) as fh:
        first = json.load(fh)["suggestions"][0]
    gpuscope("demo", FLAGS[first["knob"]], str(first["proposed"]), "--no-profile",
             "--out", AFTER)
    cmp = json.loads(gpuscope("compare", f"{BEFORE}/record", f"{AFTER}/record", "--json", "-"))
    with open(README) as fh:
        text = fh.read()
    text = replace(text, DEMO, ["```", *block(printed), "```"])
    text = replace(text, COMPARE, walk_through(first, cmp))
    text = replace(text, SCALING, scaling())
    text = replace(text, LIVE, live())
    text = replace(text, TRY, tried())
    with open(README, "w") as fh:
        fh.write(text)
    print(text[text.index(DEMO[0]):text.index(DEMO[1])])
    for marks in (COMPARE, SCALING, LIVE, TRY):
        print(text[text.index(marks[0]):text.index(marks[1])])


if __name__ == "__main__":
    main()
