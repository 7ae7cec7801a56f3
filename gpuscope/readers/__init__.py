"""Readers: a gpuscope run dir (rundir/), torch.profiler traces (kineto/) or an op timeline
(optimeline.py) -> RunTable."""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:  # pandas: not imported before a reader needs it (kineto/prefetch.py)
    from ..runtable import RunTable


@contextmanager
def no_gc():
    """Python's cycle collector paused: reading allocates millions of lists and dicts (none of
    them in cycles), and each full collection would walk all of them again (a quarter of the
    reading time on 1,024 record files)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_path(path, *, parsed=None, engine: str = "local", warm: int = 0) -> RunTable:
    """Read a gpuscope run dir (or one of its rank files), or a torch.profiler trace folder or
    file; which one is detected. `parsed`: the command line's early parse of the trace files
    (kineto/prefetch.py), or None. `engine`: "local", or "ray" (each file read by a Ray task:
    ray_engine.py). `warm`: the warm-up steps per rank the caller's analysis leaves out of a
    run dir: set apart while reading where they can be (RunTable.warm; the caller owns the
    table)."""
    if engine == "ray":
        from .ray_engine import read_on_ray

        with no_gc():
            return read_on_ray(os.fspath(path))
    if engine != "local":
        raise InputError(f"engine {engine!r}: local or ray")
    with no_gc():
        return _read_path(path, parsed, warm)


def _read_path(path, parsed=None, warm: int = 0) -> RunTable:
    from ..run_format import is_record_file, is_run_dir

    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")
    if is_run_dir(path) or is_record_file(path):
        from .rundir import read_run_dir

        return read_run_dir(path, warm=warm)
    from .optimeline import is_op_timeline, read_op_timeline

    if is_op_timeline(path):
        return read_op_timeline(path)
    from ..trace_files import find_trace_files
    from .kineto.reader import read_kineto

    files = find_trace_files(path)
    if files:
        table = read_kineto(path, files, parsed_ahead=parsed)
        runs = [sub for sub, _ in _inputs_below(path, traces=False)]
        if runs:  # the same run recorded beside its traces, as the demo writes them
            table.warnings.append(f"{path} also holds a gpuscope run dir ({', '.join(runs)}): "
                                  "these are its torch.profiler traces; `gpuscope analyze "
                                  f"{runs[0]}` reads the record")
        return table
    below = _inputs_below(path)
    if below:
        raise InputError(f"{path}: no input here, but in its folders: " + ", ".join(
            f"{sub} ({what})" for sub, what in below) + "; analyse one at a time: "
            f"gpuscope analyze {below[0][0]}")
    raise InputError(f"{path}: neither a gpuscope run dir (rank-*.gpuscope.jsonl), torch.profiler "
                     "traces (*.pt.trace.json[.gz] / *.json[.gz]), an op timeline "
                     "(.parquet / .csv: rank, step, optype, start_ts, duration) nor Flight "
                     "Recorder dumps (pickles or JSON of version, pg_config, pg_status, entries)"
                     + _json_here(path))


def _inputs_below(folder: str, traces: bool = True) -> list[tuple[str, str]]:
    """[(sub-folder, what it holds)] of the folder's own sub-folders that are inputs (a run dir,
    torch.profiler traces where `traces`): a demo's or a job's output folder (record/, kineto/
    beside a report) given whole."""
    from ..run_format import is_run_dir
    from ..trace_files import find_trace_files

    try:
        subs = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    except OSError:  # a file, or a folder that cannot be listed
        return []
    out = []
    for sub in subs:
        if not os.path.isdir(sub):
            continue
        if is_run_dir(sub):
            out.append((sub, "a gpuscope run dir"))
        elif traces and find_trace_files(sub):
            out.append((sub, "torch.profiler traces"))
    return out


def _json_here(folder: str) -> str:
    """What the folder's first JSON file is, where it holds JSON files but no trace: the reason
    the file alone would get (kineto/what.py)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith((".json", ".json.gz")))
    except OSError:  # a file, or a folder that cannot be listed
        return ""
    if not names:
        return ""
    from .kineto.what import looks_like

    first = looks_like(os.path.join(folder, names[0])).split("; gpuscope reads")[0]
    return f"; {len(names)} JSON file(s) here, none a trace: {first}"
