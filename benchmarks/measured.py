"""What a benchmark's results file says about the code it measured."""

from __future__ import annotations

import os
import subprocess


def commit() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    try:
        return subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse",
                               "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None
