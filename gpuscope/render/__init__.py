"""Renderers: each module's `render(report, ...)` turns a Report into one output (str or bytes):
terminal (text, optionally ANSI-coloured), json (the JSON report), html (the dashboard); the
TensorBoard tab serves the same panels. Renderers read only the Report (and its table when it
has one); they never analyse and never print.
"""
