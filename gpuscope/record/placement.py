"""Where this process sits in the job: rank, local rank, world size, host, and the job's id."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    host: str
    source: str  # "torch.distributed" | "env" | "single"


def _env_int(name: str, default: int | None = None) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def detect_placement() -> Placement:
    """Rank / world size from torch.distributed when initialized, else RANK/WORLD_SIZE env, else one process.

    torch is only consulted when the training process already imported it.
    """
    host = socket.gethostname()
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE")
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                world = dist.get_world_size()
                return Placement(dist.get_rank(), local_rank, world, local_world or world, host,
                                 "torch.distributed")
        except Exception:  # a broken process group must not stop recording
            pass
    rank = _env_int("RANK")
    world = _env_int("WORLD_SIZE")
    if rank is not None and world is not None:
        return Placement(rank, local_rank, world, local_world or world, host, "env")
    return Placement(0, 0, 1, 1, host, "single")


def job_id() -> str:
    """An id every rank of this job shares, from the launcher's environment ("" if none):
    GPUSCOPE_RUN_ID, else torchrun's run id and restart count, else SLURM's job and step."""
    env = os.environ
    if env.get("GPUSCOPE_RUN_ID"):
        return env["GPUSCOPE_RUN_ID"]
    run = env.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        return f"torchelastic:{run}:{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return (f"slurm:{env['SLURM_JOB_ID']}:{env.get('SLURM_STEP_ID', '')}:"
                f"{env.get('SLURM_RESTART_COUNT', '0')}")
    return ""
