"""The training thread's maths on CPU tensors in a GPU trace: its leaf aten ops that made no
runtime call (no kernel launched, no copy), views and allocations aside. While they run the GPU
gets no work from that thread: the time it idles in them is the host's CPU maths (issue 70),
whose fix is to move those tensors to the GPU, not to launch faster."""

from __future__ import annotations

import numpy as np

from .events import CPU_OP, OP, RankEvents

#: aten ops that compute nothing (views, shapes, allocations, conversions to Python): host work
#: of the framework, not maths, wherever their tensors live
NOT_MATHS = frozenset({
    "aten::select", "aten::slice", "aten::view", "aten::_unsafe_view", "aten::as_strided",
    "aten::reshape", "aten::_reshape_alias", "aten::expand", "aten::expand_as", "aten::t",
    "aten::transpose", "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::detach",
    "detach", "aten::detach_", "aten::alias", "aten::empty", "aten::empty_strided",
    "aten::empty_like", "aten::resize_", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::contiguous", "aten::item", "aten::_local_scalar_dense",
    "aten::is_nonzero", "aten::numel", "aten::size", "aten::stride", "aten::flatten",
    "aten::unbind", "aten::split", "aten::chunk", "aten::narrow", "aten::unflatten",
    "aten::to", "aten::_to_copy", "aten::set_", "aten::result_type", "aten::is_same_size",
    "aten::_has_compatible_shallow_copy_type", "aten::_to_dense", "aten::record_stream"})


def cpu_maths(ev: RankEvents, leaves: np.ndarray) -> np.ndarray:
    """Mask of the host events that are maths on CPU tensors: `leaves` (the training thread's
    ops with no op inside, steps.leaf_ops) that are aten ops, compute something (NOT_MATHS
    aside) and hold no runtime call of their thread (a launch, a copy, a sync)."""
    sel = leaves & (ev.host_kind == OP) & (ev.host_op == CPU_OP)
    idx = np.flatnonzero(sel)
    if not idx.size:
        return sel
    if ev.names:  # decided once per distinct name, not per event
        not_maths = np.array([n in NOT_MATHS for n in ev.names], dtype=bool)
        idx = idx[~not_maths[ev.host_name[idx]]]
    thread = ev.host_tid[idx[0]] if idx.size else 0
    calls = np.sort(np.concatenate([ev.launch_ts[ev.launch_tid == thread],
                                    ev.sync_start[ev.sync_tid == thread]]))
    inside = (np.searchsorted(calls, ev.host_end[idx], "left")
              - np.searchsorted(calls, ev.host_start[idx], "left"))
    out = np.zeros_like(sel)
    out[idx[inside == 0]] = True
    return out
