"""Which steps an analysis reads: all of them, a window the user names (`--steps 10-50,80-99`),
or the steps a torch.profiler captured beside the recording (`--steps profiled`: the record's
`profiled_steps` windows, each less its last step, as a trace's analysis leaves out each file's
last step), so that a run's record and its traces are read over the same steps and give one
story."""

from __future__ import annotations

import re

from dataclasses import replace

import numpy as np
import pandas as pd

from ..errors import InputError
from ..runtable import RunTable

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


def windowed(table: RunTable, steps, warnings: list[str]) -> RunTable:
    """The table over the steps named ([(first, last), ...] or PROFILED), said in a warning;
    InputError when no step is left."""
    if steps == PROFILED:
        steps = profiled_windows([i.knobs for i in table.ranks.values()])
        if not steps:
            raise InputError(f"{table.path}: --steps profiled: the record says of no step that a "
                             "torch.profiler captured it (a recorder older than this, or no "
                             "profiler ran beside it)")
    frame = select(table.frame, steps)
    if frame.empty:
        raise InputError(f"{table.path}: no step in {words(steps)}")
    warnings.append(f"analysed steps {words(steps)} only ({frame['step'].nunique()} of "
                    f"{table.frame['step'].nunique()} recorded)")
    return replace(table, frame=frame, int_block=None)


def profiled_hint(table: RunTable) -> list[str]:
    """For a record read over all its steps whose run a profiler captured in part: the command
    that reads it over the steps its traces hold ([] otherwise)."""
    if table.source != "record":
        return []
    wins = profiled_windows([i.knobs for i in table.ranks.values()])
    return [f"a torch.profiler captured steps {words(wins)} of this run: `gpuscope analyze "
            f"{table.path} --steps profiled` reads this record over the steps its traces hold, "
            "for one story from both"] if wins else []
