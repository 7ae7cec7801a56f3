"""TensorBoard plugin: a "gpuscope" tab with a run picker and the dashboard's panels.

Routes (under /data/plugin/gpuscope/):
  /index.js            the tab's ES module (static/)
  /static/<file>       its other static files
  /plotly.min.js       plotly.js from the installed plotly package (works offline)
  /runs                the gpuscope run dirs and Kineto trace folders under the logdir
  /report?run=REL      the report (JSON) and the panels' figures (plotly JSON) for one run

Runs are found lazily, by the same rules as the CLI, and re-listed at most every few seconds (new
runs appear); an analysis is cached until the run's files change (a run still being written is
re-read as it grows), in a cache bounded in runs and bytes. Only paths under the logdir are ever
read: links out of it are not followed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict

from werkzeug import wrappers

from ...errors import GpuscopeError, need

PLUGIN_NAME = "gpuscope"
STATIC = os.path.join(os.path.dirname(__file__), "static")
RESCAN_S = 3.0
MAX_DEPTH = 6

try:
    from tensorboard.plugins import base_plugin
except ImportError:  # pragma: no cover - the module is only imported by TensorBoard
    base_plugin = None


#: on every response: TensorBoard warns of one without it (an error from its 3.0 on)
NOSNIFF = {"X-Content-Type-Options": "nosniff"}


def _json(data, status: int = 200) -> wrappers.Response:
    return wrappers.Response(json.dumps(data, allow_nan=False, default=str), status=status,
                             content_type="application/json", headers=NOSNIFF)


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def find_runs(logdir: str, max_depth: int = MAX_DEPTH) -> dict[str, str]:
    """{relative name: kind} for gpuscope run dirs ("record") and trace folders ("kineto"), found
    by the same rules as `gpuscope analyze` (readers). Links are not followed out of the logdir:
    a file whose target lies outside does not make its folder a run."""
    from ...trace_files import is_trace_file
    from ...run_format import parse_file_name

    runs: dict[str, str] = {}
    root = os.path.realpath(logdir)
    for dirpath, dirnames, filenames in os.walk(root):
        depth = dirpath[len(root):].count(os.sep)
        if depth >= max_depth:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = os.path.relpath(dirpath, root)
        rel = "." if rel == "." else rel.replace(os.sep, "/")
        inside = [f for f in filenames if _inside(os.path.join(dirpath, f), root)]
        if any(parse_file_name(f) for f in inside):
            runs[rel] = "record"
        elif any(is_trace_file(os.path.join(dirpath, f)) for f in inside):
            runs[rel] = "kineto"
    return runs


def _files(path: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(path):  # links to folders are not walked
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out += [os.path.join(dirpath, f) for f in sorted(filenames)]
    return out


def _newest(path: str) -> float:
    """When the newest file of a run was last written (0 when none can be read)."""
    try:
        return max((e.stat().st_mtime for e in os.scandir(path) if e.is_file()), default=0.0)
    except OSError:
        return 0.0


def _signature(path: str) -> tuple:
    out = []
    for name in _files(path):
        try:
            st = os.stat(name)
        except OSError:
            continue
        out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


class RunIndex:
    """Run discovery and the analysis cache, shared by the routes; thread-safe.

    Memory stays bounded whatever the logdir holds: one analysis runs at a time (concurrent
    requests for the same run wait for it and share the result), the cache keeps at most
    CACHE_RUNS reports and CACHE_BYTES of them (least recently used dropped first), and a run
    larger than MAX_RUN_BYTES on disk is not analysed in the server (the tab says to use the
    CLI; GPUSCOPE_TB_MAX_RUN_BYTES changes the bound)."""

    CACHE_RUNS = 16
    CACHE_BYTES = 64 << 20
    MAX_RUN_BYTES = int(os.environ.get("GPUSCOPE_TB_MAX_RUN_BYTES", 2 << 30))

    def __init__(self, logdir: str):
        self.logdir = os.path.realpath(logdir)
        self._lock = threading.Lock()
        self._analysis = threading.Lock()
        self._runs: dict[str, str] = {}
        self._scanned = 0.0
        self._cache: OrderedDict[str, tuple] = OrderedDict()  # run -> (signature, payload, size)
        self.analyses = 0  # how many analyses ran (the cache's hits are the requests beyond)

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
        if not _inside(path, self.logdir):
            return None
        return path

    def _cached(self, run: str, sig: tuple):
        with self._lock:
            hit = self._cache.get(run)
            if hit and hit[0] == sig:
                self._cache.move_to_end(run)
                return hit[1]
        return None

    def _store(self, run: str, sig: tuple, payload: dict) -> None:
        size = len(json.dumps(payload, default=str))
        with self._lock:
            self._cache.pop(run, None)
            if size <= self.CACHE_BYTES:
                self._cache[run] = (sig, payload, size)
            while self._cache and (len(self._cache) > self.CACHE_RUNS or
                                   sum(v[2] for v in self._cache.values()) > self.CACHE_BYTES):
                self._cache.popitem(last=False)

    def cached_runs(self) -> list[str]:
        with self._lock:
            return list(self._cache)

    def report(self, run: str) -> dict:
        path = self.resolve(run)
        if path is None:
            raise KeyError(run)
        sig = _signature(path)
        payload = self._cached(run, sig)
        if payload is not None:
            return payload
        with self._analysis:  # one at a time: memory is one analysis's, not one per request
            sig = _signature(path)
            payload = self._cached(run, sig)
            if payload is not None:
                return payload
            outside = [f for f in _files(path) if not _inside(f, self.logdir)]
            total = sum(s for _, s, _ in sig)
            from ...render.html import esc

            if outside:
                payload = {"run": esc(run), "error": esc(f"{run} holds {len(outside)} link(s) to files "
                           "outside the logdir; the tab does not read them")}
            elif total > self.MAX_RUN_BYTES:
                payload = {"run": esc(run), "error": esc(f"{run} is {total / 2**30:.1f} GiB, more than the "
                           f"tab analyses inside TensorBoard ({self.MAX_RUN_BYTES / 2**30:.1f} GiB, "
                           "GPUSCOPE_TB_MAX_RUN_BYTES): run `gpuscope analyze` on it")}
            else:
                payload = build_payload(path, run)
                self.analyses += 1
            if not payload.get("retry"):  # a missing package is installed while the tab runs
                self._store(run, sig, payload)
        return payload


def build_payload(path: str, run: str) -> dict:
    from html import escape

    try:  # the tab's panels are plotly figures: without it, the CLI's one-line hint
        need("plotly", "tensorboard", "the TensorBoard tab")
    except GpuscopeError as exc:  # our own words (plain quotes): the page shows them as text
        return {"run": escape(run), "error": f"{exc}, then reload this page", "retry": True}
    from ... import analyze
    from ...vocab import LABEL_COLORS
    from ...op_names import excess_words
    from ...render import ops_text
    from ...render.html import esc, figures
    from ...render.terminal import also_words, energy_line, throughput_line

    try:
        report = analyze(path)
    except GpuscopeError as exc:
        return {"run": esc(run), "error": esc(exc)}
    report.path = run  # never the absolute path on the server
    figs = [{"id": pid, "figure": json.loads(fig.to_json())} for pid, fig in figures(report)]
    # the ops section's words, as the terminal says them (one wording for every view)
    words = {"ops_lines": ops_text.lines(report.ops),
             "straggler_ops": {str(s.rank): excess_words(s.ops) for s in report.stragglers
                               if s.ops},
             "minor": [m.line(report.thresholds.wait) for m in report.minor_stragglers],
             "also": also_words(report.verdict),
             "throughput": throughput_line(report.throughput),
             "energy": energy_line(report.energy),
             "not_ruled_out": report.not_ruled_out_line,
             "straggler_floor": report.straggler_floor_line,
             "jitter": report.jitter.note(report.late_ranks)}
    return {"run": run, "report": report.to_dict(), "figures": figs, "colors": LABEL_COLORS,
            "title": esc(f"{report.verdict.label}: {run}"), "words": words}


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
        ctype = {"js": "application/javascript", "css": "text/css",
                 "html": "text/html"}.get(name.rsplit(".", 1)[-1], "text/plain")
        with open(path, "rb") as fh:  # nosniff: TensorBoard warns of responses without it
            return wrappers.Response(fh.read(), content_type=ctype, headers=NOSNIFF)

    @wrappers.Request.application
    def _plotly(self, request):
        try:
            need("plotly", "tensorboard", "the TensorBoard tab")
        except GpuscopeError as exc:
            return _json({"error": str(exc)}, 503)
        from plotly.offline import get_plotlyjs

        return wrappers.Response(get_plotlyjs(), content_type="application/javascript",
                                 headers={"Cache-Control": "max-age=86400", **NOSNIFF})

    @wrappers.Request.application
    def _runs(self, request):
        """The runs, newest first (the tab opens the first: the run just recorded, not the
        alphabetically first of the logdir)."""
        runs = self._index.runs()
        newest = {r: _newest(os.path.join(self._index.logdir, r)) for r in runs}
        order = sorted(runs, key=lambda r: (-newest[r], r))
        return _json({"runs": [{"run": r, "kind": runs[r]} for r in order]})

    @wrappers.Request.application
    def _report(self, request):
        run = request.args.get("run", "")
        try:
            return _json(self._index.report(run))
        except KeyError:
            return _json({"error": "unknown run"}, 404)
