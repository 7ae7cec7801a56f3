"""What a torch.profiler trace does not hold and the recorder knows (CPU cores per rank, how much
of loading uses the CPU, the loader's settings), written into the trace of a profiler that
records beside gpuscope.record, as one flat JSON object under the trace's top-level key
"gpuscope" (torch.profiler's own metadata mechanism): the trace's report then reads these
facts instead of assuming them, and gives the same fix as the record's.

A profiler without gpuscope.record can carry the host's part too:
`prof.add_metadata_json("gpuscope", gpuscope.host_facts())`.
"""

from __future__ import annotations

import json
import sys

from ..run_format import STEP_COLUMNS
from .knobs import process_knobs
from .sinks import Sink

KEY = "gpuscope"
#: the knobs a trace's suggestions need and cannot read from the trace itself (batch_bytes: what
#: handing a batch over from a worker costs grows with it)
FACT_KNOBS = ("cpu_count", "cpus_available", "local_world_size", "num_workers", "pin_memory",
              "prefetch_factor", "persistent_workers", "batches_per_epoch", "batch_size",
              "batch_bytes", "dataloader")


_DATA, _DATA_CPU = STEP_COLUMNS.index("data_ns"), STEP_COLUMNS.index("data_cpu_ns")


def loading(rows: list) -> tuple[int, int]:
    """(data wait, the training thread's CPU in it) summed over the rows whose CPU was read."""
    known = [row for row in rows if row[_DATA_CPU] >= 0]
    return sum(row[_DATA] for row in known), sum(row[_DATA_CPU] for row in known)


class ProfilerWatch(Sink):
    """Listens at each step's end while the recording runs: while a torch.profiler records, its
    trace is told the facts it cannot hold (`tell`), and the record keeps the windows of steps
    the traces hold (knob profiled_steps); the step after a recording stopped is the one the
    profiler wrote its trace in (knob profiler_trace_steps), so the analysis leaves out what the
    profiler cost, not the training. `pending()`: the rows of the steps not flushed yet."""

    name, off, listens = "profiler watch", "facts not added to the profiler's trace", True

    def __init__(self, probe, knobs: dict, note, pending):
        self.probe, self.knobs, self.note, self.pending = probe, knobs, note, pending
        self.was = False           # a profiler recorded as the previous step closed
        self.trace_steps: list = []  # steps in which a profiler wrote its trace
        self.windows: list = []    # [first, last] windows of steps a profiler recorded
        self.data_ns = self.data_cpu_ns = 0  # the flushed steps' data wait, its CPU (read)

    def rows(self, built) -> None:
        data, cpu = loading(built.rows)
        self.data_ns += data
        self.data_cpu_ns += cpu

    def step_end(self, step: int) -> None:
        on = self.probe()
        if on:
            data, cpu = loading(self.pending())
            tell(facts(self.knobs, self.data_ns + data, self.data_cpu_ns + cpu))
            self._profiled(step)
        elif self.was:
            if self.windows:  # the window as it closed
                self.note({"profiled_steps": [list(w) for w in self.windows]})
            self.trace_steps.append(step)
            self.note({"profiler_trace_steps": list(self.trace_steps[-64:])})
        self.was = on

    def _profiled(self, step: int) -> None:
        """Step `step` closed while a profiler recorded: both sources can then be read over the
        same steps (`gpuscope analyze RUN --steps A-B`); a knob line when a window opens or
        closes, not every step."""
        wins = self.windows
        if wins and wins[-1][1] == step - 1:
            wins[-1][1] = step
            if step % 16:  # the window grows: said again at most every 16 steps
                return
        else:
            wins.append([step, step])
            del wins[:-64]
        self.note({"profiled_steps": [list(w) for w in wins]})


def profiling_probe():
    """torch's "is a profiler recording now" (a C call, ~50 ns), None without torch."""
    torch = sys.modules.get("torch")
    try:
        return torch._C._autograd._profiler_enabled
    except Exception:
        return None


def facts(knobs: dict, data_ns: int = 0, data_cpu_ns: int = 0) -> str:
    """The facts as the trace keeps them: scalars only (a flat object)."""
    out = {k: knobs[k] for k in FACT_KNOBS
           if k in knobs and isinstance(knobs[k], (bool, int, float, str))}
    if data_ns > 0:
        out["data_cpu_share"] = round(min(max(data_cpu_ns, 0) / data_ns, 1.0), 4)
    return json.dumps(out)


def tell(text: str) -> None:
    """Into the trace the profiler records now."""
    import torch.autograd

    torch.autograd._add_metadata_json(KEY, text)


def host_facts() -> str:
    """This process's CPU cores and the ranks of its host, for
    `prof.add_metadata_json("gpuscope", gpuscope.host_facts())` in a training that profiles
    without gpuscope.record."""
    import os

    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return facts(process_knobs(int(local) if local.isdigit() else 1))
