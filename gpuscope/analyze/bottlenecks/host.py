"""Host-bound: the GPU idles waiting for the host to launch work (GPU traces). Suggestions:
CUDA graphs / torch.compile, fewer small kernels, with their estimate.
"""

from __future__ import annotations

import numpy as np

from ...results import Suggestion
from ...vocab import HOST, MS
from ..findings import TypicalStep, gain


LABEL = HOST


def share(steps, th):
    """The evidence, per step: the share the GPU idled waiting for launches (GPU traces) where
    it is host-bound (at least th.host), else -1."""
    s = steps["host_share"].to_numpy()
    return np.where(s >= th.host, s, -1.0)

#: why no launch-overhead fix is suggested where the step holds no GPU work
NO_KERNELS = ("the step holds no GPU kernel: its work runs on the host (maths on CPU tensors: CPU "
              "ops with no kernel under them), which fewer or fused launches cannot shorten; move "
              "the model and its tensors to the GPU (.to('cuda')) and measure the change "
              "(gpuscope try): what the same maths takes on the GPU is not in this trace")


def no_gpu_work(t: TypicalStep) -> bool:
    """Whether the GPU ran nothing in the step: no compute or communication kernel, and idle
    (host) all of the step but its data wait; a copy or memset (device-to-host syncs) is work."""
    return t.compute <= 0 and t.transfer <= 0 and t.wait <= 0 and \
        t.host >= NO_WORK_SHARE * (t.step - t.data)


#: the GPU idle this share of the step (its data wait aside) and no kernel: it ran nothing
NO_WORK_SHARE = 0.99


def suggest_host(t: TypicalStep) -> tuple[list[Suggestion], str]:
    """The GPU waits for the host to launch work: fewer, larger launches. How many of the idle
    gaps a change closes depends on what the host does in them (launches CUDA graphs replay,
    a host sync they do not remove): the estimate promises half of them, what the evidence
    supports; all of them is the range's other end. Where the step holds no kernel at all
    there is nothing to launch faster: no suggestion, and why (the estimate's range would
    start at a step of 0 ms)."""
    if t.host <= 0:
        return [], ""
    if no_gpu_work(t):
        return [], NO_KERNELS
    est = t.step - 0.5 * t.host
    return [Suggestion(
        "host_overhead", f"GPU idle {t.host / MS:.1f} ms per step waiting for launches",
        "CUDA graphs / torch.compile", est / MS,
        f"the GPU sits idle {t.host / MS:.1f} ms of each {t.step / MS:.1f} ms step after a kernel "
        "ends and before the host has launched the next: capture the step in CUDA graphs "
        "(torch.compile(mode='reduce-overhead')) or fuse kernels with torch.compile, remove host "
        "syncs from the loop (.item(), .cpu(), printing tensors), or give each launch more work "
        "(a larger batch); assumes half of the idle gaps close (range: all of them)", HOST,
        gain(t.step, est), ((t.step - t.host) / MS, est / MS))], ""
