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


def wrong_sum(rank, world, port, backend, out):
    """A collective that returns a wrong sum on rank 1 (a broken transport or driver)."""
    import torch.distributed as dist

    real = dist.all_reduce

    def broken(tensor, *args, **kwargs):
        work = real(tensor, *args, **kwargs)
        if rank == 1:
            tensor.add_(1.0)
        return work

    dist.all_reduce = broken
    _smoke_worker(rank, world, port, backend, out)


def replicas_apart(rank, world, port, backend, out):
    """DDP replicas that drift apart (rank 1's gathered parameters differ)."""
    import torch.distributed as dist

    real = dist.all_gather

    def drifting(tensors, tensor, *args, **kwargs):
        work = real(tensors, tensor, *args, **kwargs)
        tensors[1].add_(0.5)
        return work

    dist.all_gather = drifting
    _smoke_worker(rank, world, port, backend, out)
