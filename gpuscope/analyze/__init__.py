"""Analysis: a RunTable -> Report (wait split, step labels, stragglers, telemetry, suggestions).

Nothing here reads files or prints. This package's __init__ stays empty on purpose: `gpuscope`
imports it at start-up so that `gpuscope.analyze` stays the function (see gpuscope/__init__.py).
"""
