"""Host-bound: the GPU idles waiting for the host to launch work (GPU traces). Suggestions,
by cause: the host's syncs removed or batched where it blocks in them; else CUDA graphs /
torch.compile, fewer small kernels; none where the GPU ran nothing; each with its estimate.
"""

from __future__ import annotations

import numpy as np

from ...results import Suggestion
from ...vocab import HOST, MS
from ..findings import Findings, TypicalStep, gain
from ..rowgroups import Groups
from .spec import Bottleneck


LABEL = HOST


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


#: the GPU idle after the host's syncs this share of the step or more, and this share of its
#: idle waiting for the host: the syncs are a cause of the step's host-bound time
SYNC_SHARE = 0.05
SYNC_SHARE_OF_HOST = 0.25


def syncs_matter(t: TypicalStep) -> bool:
    """Whether the step's syncs are a cause of its host-bound time: at least one a step, the
    GPU idle after them (until the host launched again) a material part of its idle time (a
    host that waits on a busy GPU, then launches at once, costs nothing), and what removing
    them saves (suggest_syncs) a material part of the step."""
    return t.syncs >= 1 and t.sync_idle >= SYNC_SHARE_OF_HOST * t.host and \
        min(t.sync, t.sync_idle) >= SYNC_SHARE * t.step


#: one rank holds this share of the GPU idle after syncs, summed over ranks: the syncs are its
WHOSE_SHARE = 0.8


def whose_syncs(frame) -> str:
    """"mostly on rank R (N a step; the others M)" where one rank of several holds most of
    the GPU idle after syncs (a rank that spins on cudaDeviceSynchronize), else ""."""
    if "sync_idle_ns" not in frame:
        return ""
    g = Groups(frame["rank"].to_numpy())
    idle, syncs = (g.mean(frame[c].to_numpy(np.float64)) for c in ("sync_idle_ns", "syncs"))
    if g.keys.size < 2 or idle.sum() <= 0 or idle.max() < WHOSE_SHARE * idle.sum():
        return ""
    i = int(idle.argmax())
    rest = np.delete(syncs, i).mean()
    return f"mostly on rank {g.keys[i]} ({syncs[i]:,.0f} a step; the others {rest:,.0f})"


def sync_sources(ranks) -> dict:
    """{source: syncs} summed over the ranks' infos (the Kineto reader's meta, per rank)."""
    out: dict = {}
    for info in ranks:
        for k, n in (info.meta.get("sync_sources") or {}).items():
            out[k] = out.get(k, 0) + n
    return out


#: a source named alone holds this share of the syncs; else the two largest with their shares
SOURCE_SHARE = 0.5


def from_where(sources: dict) -> str:
    """"from Tensor.cpu() (aten::to) in sum.py(4): first_sum" where one source holds most of
    the syncs (the op the code called and its own frame, where the trace recorded them), the
    two largest with their shares where none does, "" without sources."""
    total = sum(sources.values())
    if total <= 0:
        return ""
    top = sorted(sources.items(), key=lambda kv: -kv[1])
    if top[0][1] >= SOURCE_SHARE * total:
        return f"from {top[0][0]}" + ("" if len(top) == 1 else f" ({top[0][1] / total:.0%})")
    return "from " + " and ".join(f"{k} ({n / total:.0%})" for k, n in top[:2])


def suggest_syncs(t: TypicalStep, where: str = "") -> Suggestion:
    """Remove or batch the step's syncs: each drains the GPU's queue, so the host cannot run
    ahead of it. That saves no more than the host's time blocked in them (its other work stays)
    and no more than the GPU's idle after them, and the step is never shorter than the GPU's
    own busy time; where the work between the syncs goes too (the maths kept on the GPU, one
    copy at the end) the step may fall to the GPU's busy time: the range's other end."""
    busy_gpu = gpu_busy(t)
    est = max(t.step - min(t.sync, t.sync_idle, t.host), busy_gpu)
    n = f"{t.syncs:,.0f} sync" + ("" if round(t.syncs) == 1 else "s")
    where = f", {where}" if where else ""
    return Suggestion(
        "host_syncs", f"{n} per step{where}, the GPU idle {t.sync_idle / MS:.1f} ms after them",
        "remove or batch them", est / MS,
        f"{t.syncs:,.0f} times a step the host waits for the GPU to finish its queue (.item(), "
        f".cpu(), .tolist() or printing a GPU tensor, torch.cuda.synchronize(), a blocking "
        f"copy): {t.sync / MS:.1f} ms of each {t.step / MS:.1f} ms step in those calls and their "
        f"copies, then the GPU idles {t.sync_idle / MS:.1f} ms until the host launches again, "
        "where it could have queued work ahead: keep values on the GPU (sum or log tensors, "
        "read them once every N steps), copy with non_blocking=True into pinned memory, take "
        "one .cpu() of a whole tensor instead of one per element; assumes the host's other "
        "work stays (the range's other end: it goes too, down to the GPU's own busy time)",
        HOST, gain(t.step, est), (max(t.step - t.host, busy_gpu) / MS, est / MS))


