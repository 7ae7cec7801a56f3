"""Kineto reader (to be completed)."""

from ..errors import InputError


def read_kineto(path, files):
    raise InputError(f"{path}: torch.profiler traces are not supported yet")
