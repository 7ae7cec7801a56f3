"""Per-step scalars (ms, per rank) as TensorBoard event files, for the standard Scalars tab."""

from __future__ import annotations

import os
import queue
import threading

from ..run_format import STEP_COLUMNS
from ..vocab import MS

SCALARS = ("step_ns", "data_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "other_ns")


class ScalarWriter:
    """Writes rows of STEP_COLUMNS to `run_dir/tensorboard/<name>/` (torch's SummaryWriter,
    imported only when asked for); `name` is the rank file's (rank-00000, rank-00000-2, ...)."""

    def __init__(self, run_dir: str, name: str):
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(os.path.join(run_dir, "tensorboard", name))

    def write(self, rows: list[list]) -> None:
        for row in rows:
            r = dict(zip(STEP_COLUMNS, row))
            for col in SCALARS:
                self._w.add_scalar(f"gpuscope/{col[:-3]}_ms", r[col] / MS, r["step"])

    def write_memory(self, m: dict) -> None:
        """A memory sample (record/memory.py): MiB at the window's last step."""
        for step, rss in zip(m.get("steps", []), m.get("rss_bytes", [])):
            self._w.add_scalar("gpuscope/memory_resident_mib", rss / 2**20, step)
        dev = m.get("device") or []
        for w in dev if dev and isinstance(dev[0], list) else [dev] if dev else []:
            self._w.add_scalar("gpuscope/memory_device_peak_mib", w[2] / 2**20, w[1])
            self._w.add_scalar("gpuscope/memory_device_reserved_mib", w[3] / 2**20, w[1])

    def close(self) -> None:
        self._w.close()


class BackgroundScalars:
    """A ScalarWriter on its own daemon thread, fed through a queue: importing
    torch.utils.tensorboard (~100 ms) and writing events stay off the training step.

    `error` holds what stopped the thread, if anything; `close` waits at most `timeout` s."""

    def __init__(self, run_dir: str, name: str):
        self.error: Exception | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(run_dir, name),
                                        name="gpuscope-tensorboard", daemon=True)
        self._thread.start()

    def _run(self, run_dir: str, name: str) -> None:
        writer = None
        try:
            writer = ScalarWriter(run_dir, name)
            while (rows := self._queue.get()) is not None:
                if isinstance(rows, tuple) and rows[0] == "memory":
                    writer.write_memory(rows[1])
                else:
                    writer.write(rows)
        except Exception as exc:
            self.error = exc
        finally:
            if writer is not None:
                try:
                    writer.close()
                except Exception as exc:
                    self.error = self.error or exc

    def write(self, rows) -> None:
        """Step rows (a list), or ("memory", a memory sample)."""
        self._queue.put(rows)

    def close(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
