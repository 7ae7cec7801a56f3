"""The README is a guide for users, and no figure in it or in docs/performance.md is typed by
hand: both are what scripts/make_performance_doc.py writes from benchmarks/results/."""

import os

import pytest

from helpers import script

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _generator():
    return script("make_performance_doc")


def test_the_readme_is_a_guide_of_at_most_350_lines():
    with open(os.path.join(ROOT, "README.md")) as fh:
        lines = fh.read().splitlines()
    assert len(lines) <= 350, len(lines)


def test_the_readme_budget_lines_are_the_results_files():
    gen = _generator()
    docs = {name: gen._load(name) for name in os.listdir(gen.RESULTS) if name.endswith(".json")}
    want = gen.budgets({k: v for k, v in docs.items() if v})
    with open(os.path.join(ROOT, "README.md")) as fh:
        text = fh.read()
    block = text.split(gen.BEGIN, 1)[1].split(gen.END, 1)[0].strip().splitlines()
    assert block == want, "README budgets are stale: run python scripts/make_performance_doc.py"
    assert len(want) >= 6


def test_performance_doc_is_generated_from_the_results(tmp_path, monkeypatch):
    gen = _generator()
    monkeypatch.setattr(gen, "OUT", str(tmp_path / "performance.md"))
    monkeypatch.setattr(gen, "README", str(tmp_path / "no-readme.md"))
    gen.main()
    with open(tmp_path / "performance.md") as fh, \
            open(os.path.join(ROOT, "docs", "performance.md")) as committed:
        assert fh.read() == committed.read(), \
            "docs/performance.md is stale: run python scripts/make_performance_doc.py"


def test_the_median_s_interval_is_order_statistics_that_cover_it_95_percent_of_the_time():
    """The README's interval around the recorder's cost: the order statistics of the binomial
    rule, and over many seeded samples of a skewed, noisy distribution (rounds of a VM whose
    speed drifts) it holds the true median about 95% of the time."""
    import random

    gen = _generator()
    assert gen.median_interval(list(range(5))) is None
    assert gen.median_interval(list(range(1, 42))) == (14, 28)     # n=41: k=14
    assert gen.median_interval(list(range(201, 0, -1))) == (86, 116)  # n=201: k=86, unsorted
    rng = random.Random(7)
    true_median = 30  # a lognormal(3, s) has median e**3 = 20.0855...: shifted to 30
    hits = 0
    for _ in range(2000):
        sample = [30 + rng.lognormvariate(3, 0.8) - 20.085536923187668 for _ in range(41)]
        lo, hi = gen.median_interval(sample)
        hits += lo <= true_median <= hi
    assert 0.93 <= hits / 2000 <= 0.985, hits / 2000


def _readme_demo():
    return script("make_readme_demo")


def _between(text: str, marks: tuple[str, str]) -> list[str]:
    return text.split(marks[0], 1)[1].split(marks[1], 1)[0].strip().splitlines()


def _shape(line: str) -> str:
    """A printed line with its figures taken out: what stays from run to run."""
    import re

    return re.sub(r"[━─]+", "-", re.sub(r"\d+(\.\d+)?( ?[kM]\b)?", "#", line)).replace(" ", "")


def test_the_readme_compare_walk_through_applies_the_suggestion_its_demo_output_shows():
    gen = _readme_demo()
    with open(os.path.join(ROOT, "README.md")) as fh:
        text = fh.read()
    demo, walk = _between(text, gen.DEMO), " ".join(_between(text, gen.COMPARE))
    first = next(x for x in demo if x.startswith(" 1. "))
    knob, change = first[4:].split(":", 1)
    current, proposed = change.split()[0], change.split()[2]
    assert f"`{knob}` {current} -> {proposed}" in walk
    assert f"{gen.FLAGS[knob]} {proposed} " in walk
    assert f"`{knob} {current} -> {proposed}`" in walk  # what compare said of that suggestion


