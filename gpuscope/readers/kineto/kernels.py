"""Which device kernels are communication: one table of kernel families, matched by name.

A family is (name, what it is, the name patterns that identify it); a kernel is communication
when its name matches a family. A kernel whose name only *looks* like communication (a collective
word such as "all_reduce" in it) but matches no family is counted as communication too, and the
reader names it in a warning, so a new library shows up instead of passing for compute.
The same table is printed in docs/rules.md ("Communication kernels").
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    what: str
    prefixes: tuple[str, ...] = ()   # the kernel name (less "void ") starts with one of these
    contains: tuple[str, ...] = ()   # or holds one of these (case-sensitive)


#: every family of communication kernels gpuscope knows; order does not matter (disjoint names)
FAMILIES = (
    Family("nccl", "NCCL (and RCCL, which keeps NCCL's kernel names): ncclKernel_* (NCCL < 2.19), "
           "ncclDevKernel_* (NCCL >= 2.19), ncclDevKernel_Generic (RCCL)",
           prefixes=("ncclKernel", "ncclDevKernel", "ncclDevFunc")),
    Family("rccl", "RCCL's own kernels (rccl*)", prefixes=("rccl",)),
    Family("symmetric-memory", "PyTorch symmetric memory (torch.distributed._symmetric_memory): "
           "multimem all-reduce / all-gather, one-shot and two-shot all-reduce, its barriers",
           contains=("multimem_", "one_shot_all_reduce", "two_shot_all_reduce",
                     "symm_mem", "c10d::symmetric_memory")),
    Family("nvshmem", "NVSHMEM device calls and collectives", contains=("nvshmem",)),
    Family("deepep", "DeepEP expert-parallel dispatch / combine", contains=("deep_ep::",)),
    Family("hybridep", "HybridEP expert-parallel dispatch / combine",
           contains=("hybrid_ep::", "hybridep::", "HybridEP")),
    Family("custom-allreduce", "vLLM / SGLang / aiter custom all-reduce and quick all-reduce",
           contains=("cross_device_reduce", "quickreduce::", "allreduce_prototype",
                     "vllm::custom_ar", "custom_all_reduce", "trtllm_allreduce",
                     "allreduce_fusion_kernel", "lamport")),
    Family("mscclpp", "MSCCL++ kernels", prefixes=("mscclpp",), contains=("mscclpp::",)),
    Family("gloo", "gloo kernels on a device (rare: gloo reduces on the host)",
           prefixes=("gloo",)),
)

#: words that make a kernel name look like communication (lower case, "_" removed)
_LOOKS = re.compile(r"allreduce|allgather|reducescatter|alltoall|sendrecv|crossdevice")
#: an expert-parallel library's kernels, in whatever namespace a fork or a vendored copy puts
#: them (DeepEP's public source says deep_ep::; a training's own build may say ep::, moe::,
#: uccl::, pplx::): a namespaced function named for what the library does (lower case, "_" and
#: a "kernel" prefix or suffix removed)
_EP_WORDS = {"dispatch", "combine", "notifydispatch", "notifycombine", "cachednotifydispatch",
             "cachednotifycombine", "cachednotify", "cleanlowlatencybuffer"}


def _ep_like(name: str) -> bool:
    core = _core(name)
    if "::" not in core:
        return False
    last = core.rsplit("::", 1)[-1].lower().replace("_", "")
    last = last[6:] if last.startswith("kernel") else last
    last = last[:-6] if last.endswith("kernel") else last
    return last in _EP_WORDS


def _bare(name: str) -> str:
    """The kernel name without a leading "void " and "(anonymous namespace)::"."""
    name = name[5:] if name.startswith("void ") else name
    return name.replace("(anonymous namespace)::", "")


def _core(name: str) -> str:
    """The function name alone: before its argument list and template arguments."""
    return _bare(name).split("(", 1)[0].split("<", 1)[0]


@functools.lru_cache(maxsize=1 << 14)
def family_of(name: str) -> str | None:
    """The family name of a communication kernel, None for any other kernel."""
    bare = _bare(name)
    for fam in FAMILIES:
        if bare.startswith(fam.prefixes) or any(c in name for c in fam.contains):
            return fam.name
    return None


@functools.lru_cache(maxsize=1 << 14)
def looks_like_comm(name: str) -> bool:
    """A kernel with a collective word in its name that no family claims."""
    if family_of(name) is not None:
        return False
    return bool(_LOOKS.search(_core(name).lower().replace("_", ""))) or _ep_like(name)


def families_table() -> str:
    """The table as Markdown (docs/rules.md shows it)."""
    rows = ["| family | what | name starts with | name contains |", "| --- | --- | --- | --- |"]
    for f in FAMILIES:
        rows.append(f"| {f.name} | {f.what} | {', '.join(f'`{p}`' for p in f.prefixes) or '-'} | "
                    f"{', '.join(f'`{c}`' for c in f.contains) or '-'} |")
    return "\n".join(rows)


#: collective words (lower case, "_" removed) -> the recorder's kind names, most specific first
_KINDS = (("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"),
          ("crossdevicereduce", "all_reduce"), ("quickreduce", "all_reduce"),
          ("allgather", "all_gather"), ("alltoall", "all_to_all"), ("sendrecv", "send_recv"),
          ("broadcast", "broadcast"), ("barrier", "barrier"), ("reduce", "reduce"),
          ("gather", "gather"), ("scatter", "scatter"), ("isend", "send"), ("irecv", "recv"),
          ("send", "send"), ("recv", "recv"),
          # an expert-parallel dispatch or combine moves tokens between ranks: an all-to-all
          ("dispatch", "all_to_all"), ("combine", "all_to_all"), ("notify", "all_to_all"))


@functools.lru_cache(maxsize=1 << 12)
def kind_of(name: str) -> str:
    """The kind of collective (all_reduce, all_gather, ...) named by a collective range
    ("gloo:all_reduce", "nccl:_all_gather_base"), a kernel ("ncclDevKernel_AllGather_RING_LL",
    "multimem_all_reduce_kernel") or a kernel's "Collective name" arg ("allgather_into_tensor");
    "collective" when the name does not say (RCCL's ncclDevKernel_Generic)."""
    bare = _core(name).rsplit(":", 1)[-1].lower().replace("_", "")
    for word, kind in _KINDS:
        if word in bare:
            return kind
    return "collective"
