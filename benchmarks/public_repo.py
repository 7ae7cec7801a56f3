"""A public repository's files at a pinned commit, for the benchmarks that run other people's
training programs (public_nanogpt.py, public_mingpt.py)."""

from __future__ import annotations

import os
import subprocess


def git_dir(mirror: str, url: str, name: str) -> str:
    """A clone holding the commit: `mirror` (a .git directory or a mirror) where it exists,
    else one cloned once into ~/.cache/gpuscope/`name`."""
    if os.path.isdir(mirror):
        return mirror
    cache = os.path.join(os.path.expanduser("~"), ".cache", "gpuscope", name)
    if not os.path.isdir(cache):
        subprocess.run(["git", "clone", "--bare", "--quiet", url, cache], check=True)
    return cache


def source(git: str, commit: str, path: str) -> str:
    """One file's text at `commit`."""
    return subprocess.run(["git", "--git-dir", git, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout
