import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from gpuscope.demo.launch import run_training  # noqa: E402


# Scenarios with no straggler injected. On a shared 2-core host one vCPU is now and then slower for
# a whole run (seen in CI: rank 1 computing 24% longer in every step of the comm scenario; rank 0
# computing 18% longer in a compute run here); the rank on it then really is a straggler and
# gpuscope rightly names it. Such a run says nothing about the injected bottleneck, so it is run
# again, up to twice more (seen in CI: the compute run named rank 0, then its rerun rank 1, each
# computing longer all run on a 2-core VM whose speed varies by up to 50%), and every rerun is
# reported in the test summary (never silent). A tool that invents stragglers fails all three.
_BALANCED = ("data", "comm", "compute")
BALANCED_RERUNS = 2
RERUNS: list[str] = []


def run_with_reruns(tries: int, run, trouble):
    """`run(attempt)` up to `tries` times, while `trouble(result)` says what looked wrong (None:
    nothing); each rerun is listed in the test summary, never silent. Returns the last result,
    for the test's own assertions."""
    for attempt in range(tries):
        result = run(attempt)
        if attempt == tries - 1 or (why := trouble(result)) is None:
            return result
        RERUNS.append(f"{why}; ran it again")


def pytest_terminal_summary(terminalreporter):
    if RERUNS:
        terminalreporter.section(f"{len(RERUNS)} rerun(s) (a rank straggled, the VM's speed "
                                 "drifted between timed runs, or a framework aborted at exit)")
        for line in RERUNS:
            terminalreporter.write_line(line)


#: fixtures that start other processes: torchrun training, a TensorBoard server, Chromium
_SLOW_FIXTURES = {"scenario_run", "server", "browser"}


def pytest_collection_modifyitems(items):
    """Tests that use a multi-process fixture are `slow` (`pytest -m "not slow"` skips them)."""
    for item in items:
        if _SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def fresh_log_once():
    """gpuscope logs each kind of internal error once per process: each test starts afresh."""
    from gpuscope import _log

    _log._seen.clear()
    yield


@pytest.fixture(scope="session")
def scenario_run(tmp_path_factory):
    """Run a demo scenario once per session (2-rank gloo DDP under torchrun); returns its run dir."""
    import gpuscope

    cache: dict[str, str] = {}

    def once(scenario: str, steps: int, extra: tuple) -> str:
        out = tmp_path_factory.mktemp(f"run_{scenario}")
        run_training(scenario, str(out / "record"), steps=steps, extra=extra)
        return str(out / "record")

    def run(scenario: str, steps: int = 24, extra: tuple = ()) -> str:
        def named(path):
            d = gpuscope.analyze(path).to_dict()
            slow = [(s["rank"], s["cause"], s["excess_ms"]) for s in d["straggler_details"]]
            return (f"{scenario}: named rank(s) {d['stragglers']} (rank, cause, excess ms: "
                    f"{slow})") if d["stragglers"] else None

        if scenario not in cache:
            tries = BALANCED_RERUNS + 1 if scenario in _BALANCED else 1
            cache[scenario] = run_with_reruns(tries, lambda attempt: once(scenario, steps, extra),
                                              named)
        return cache[scenario]

    return run
