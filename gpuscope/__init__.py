"""gpuscope: why is multi-GPU PyTorch training slow, and what to change.

``import gpuscope`` stays light (no torch, pandas or plotly): the analysis side is imported
only when asked for.
"""

from .errors import GpuscopeError, InputError, TraceFormatError
from .recorder import Recorder, record

__version__ = "0.1.0"


def analyze(path, **options):
    """Analyze a run dir or Kineto trace folder/file; returns a :class:`gpuscope.report.Report`."""
    from .pipeline import analyze_path

    return analyze_path(path, **options)


__all__ = ["record", "Recorder", "analyze", "GpuscopeError", "InputError", "TraceFormatError",
           "__version__"]
