"""Per-step scalars (ms, per rank) as TensorBoard event files, for the standard Scalars tab."""

from __future__ import annotations

import os

from .record_format import STEP_COLUMNS

SCALARS = ("step_ns", "data_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "other_ns")


class ScalarWriter:
    """Writes rows of STEP_COLUMNS to `run_dir/tensorboard/rank-NNNNN/` (torch's SummaryWriter,
    imported only when asked for)."""

    def __init__(self, run_dir: str, rank: int):
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(os.path.join(run_dir, "tensorboard", f"rank-{rank:05d}"))

    def write(self, rows: list[list]) -> None:
        for row in rows:
            r = dict(zip(STEP_COLUMNS, row))
            for col in SCALARS:
                self._w.add_scalar(f"gpuscope/{col[:-3]}_ms", r[col] / 1e6, r["step"])

    def close(self) -> None:
        self._w.close()
