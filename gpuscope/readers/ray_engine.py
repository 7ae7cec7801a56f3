"""`gpuscope analyze PATH --engine ray`: each trace file (or rank file) is read on a Ray cluster.

What one machine cannot read in its time or memory (a job's profiler traces are 50-500 MB per
rank) runs on Ray (`pip install 'gpuscope[ray]'`): every file is a task that decodes it where it
runs and works out there what the reader keeps of its rank (readers/kineto/summary.py, through
parse.py `prepared`; readers/rundir/rank_file.py `load_rank_file`); only that comes back. The gathered table is
analysed as the local engine's is, so the report is the same.

- The cluster: the one at `RAY_ADDRESS` (Ray's own convention), else a local one started for the
  analysis (and shut down after it); a Ray already initialised in this process is used as it is.
- Paths: local paths the workers can see (a shared filesystem), or fsspec URLs (`s3://`,
  `gs://`, `file://`...) when the matching filesystem package is installed where the tasks run:
  the listing is made here, each file is read by its task.
- A file a task cannot read gives the local reader's warning ("skipped: ...") and the rest are
  analysed; one file alone that cannot be read is the local reader's error.
"""

from __future__ import annotations

import os
import tempfile

from ..errors import InputError, TraceFormatError
from ..run_format import FILE_GLOB, FILE_SUFFIX, columns_path, is_record_file


def is_url(path: str) -> bool:
    return "://" in path


def _listing(path: str) -> tuple[str, list[str]]:
    """("run" | "traces", the files): a run dir's record files or a trace folder's traces."""
    from ..trace_files import is_trace_name

    if not is_url(path):
        from ..run_format import is_run_dir
        from ..trace_files import find_trace_files

        if not os.path.exists(path):
            raise InputError(f"{path}: no such file or directory")
        if is_run_dir(path) or is_record_file(path):
            import glob

            folder = os.path.dirname(path) if is_record_file(path) else path
            return "run", sorted(glob.glob(os.path.join(folder, FILE_GLOB)))
        return "traces", find_trace_files(path)
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    proto = path.split("://", 1)[0]
    names = ([root] if fs.isfile(root) else
             [p for p in fs.find(root) if not os.path.basename(p).startswith(".")])
    url = (lambda p: f"{proto}://{p}" if not p.startswith(f"{proto}://") else p)
    records = [url(p) for p in names if p.endswith(FILE_SUFFIX)]
    if records:
        return "run", sorted(records)
    return "traces", sorted(url(p) for p in names if is_trace_name(os.path.basename(p)))


def _local_copy(name: str, tmp: str) -> str:
    """A URL's file copied into `tmp` under its own name (rank and host are read from names)."""
    import fsspec

    dest = os.path.join(tmp, os.path.basename(name.split("://", 1)[1]))
    with fsspec.open(name, "rb") as src, open(dest, "wb") as out:
        while True:
            block = src.read(1 << 24)
            if not block:
                break
            out.write(block)
    return dest


def read_trace_file(name: str, alone: bool = True) -> tuple:
    """A task: ("ok", (path, info, events or None, RankSummary or None), facts) or ("bad", the
    error). A file that is its process's only trace (`alone`) comes back summed up, its events
    left in the task (kineto/summary.py); another (a profiler cycle of a process with several)
    with its events, which the driver joins to its rank's others."""
    from .kineto.decode import head_facts
    from .kineto.parse import parse_file, prepared

    with tempfile.TemporaryDirectory() as tmp:
        local = _local_copy(name, tmp) if is_url(name) else name
        try:
            item = parse_file(local)
            item = prepared(item) if alone else item
        except TraceFormatError as exc:
            return "bad", str(exc).replace(local, name)
        return "ok", (name, *item[1:]), head_facts(local)


def read_record_file(name: str) -> tuple:
    """A task: ("ok", the rank file's columns) or ("bad", the error)."""
    from .rundir import load_rank_file

    with tempfile.TemporaryDirectory() as tmp:
        local = name
        if is_url(name):
            local = _local_copy(name, tmp)
            try:  # its column side file, when there is one (it only ever saves time)
                _local_copy(columns_path(name), tmp)
            except (OSError, FileNotFoundError):
                pass
        try:
            got = load_rank_file(local)
        except TraceFormatError as exc:
            return "bad", TraceFormatError(str(exc).replace(local, name))
        got.path = name
        return "ok", got


def _map(fn, names: list[str], *more: list) -> list:
    """fn(name, *more's) for every name as Ray tasks, results in the names' order."""
    import ray

    started = not ray.is_initialized()
    if started:
        import logging

        quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
        if os.environ.get("RAY_ADDRESS"):
            ray.init(**quiet)
        else:
            ray.init(include_dashboard=False, **quiet)
    try:
        task = ray.remote(fn)
        return ray.get([task.remote(n, *(m[i] for m in more)) for i, n in enumerate(names)])
    finally:
        if started:
            ray.shutdown()


def read_on_ray(path: str):
    """The RunTable of `path`, its files read as Ray tasks."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError("--engine ray needs Ray: pip install 'gpuscope[ray]'") from None
    if not is_url(path):
        from .optimeline import is_op_timeline, read_op_timeline

        if is_op_timeline(path):  # one table, already per op: read here
            return read_op_timeline(path)
    kind, names = _listing(path)
    if not names:
        raise InputError(f"{path}: neither a gpuscope run dir nor torch.profiler traces")
    if kind == "run":
        from .rundir import read_run_dir

        got = _map(read_record_file, names)
        return read_run_dir(path, loaded=[(n, g[1]) for n, g in zip(names, got)])
    from .kineto.reader import table_of

    from .kineto.parse import alone_files

    got = _map(read_trace_file, names, alone_files(names))
    parsed = [g[1] for g in got if g[0] == "ok"]
    bad = [g[1] for g in got if g[0] == "bad"]
    if len(names) == 1 and bad:
        raise TraceFormatError(bad[0])
    facts = {g[1][0]: g[2] for g in got if g[0] == "ok"}
    return table_of(path, parsed, bad, facts)
