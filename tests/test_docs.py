"""The README is a guide for users, and no figure in it or in docs/performance.md is typed by
hand: both are what scripts/make_performance_doc.py writes from benchmarks/results/."""

import importlib.util
import os

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_performance_doc", os.path.join(ROOT, "scripts", "make_performance_doc.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
