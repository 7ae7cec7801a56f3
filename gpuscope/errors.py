"""The one exception family gpuscope raises; the CLI alone turns it into exit codes."""


class GpuscopeError(Exception):
    """Base of every error gpuscope raises on purpose; the message says how to fix it."""


class InputError(GpuscopeError):
    """The path given to analyze is missing, empty, or not something gpuscope can read."""


class TraceFormatError(InputError):
    """A trace or record file is truncated, corrupt, or not in a known format."""


def need(module: str, extra: str, what: str) -> None:
    """Raise the one-line install hint every view gives when `what` needs the optional `module`
    (installed by gpuscope's `extra`): the CLI's, the HTML's, the TensorBoard tab's."""
    import importlib
    import importlib.util

    importlib.invalidate_caches()  # installed since this process started (a running TensorBoard)
    if importlib.util.find_spec(module) is None:
        raise GpuscopeError(f"{what} needs {module}: pip install 'gpuscope[{extra}]'")
