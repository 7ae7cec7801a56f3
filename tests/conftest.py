import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from gpuscope.demo.launch import run_training  # noqa: E402


@pytest.fixture(scope="session")
def scenario_run(tmp_path_factory):
    """Run a demo scenario once per session (2-rank gloo DDP under torchrun); returns its run dir."""
    cache: dict[str, str] = {}

    def run(scenario: str, steps: int = 24) -> str:
        if scenario not in cache:
            out = tmp_path_factory.mktemp(f"run_{scenario}")
            run_training(scenario, str(out / "record"), steps=steps)
            cache[scenario] = str(out / "record")
        return cache[scenario]

    return run