#: launches a step from which the GPU's idle is read as gaps between them (with fewer, one
#: long gap is not a launch's delay)
LAUNCHES_MIN = 20


def gpu_busy(t: TypicalStep) -> float:
    """The GPU's own busy time in the step (its work, not its wait on the host or for data):
    no fix of the host's time takes the step below it."""
    return max(t.step - t.host - t.data, t.compute + t.transfer, 1.0)


#: the GPU idle while the host ran maths on CPU tensors: this share of its idle waiting for the
#: host and of the step, and moving those tensors is a fix of its own
CPU_MATH_SHARE, CPU_MATH_SHARE_OF_HOST = 0.05, 0.25


def cpu_math_matters(t: TypicalStep) -> bool:
    """Whether the training thread's maths on CPU tensors is a cause of the step's host-bound
    time: the GPU's idle while it ran a material part of its idle and of the step."""
    return t.cpu_math >= CPU_MATH_SHARE_OF_HOST * t.host and t.cpu_math >= CPU_MATH_SHARE * t.step


def suggest_cpu_maths(t: TypicalStep) -> Suggestion:
    """Move the maths that runs on CPU tensors to the GPU: the GPU idles while the training
    thread computes it. What the same maths takes on the GPU is not in the trace: the estimate
    promises half of that idle back (the range's low end: all of it, never below the GPU's own
    busy time)."""
    busy_gpu = gpu_busy(t)
    est = max(t.step - 0.5 * t.cpu_math, busy_gpu)
    return Suggestion(
        "cpu_maths", f"GPU idle {t.cpu_math / MS:.1f} ms per step while the training thread "
        "computes on CPU tensors", "move those tensors to the GPU", est / MS,
        f"in {t.cpu_math / MS:.1f} ms of each {t.step / MS:.1f} ms step the training thread runs "
        "aten ops on CPU tensors (ops that launch no kernel: maths, not views) while the GPU has "
        "nothing queued: create those tensors on the GPU (device='cuda', or .to('cuda') once, "
        "outside the loop), or keep metrics as GPU tensors; what the same maths takes on the GPU "
        "is not in the trace: assumes half of that idle closes (range: all of it)", HOST,
        gain(t.step, est), (max(t.step - t.cpu_math, busy_gpu) / MS, est / MS))


def launch_gaps(t: TypicalStep) -> str:
    """", 62 launches a step: 31 us of GPU work each against 137 us idle waiting for the next"
    (the queue drained: a launch takes longer to come than its kernel to run), "" where the
    trace gives no launch count or fewer than LAUNCHES_MIN."""
    if t.launches < LAUNCHES_MIN:
        return ""
    busy = max(t.step - t.host - t.data, 0.0) / t.launches
    gap = t.host / t.launches
    return (f", {t.launches:,.0f} launches a step: {busy / 1e3:,.0f} us of GPU work each against "
            f"{gap / 1e3:,.0f} us idle waiting for the next")


#: the GPU's idle while the host ran no torch op, as a share of the idle that launching
#: faster can close, from which the report names it apart; past OUTSIDE_OPS_LEADS it leads the
#: advice
OUTSIDE_OPS_SHARE = 0.1
OUTSIDE_OPS_LEADS = 0.5
#: what the host does outside torch ops, as far as a trace can tell
OUTSIDE_OPS = "ran no torch op (its Python, or work the trace does not hold)"
#: the launch fix where the idle is mostly inside ops (dispatch and launch)
LAUNCH_FIX = ("capture the step in CUDA graphs (torch.compile(mode='reduce-overhead')) or fuse "
              "kernels with torch.compile, remove host syncs from the loop (.item(), .cpu(), "
              "printing tensors), or give each launch more work (a larger batch)")


