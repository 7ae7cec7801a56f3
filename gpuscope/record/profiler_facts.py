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

from .knobs import process_knobs

KEY = "gpuscope"
#: the knobs a trace's suggestions need and cannot read from the trace itself (batch_bytes: what
#: handing a batch over from a worker costs grows with it)
KNOBS = ("cpu_count", "cpus_available", "local_world_size", "num_workers", "pin_memory",
         "prefetch_factor", "persistent_workers", "batches_per_epoch", "batch_size",
         "batch_bytes", "dataloader")


def profiling_probe():
    """torch's "is a profiler recording now" (a C call, ~50 ns), None without torch."""
    torch = sys.modules.get("torch")
    try:
        return torch._C._autograd._profiler_enabled
    except Exception:
        return None


def facts(knobs: dict, data_ns: int = 0, data_cpu_ns: int = 0) -> str:
    """The facts as the trace keeps them: scalars only (a flat object)."""
    out = {k: knobs[k] for k in KNOBS
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
