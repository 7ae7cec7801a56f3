"""Reads the settings the suggestions are about from a DataLoader, a model and the process."""

from __future__ import annotations

import os
import sys


def loader_knobs(loader) -> dict:
    """DataLoader settings; attributes a plain iterable lacks are simply absent. `dataloader`
    says whether it is a torch DataLoader (worker processes are a knob only there)."""
    names = [c.__name__ for c in type(loader).__mro__]
    out: dict = {"loader": type(loader).__name__,
                 "dataloader": any("DataLoader" in n for n in names)}  # torch's, or a wrapper
    for attr in ("batch_size", "num_workers", "pin_memory", "prefetch_factor",
                 "persistent_workers", "drop_last"):
        if hasattr(loader, attr):
            value = getattr(loader, attr)
            if value is None or isinstance(value, (bool, int, float, str)):
                out[attr] = value
    if out.get("batch_size") is None:
        bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if isinstance(bs, int):
            out["batch_size"] = bs
    try:
        out["batches_per_epoch"] = len(loader)
    except Exception:
        pass
    return out


def _tensors(batch, limit: int = 32):
    """Tensor-like things in a batch (a tensor, or nested sequences / mappings), breadth first."""
    seen = 0
    stack = [batch]
    while stack and seen < limit:
        item = stack.pop(0)
        seen += 1
        shape = getattr(item, "shape", None)
        if shape is not None:
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def batch_size_of(batch) -> int | None:
    """Leading dimension of the first tensor-like thing in a batch, if any."""
    shape = getattr(batch, "shape", None)  # a tensor or array itself: the common case, quickly
    if shape is not None and hasattr(batch, "dtype"):
        try:
            return int(shape[0]) if len(shape) > 0 else None
        except Exception:
            pass
    kind = type(batch)  # a DataLoader's [inputs, targets] or a dict of tensors: its first,
    if kind is list or kind is tuple or kind is dict:  # as _tensors finds it, without the walk
        first = (batch[0] if kind is not dict else next(iter(batch.values()))) if batch else None
        shape = getattr(first, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    for t in _tensors(batch):
        if len(t.shape) > 0:
            return int(t.shape[0])
    return None


def batch_knobs(batch, want_size: bool = True) -> dict:
    """The batch's size (leading dimension) and bytes, from the first batch seen."""
    out: dict = {}
    if want_size:
        size = batch_size_of(batch)
        if size is not None:
            out["batch_size"] = size
    nbytes = 0
    for t in _tensors(batch):
        try:
            nbytes += int(t.numel()) * int(t.element_size())
            if "tokens_per_sample" not in out and _token_ids(t):
                out["tokens_per_sample"] = int(t.shape[1])
        except Exception:
            pass
    if nbytes:
        out["batch_bytes"] = nbytes
    return out


def _token_ids(t) -> bool:
    """A (batch, sequence) tensor of integer ids: token inputs (padding included)."""
    dtype = getattr(t, "dtype", None)
    return (len(t.shape) == 2 and dtype is not None and not dtype.is_floating_point
            and not dtype.is_complex and str(dtype) != "torch.bool")


def model_knobs(model) -> dict:
    out: dict = {"model": type(model).__name__}
    stage = getattr(model, "stage_index", None)
    if isinstance(stage, int) and hasattr(model, "submod"):  # a pipelining PipelineStage
        out["pipeline_stage"] = stage
        out["pipeline_stages"] = getattr(model, "num_stages", None)
        model = model.submod
    out["layers"] = layer_params(model)
    if type(model).__name__ == "DataParallel":
        out["parallel"] = "DataParallel"
        out["dp_devices"] = [str(d) for d in getattr(model, "device_ids", []) or []]
    try:
        params = list(model.parameters())
        out["params"] = int(sum(p.numel() for p in params))
        out["param_bytes"] = int(sum(p.numel() * p.element_size() for p in params))
        if params:
            out["device"] = str(params[0].device)
            out["param_dtype"] = str(params[0].dtype).replace("torch.", "")
    except Exception:
        pass
    from .ddp_timing import inner_ddp

    ddp = inner_ddp(model)  # DDP's settings, where a wrapper (Lightning Fabric's) holds it
    if ddp is not None and ddp is not model:
        out["wrapper"] = out["model"]
        out["model"] = type(ddp).__name__
        model = ddp
    for attr, key in (("bucket_bytes_cap", "bucket_cap_bytes"),
                      ("find_unused_parameters", "find_unused_parameters"),
                      ("gradient_as_bucket_view", "gradient_as_bucket_view"),
                      ("static_graph", "static_graph"),
                      ("broadcast_buffers", "broadcast_buffers")):
        value = getattr(model, attr, None)
        if isinstance(value, (bool, int)):
            out[key] = value
    pg = getattr(model, "process_group", None)
    if pg is not None:
        try:
            out["backend"] = str(pg.name()) if hasattr(pg, "name") else None
        except Exception:
            pass
    return out


def layer_params(model, limit: int = 256) -> list:
    """[name, parameters] of the model's top-level children that hold parameters (what a
    pipeline repartition would move)."""
    out = []
    try:
        inner = getattr(model, "module", model)  # under DDP / DataParallel
        for name, child in list(inner.named_children())[:limit]:
            n = sum(p.numel() for p in child.parameters())
            if n:
                out.append([name, int(n)])
    except Exception:
        pass
    return out


def process_knobs(local_world_size: int) -> dict:
    torch = sys.modules.get("torch")
    out: dict = {"cpu_count": os.cpu_count() or 1, "local_world_size": local_world_size,
                 "python": sys.version.split()[0]}
    try:
        out["cpus_available"] = len(os.sched_getaffinity(0))
    except Exception:
        out["cpus_available"] = out["cpu_count"]
    try:  # the host's other work: what shares its cores with the ranks (1-minute average)
        out["load_avg"] = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        pass
    if torch is not None:
        out["torch"] = getattr(torch, "__version__", None)
        try:
            out["torch_threads"] = torch.get_num_threads()
            out["cuda_available"] = bool(torch.cuda.is_available())
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                out["backend"] = str(torch.distributed.get_backend())
        except Exception:
            pass
    return out


def mesh_dims(model, group_name, limit: int = 4096) -> dict:
    """{process group name: mesh dimension name} of the DeviceMeshes the model's DTensor
    parameters live on (FSDP2 over `dp`, tensor parallel over `tp`, ...); {} without DTensors
    or names. `group_name`: how collectives.py names a group."""
    out: dict = {}
    seen = set()
    try:
        for i, p in enumerate(model.parameters()):
            if i >= limit:
                break
            mesh = getattr(p, "device_mesh", None)
            if mesh is None or id(mesh) in seen:
                continue
            seen.add(id(mesh))
            names = getattr(mesh, "mesh_dim_names", None) or ()
            for dim, name in enumerate(names):
                try:
                    out[group_name(mesh.get_group(dim))] = str(name)
                except Exception:
                    continue
    except Exception:
        return out
    return out