def outside_ops_part(t: TypicalStep, gaps: float) -> str:
    """"; of it 3.1 ms while the host ran no torch op (...), 1.2 ms inside ops (dispatch and
    launch)" where the trace tells it (GPU traces with torch ops) and it is OUTSIDE_OPS_SHARE
    of `gaps` or more."""
    if gaps <= 0 or t.python < OUTSIDE_OPS_SHARE * gaps:
        return ""
    inside = max(gaps - t.python, 0.0)
    return (f"; of it {t.python / MS:.1f} ms while the host {OUTSIDE_OPS}, {inside / MS:.1f} ms "
            "inside ops (dispatch and launch)")


def host_fix(t: TypicalStep, gaps: float) -> str:
    """What closes the idle gaps: where the host mostly ran no torch op in them, moving that
    work out of the loop or capturing the step (not fusing kernels); else LAUNCH_FIX."""
    if gaps <= 0 or t.python < OUTSIDE_OPS_LEADS * gaps:
        return LAUNCH_FIX
    return (f"{t.python / MS:.1f} ms of it the host {OUTSIDE_OPS}: move per-step Python work "
            "(logging, metrics, loops over tensors) out of the loop, or capture the step in CUDA "
            "graphs (torch.compile(mode='reduce-overhead')), which replays its kernels without "
            "the Python between them; fusing kernels does not shorten it")


def suggest_host(t: TypicalStep, where: str = "") -> tuple[list[Suggestion], str]:
    """The GPU waits for the host to launch work: fewer, larger launches. How many of the idle
    gaps a change closes depends on what the host does in them (launches CUDA graphs replay,
    a host sync they do not remove): the estimate promises half of them, what the evidence
    supports; all of them is the range's other end. Where the step holds no kernel at all
    there is nothing to launch faster: no suggestion, and why (the estimate's range would
    start at a step of 0 ms). Where the host's syncs are a cause (syncs_matter), removing
    them comes first, and no CUDA-graph advice: a graph cannot capture a sync."""
    if t.host <= 0:
        return [], ""
    if no_gpu_work(t):
        return [], NO_KERNELS
    maths = [suggest_cpu_maths(t)] if cpu_math_matters(t) else []
    if syncs_matter(t):  # `where`: whose syncs they are (whose_syncs)
        return [suggest_syncs(t, where)] + maths, (
            f"no CUDA graphs / torch.compile advice while the step syncs {t.syncs:,.0f} times: "
            "a CUDA graph cannot capture a sync; remove the syncs first, then measure again")
    gaps = t.host - (t.cpu_math if maths else 0.0)  # what launching faster can close
    est = t.step - 0.5 * gaps
    return maths + [Suggestion(
        "host_overhead", f"GPU idle {gaps / MS:.1f} ms per step waiting for launches"
        + launch_gaps(t) + outside_ops_part(t, gaps),
        "CUDA graphs / torch.compile", est / MS,
        f"the GPU sits idle {gaps / MS:.1f} ms of each {t.step / MS:.1f} ms step after a kernel "
        "ends and before the host has launched the next" + (
            " (besides its idle in the maths on CPU tensors)" if maths else "")
        + f": {host_fix(t, gaps)}; assumes half of the idle gaps close (range: all of them)", HOST,
        gain(t.step, est), ((t.step - gaps) / MS, est / MS))], ""


def suggest(found: Findings, t: TypicalStep) -> tuple[list[Suggestion], str]:
    """suggest_host from the findings, its syncs said with whose they are."""
    where = ", ".join(x for x in (from_where(found.sync_sources), whose_syncs(found.frame)) if x)
    return suggest_host(t, where)


SPEC = Bottleneck(LABEL, "host_share", "host", "the GPU's wait on the host", lambda t, _: t.host,
                  lambda found: LABEL in found.labels, suggest)
