"""What a benchmark's results file says about the code it measured."""

from __future__ import annotations

import glob
import os
import subprocess


def commit(root: str | None = None) -> str | None:
    """The checkout's commit (this one's, or `root`'s; None outside a git checkout)."""
    try:
        return subprocess.run(["git", "-C", root or os.path.dirname(os.path.abspath(__file__)),
                               "rev-parse",
                               "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants, from /proc (Linux)."""
    out, i = [pid], 0
    while i < len(out):
        for task in glob.glob(f"/proc/{out[i]}/task/*/children"):
            try:
                with open(task) as fh:
                    out += [int(p) for p in fh.read().split()]
            except OSError:
                pass
        i += 1
    return out
