"""`python -m gpuscope` runs the CLI."""

from .cli import entry

entry()
