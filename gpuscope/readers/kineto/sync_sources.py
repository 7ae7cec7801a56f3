"""Where a rank's host syncs come from: the op the code called (its outermost aten op: aten::to,
aten::item), the Python call (Tensor.cpu(), Tensor.item()) and the code's own frame, where the
trace recorded Python stacks (with_stack=True), so the fix can name the line to change."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from .events import CPU_OP, PYTHON_OP, RankEvents

#: the syncs looked at per rank, evenly spaced (each costs a pass over its thread's ops)
SAMPLE = 32

_BUILTIN = re.compile(r"<built-in method (\w+) of (\w+) object")
_FRAME = re.compile(r"^(?P<file>[^()<>]+\.py)\((?P<line>\d+)\): (?P<func>.+)$")
#: frames of the libraries, not of the code that called them
_LIBRARY = ("torch/", "site-packages/", "dist-packages/", "lib/python", "<frozen")


def _call(name: str) -> str:
    """"Tensor.cpu()" from "<built-in method cpu of Tensor object at 0x...>", "" else."""
    m = _BUILTIN.match(name)
    return f"{m.group(2)}.{m.group(1)}()" if m else ""


def _own_frame(name: str) -> bool:
    m = _FRAME.match(name)
    return bool(m) and not any(x in m.group("file") for x in _LIBRARY)


def sync_sources(ev: RankEvents) -> Counter:
    """{source: syncs} over the rank's sync calls (a sample of SAMPLE, counts scaled to all):
    "Tensor.cpu() (aten::to) in first_sum.py(13): <module>", or what of it the trace holds
    ("aten::item" without Python stacks; "cudaDeviceSynchronize outside any op"))."""
    at = np.flatnonzero(ev.sync_point)
    if not at.size or not ev.sync_tid.size:
        return Counter()
    picked = at[np.linspace(0, at.size - 1, min(SAMPLE, at.size)).round().astype(int)]
    scale = at.size / picked.size
    kinds = (ev.host_op == CPU_OP) | (ev.host_op == PYTHON_OP)
    out: Counter = Counter()
    threads: dict = {}  # per thread: its ops' (start, end, kind, name), looked at once
    for i in picked.tolist():
        s, e, tid = ev.sync_start[i], ev.sync_end[i], int(ev.sync_tid[i])
        if tid not in threads:
            mine = np.flatnonzero(kinds & (ev.host_tid == tid))
            threads[tid] = (ev.host_start[mine], ev.host_end[mine], ev.host_op[mine],
                            ev.host_name[mine])
        start, end, op, name = threads[tid]
        holds = np.flatnonzero((start <= s) & (end >= e))
        holds = holds[np.argsort(-start[holds], kind="stable")]  # innermost first
        py_names = [ev.names[n] for n in name[holds[op[holds] == PYTHON_OP]]]
        ops = holds[op[holds] == CPU_OP]
        parts = []
        call = next((c for c in map(_call, py_names) if c), "")
        if call:
            parts.append(call)
        if ops.size:  # the outermost aten op: what the code called
            parts.append(f"({ev.names[name[ops[-1]]]})" if call else ev.names[name[ops[-1]]])
        own = next((n for n in py_names if _own_frame(n)), "")
        if own:
            parts.append(f"in {own}")
        out[" ".join(parts) or f"{ev.names[ev.sync_name[i]]} outside any op"] += scale
    return out
