"""TensorBoard plugin: a "gpuscope" tab with a run picker and the dashboard's panels.

Routes (under /data/plugin/gpuscope/):
  /index.js            the tab's ES module (static/)
  /static/<file>       its other static files
  /plotly.min.js       plotly.js from the installed plotly package (works offline)
  /runs                the gpuscope run dirs and Kineto trace folders under the logdir
  /report?run=REL      the report (JSON) and the panels' figures (plotly JSON) for one run

Runs are found lazily and re-listed at most every few seconds (new runs appear); an analysis is
cached until the run's files change (a run still being written is re-read as it grows). Only
paths under the logdir are ever read.
"""

from __future__ import annotations

import json
import os
import threading
import time

from werkzeug import wrappers

from ...errors import GpuscopeError

PLUGIN_NAME = "gpuscope"
STATIC = os.path.join(os.path.dirname(__file__), "static")
RESCAN_S = 3.0
MAX_DEPTH = 6

try:
    from tensorboard.plugins import base_plugin
except ImportError:  # pragma: no cover - the module is only imported by TensorBoard
    base_plugin = None


def _json(data, status: int = 200) -> wrappers.Response:
    return wrappers.Response(json.dumps(data, allow_nan=False, default=str), status=status,
                             content_type="application/json",
                             headers={"X-Content-Type-Options": "nosniff"})


def find_runs(logdir: str, max_depth: int = MAX_DEPTH) -> dict[str, str]:
    """{relative name: kind} for gpuscope run dirs ("record") and trace folders ("kineto")."""
    from ...record_format import FILE_SUFFIX as suffix
    runs: dict[str, str] = {}
    root = os.path.realpath(logdir)
    for dirpath, dirnames, filenames in os.walk(root):
        depth = dirpath[len(root):].count(os.sep)
        if depth >= max_depth:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = os.path.relpath(dirpath, root)
        rel = "." if rel == "." else rel.replace(os.sep, "/")
        if any(f.startswith("rank-") and f.endswith(suffix) for f in filenames):
            runs[rel] = "record"
        elif any(f.endswith(s) for f in filenames for s in (".pt.trace.json", ".pt.trace.json.gz")):
            runs[rel] = "kineto"
    return runs


def _signature(path: str) -> tuple:
    out = []
    for name in sorted(os.listdir(path)):
        try:
            st = os.stat(os.path.join(path, name))
        except OSError:
            continue
        out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


class RunIndex:
    """Run discovery and the analysis cache, shared by the routes; thread-safe."""

    def __init__(self, logdir: str):
        self.logdir = os.path.realpath(logdir)
        self._lock = threading.Lock()
        self._runs: dict[str, str] = {}
        self._scanned = 0.0
        self._cache: dict[str, tuple] = {}

    def runs(self) -> dict[str, str]:
        with self._lock:
            if time.monotonic() - self._scanned > RESCAN_S:
                self._runs = find_runs(self.logdir) if os.path.isdir(self.logdir) else {}
                self._scanned = time.monotonic()
            return dict(self._runs)

    def resolve(self, run: str) -> str | None:
        """Absolute path of a listed run, or None: never anything outside the logdir."""
        if not run or "\x00" in run or run not in self.runs():
            return None
        path = os.path.realpath(os.path.join(self.logdir, run))
        if path != self.logdir and not path.startswith(self.logdir + os.sep):
            return None
        return path

    def report(self, run: str) -> dict:
        path = self.resolve(run)
        if path is None:
            raise KeyError(run)
        sig = _signature(path)
        with self._lock:
            hit = self._cache.get(run)
            if hit and hit[0] == sig:
                return hit[1]
        payload = build_payload(path, run)
        with self._lock:
            self._cache[run] = (sig, payload)
        return payload


def build_payload(path: str, run: str) -> dict:
    from ... import analyze
    from ...vocab import LABEL_COLORS
    from ..html import esc, figures

    try:
        report = analyze(path)
    except GpuscopeError as exc:
        return {"run": esc(run), "error": esc(exc)}
    report.path = run  # never the absolute path on the server
    figs = [{"id": pid, "figure": json.loads(fig.to_json())} for pid, fig in figures(report)]
    return {"run": run, "report": report.to_dict(), "figures": figs, "colors": LABEL_COLORS,
            "title": esc(f"{report.verdict.label}: {run}")}


class GpuscopePlugin(base_plugin.TBPlugin if base_plugin else object):
    plugin_name = PLUGIN_NAME

    def __init__(self, context):
        self._index = RunIndex(context.logdir or "")

    def is_active(self) -> bool:
        try:
            return bool(self._index.runs())
        except OSError:
            return False

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="gpuscope")

    def get_plugin_apps(self):
        return {"/index.js": self._index_js, "/static/*": self._static, "/runs": self._runs,
                "/report": self._report, "/plotly.min.js": self._plotly}

    @wrappers.Request.application
    def _index_js(self, request):
        return self._file("index.js")

    @wrappers.Request.application
    def _static(self, request):
        name = request.path.rsplit("/static/", 1)[-1]
        return self._file(name)

    def _file(self, name: str):
        if not name or "/" in name or "\\" in name or name.startswith("."):
            return _json({"error": "not found"}, 404)
        path = os.path.join(STATIC, name)
        if not os.path.isfile(path):
            return _json({"error": "not found"}, 404)
        ctype = {"js": "application/javascript", "css": "text/css"}.get(name.rsplit(".", 1)[-1],
                                                                         "text/plain")
        with open(path, "rb") as fh:
            return wrappers.Response(fh.read(), content_type=ctype)

    @wrappers.Request.application
    def _plotly(self, request):
        from plotly.offline import get_plotlyjs

        return wrappers.Response(get_plotlyjs(), content_type="application/javascript",
                                 headers={"Cache-Control": "max-age=86400"})

    @wrappers.Request.application
    def _runs(self, request):
        return _json({"runs": [{"run": r, "kind": k} for r, k in sorted(self._index.runs().items())]})

    @wrappers.Request.application
    def _report(self, request):
        run = request.args.get("run", "")
        try:
            return _json(self._index.report(run))
        except KeyError:
            return _json({"error": "unknown run"}, 404)