@pytest.mark.slow
@pytest.mark.alone
def test_the_readme_demo_output_is_what_the_demo_prints_and_its_commands_run(tmp_path):
    """`make demo`'s run: the README's block has the label, the lines and the parts in the order
    the demo prints them today (figures aside), and every command the demo prints runs, as
    printed, in a fresh shell (no venv activated) at the clone's root."""
    import re
    import shlex
    import subprocess
    import sys
    import time

    gen = _readme_demo()
    out = str(tmp_path / "demo")
    env = dict(os.environ, COLUMNS="100")
    printed = subprocess.run([sys.executable, "-m", "gpuscope", "demo", "--out", out],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                             check=True).stdout
    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = _between(fh.read(), gen.DEMO)
    assert readme[0] == readme[-1] == "```"
    readme, now = readme[1:-1], gen.block(printed)
    assert readme[0] == "gpuscope record runs/demo/record" and now[0].startswith("gpuscope record")
    verdict = [next(x for x in lines if x.startswith("Verdict:")).split("(also")[0]
               for lines in (readme, now)]
    # the confidence is the run's own: the README's (a quiet machine) is high; on a busy one a
    # rank's pace may leave a straggler not ruled out, and it says medium with why on a line
    # of its own
    level = lambda x: re.sub(r"confidence (high|medium|low)", "confidence #", x)  # noqa: E731
    assert _shape(level(verdict[0])) == _shape(level(verdict[1]))
    assert " DATA-BOUND " in verdict[1] and "confidence high" in verdict[0]
    readme = [x for x in readme if not x.startswith("confidence ")]
    now = [x for x in now if not x.startswith("confidence ")]
    end = next(i for i, x in enumerate(now) if x.startswith("└"))
    assert [_shape(x) for x in readme[1:end + 1] if not x.startswith("Verdict:")] == \
        [_shape(x) for x in now[1:end + 1] if not x.startswith("Verdict:")]
    sug = now.index("(...)")
    assert readme[sug:sug + 4] == now[sug:sug + 4]  # "(...)", "", the suggestions' heading
    assert readme[sug + 4].split(":")[0] == now[sug + 4].split(":")[0]  # " 1. num_workers"

    shell = dict(os.environ, PATH="/usr/bin:/bin")
    shell.pop("VIRTUAL_ENV", None)
    cmds = [x.split(": ", 1)[1] for x in printed.splitlines()
            if x.startswith(("The same run as", "In TensorBoard"))]
    assert len(cmds) == 2, printed[-800:]
    for cmd in cmds:
        if "tensorboard" not in cmd:
            got = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=shell, capture_output=True,
                                 text=True, timeout=300)
            assert got.returncode == 0 and "Verdict:" in got.stdout, got.stderr[-1000:]
            continue
        tb = subprocess.Popen(["bash", "-c", "exec " + cmd + " --port 0"], cwd=ROOT, env=shell,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:  # the printed command with a free port: the CI host may serve 6006 already
            deadline, seen = time.monotonic() + 120, ""
            while time.monotonic() < deadline and "http://" not in seen:
                line = tb.stdout.readline()
                if not line:
                    break
                seen += line
            assert "http://" in seen, (shlex.split(cmd), seen[-1000:])
        finally:
            tb.kill()
            tb.wait()
    # the next steps it prints carry this run's own first suggestion, and run as printed
    lines = printed.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("Next: apply the first suggestion"))
    assert f" -> {now[sug + 4].split()[4]})" in lines[at]  # " 1. num_workers: 0 -> N ..."
    # ... and the try of every suggested value (its trials are longer than the demo's own 30
    # steps: a whole epoch of 30 batches after 5 of warm-up; the demo trains until they end)
    for cmd, want in ((lines[at + 1].strip(), "Verdict:"), (lines[at + 2].strip(), "AFTER"),
                      (lines[at + 4].strip(), "Trials")):
        got = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=shell, capture_output=True,
                             text=True, timeout=600)
        assert got.returncode == 0 and want in got.stdout, (cmd, got.stderr[-1000:])
        assert "failed" not in got.stdout, (cmd, got.stdout[-2000:])


def test_the_rules_kernel_families_are_the_readers_own_table():
    """docs/rules.md's table of communication kernel families is the one the trace reader
    matches kernels with (readers/kineto/kernels.py FAMILIES), as families_table() writes it."""
    from gpuscope.readers.kineto.kernels import families_table

    with open(os.path.join(ROOT, "docs", "rules.md"), encoding="utf-8") as fh:
        assert families_table() in fh.read()


def test_the_readme_first_run_line_is_the_results_file():
    gen = _generator()
    want = gen.first_run(gen._load("first_run.json"))
    with open(os.path.join(ROOT, "README.md")) as fh:
        assert _between(fh.read(), gen.FIRST_RUN) == want, \
            "README's first-run line is stale: run python scripts/make_performance_doc.py"


def test_make_says_what_it_installs_before_pip_runs(tmp_path):
    """Issue 71, 18.: `make demo` was silent for a minute while pip ran: it says what it installs
    (torch's wheel, the largest part) first and the venv's size after, the first time only."""
    import subprocess

    out = subprocess.run(["make", "-n", "-B", f"VENV={tmp_path / 'v'}", f"{tmp_path / 'v'}/.demo"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    first_pip = next(i for i, x in enumerate(lines) if "pip install -q \"torch" in x)
    assert any("installing torch==" in x and "CPU wheel" in x for x in lines[:first_pip])
    assert any("now takes" in x for x in lines[first_pip:])
