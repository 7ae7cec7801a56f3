"""What a JSON file that is not a torch.profiler trace looks like, in words: said when gpuscope
refuses it, with what it reads instead. Read from the file's first bytes only."""

from __future__ import annotations

import re

HEAD_BYTES = 1 << 18

#: what gpuscope reads, said after every refusal
READS = ("gpuscope reads torch.profiler traces (tensorboard_trace_handler's *.pt.trace.json, or "
         "export_chrome_trace) and gpuscope.record run dirs")

#: (pattern in the head, what the file is), first match wins
_KINDS = (
    (rb'"(?:device_traces|segments)"\s*:', "a CUDA memory snapshot "
     "(torch.cuda.memory._snapshot), not a timeline of steps"),
    (rb'^\s*\[\s*\[\s*[\d.]+\s*,', "a memory timeline (export_memory_timeline's JSON: times and "
     "bytes by category), not a trace"),
    (rb'/device:(?:GPU|TPU|CPU):\d|"XLA |xla_|tensorflow', "a TensorFlow / JAX (XLA) profiler "
     "trace"),
    (rb'NVTX|nsys|"CUPTI_ACTIVITY|Nsight', "an Nsight Systems export"),
    (rb'"traceEvents"', "a Chrome trace-event file written by another tool (no ProfilerStep#, no "
     "torch op, no GPU kernel, none of torch.profiler's categories)"),
    (rb'^\s*\[\s*\{[^\]]{0,400}"ph"\s*:', "a Chrome trace-event array written by another tool "
     "(torch.profiler writes an object with 'traceEvents')"),
)


def looks_like(path: str) -> str:
    """One line: what the file seems to be, and what gpuscope reads instead."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        head = b""
    if head[:2] == b"\x1f\x8b":
        import gzip
        import zlib

        try:
            head = zlib.decompressobj(31).decompress(head, HEAD_BYTES)
        except (zlib.error, gzip.BadGzipFile):
            head = b""
    what = next((w for pat, w in _KINDS if re.search(pat, head, re.MULTILINE)), None)
    if what is None:
        what = "JSON without 'traceEvents'" if head.lstrip()[:1] in (b"{", b"[") else \
            "not JSON"
    return f"{path}: {what}: not a torch.profiler trace; {READS}"
