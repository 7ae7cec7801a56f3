"""gpuscope: why is multi-GPU PyTorch training slow, and what to change.

``import gpuscope`` stays light (no torch, numpy, pandas or plotly): it loads the recorder and the
Report type; the analysis side is imported when `analyze` is first called.

Names and packages: ``gpuscope.record`` and ``gpuscope.analyze`` are functions; the packages of
the same names (gpuscope/record/, gpuscope/analyze/) are imported here first, so that loading
their modules later never rebinds these names. Reach them with ``from gpuscope.record import ...``.
"""

from __future__ import annotations

from . import analyze as _analyze_package  # noqa: F401  (empty __init__: see above)
from .errors import GpuscopeError, InputError, TraceFormatError
from .record.options import RecordOptions
from .record.profiler_facts import host_facts
from .record.recorder import Recorder, record
from .report import Report
from .thresholds import Thresholds

__version__ = "0.1.0"


def analyze(path, *, thresholds: Thresholds | dict | str | None = None,
            skip: int | None = None, engine: str = "local", steps=None) -> Report:
    """Analyze a run dir (or one of its rank files), a folder/file of torch.profiler traces, or
    an op timeline.

    thresholds: a Thresholds, or overrides as {"wait": 0.05} or "wait=0.05,comm=0.2".
    skip: warm-up steps to leave out per rank (default: 1 for recorded runs, 0 for traces).
    engine: "local", or "ray": each file read by a task on the Ray cluster at RAY_ADDRESS
    (else a local one); paths may then be fsspec URLs.
    steps: the steps to read: "10-50,80-99", [(10, 50)], or "profiled" (those a torch.profiler
    captured beside a recording: the steps its traces hold); default all.
    """
    from .analyze.run import analyze_table
    from .readers import read_path

    if not isinstance(thresholds, Thresholds):
        thresholds = Thresholds().with_overrides(thresholds)
    if isinstance(steps, str):
        from .analyze.window import parse_steps

        steps = parse_steps(steps)
    from .analyze.run import warm_steps

    return analyze_table(read_path(path, engine=engine,
                                   warm=warm_steps(thresholds, skip, steps)),
                         thresholds, skip=skip, own=True, steps=steps)


__all__ = ["record", "Recorder", "RecordOptions", "host_facts", "analyze", "Report", "Thresholds", "GpuscopeError",
           "InputError", "TraceFormatError", "__version__"]
