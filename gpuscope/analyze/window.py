"""Which steps an analysis reads: all of them, a window the user names (`--steps 10-50,80-99`),
or the steps a torch.profiler captured beside the recording (`--steps profiled`: the record's
`profiled_steps` windows, each less its last step, as a trace's analysis leaves out each file's
last step), so that a run's record and its traces are read over the same steps and give one
story."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..errors import InputError

PROFILED = "profiled"
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_steps(text: str | None):
    """None, PROFILED, or [(first, last), ...] from "10-50,80" (inclusive). Raises InputError."""
    if text is None or text == "":
        return None
    if text.strip() == PROFILED:
        return PROFILED
    out = []
    for part in text.split(","):
        m = _RANGE.match(part)
        if not m:
            raise InputError(f"--steps: {part.strip()!r} is not a step or a range (10-50); "
                             f"give ranges separated by commas, or '{PROFILED}'")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a:
            raise InputError(f"--steps: {a}-{b} runs backwards")
        out.append((a, b))
    return out


def profiled_windows(knobs_by_rank: list[dict]) -> list[tuple[int, int]]:
    """The steps a profiler captured, as a trace reads them: each `profiled_steps` window less
    its last step (a trace file's last step may be cut off, and is left out of its analysis);
    the windows every rank recorded ([] when no rank says)."""
    sets = []
    for knobs in knobs_by_rank:
        wins = knobs.get("profiled_steps") or []
        sets.append({(int(a), int(b) - 1) for a, b in wins if b - 1 >= a})
    if not sets or not all(sets):
        return []
    common = set.intersection(*sets)
    return sorted(common)


def select(frame: pd.DataFrame, windows: list[tuple[int, int]]) -> pd.DataFrame:
    """The rows whose step lies in a window."""
    s = frame["step"].to_numpy()
    keep = np.zeros(len(s), dtype=bool)
    for a, b in windows:
        keep |= (s >= a) & (s <= b)
    return frame[keep].reset_index(drop=True)


def words(windows: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in windows)
