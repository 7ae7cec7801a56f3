"""Smoke-test workers for tests/test_doctor.py (spawned processes import them by name)."""

import os

from gpuscope.doctor import _smoke_worker


def crash_after_result(rank, world, port, backend, out):
    """Passes the checks, then dies the way a C++ teardown crash does (SIGABRT)."""
    _smoke_worker(rank, world, port, backend, out)
    if rank == 1:
        os.abort()


def crash_before_result(rank, world, port, backend, out):
    if rank == 1:
        os.abort()
    _smoke_worker(rank, world, port, backend, out)
