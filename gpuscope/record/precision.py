"""The precision a model's maths runs in, for MFU's peak: read once, from inside its forward.

A device's peak depends on the dtype its matrix units run: on an H100 or H200, 67 TFLOP/s in
fp32, 495 in TF32, 989 in bf16 / fp16 (dense). What decides it is not the parameters' dtype
alone: `torch.autocast` casts a matmul's inputs to its own dtype, and an fp32 matmul runs in
TF32 where torch allows it (`torch.set_float32_matmul_precision("high")`, or
`torch.backends.cuda.matmul.allow_tf32 = True`). Autocast is a context the loop enters around its
forward, so it is read where only the forward runs: a forward pre-hook on the model, kept for
`READ_AT` calls and then removed (a module without hooks goes back to torch's fast call path;
the recorder's step path is untouched). Knobs written: `autocast_dtype` ("bfloat16", "float16",
or "off") and `float32_matmul_precision` ("highest", "high", "medium").

`record(count_flops=True)` also tallies the counted micro-step's FLOPs by the dtype each op's
inputs had as it ran (flops.py: `flops_by_dtype`), which is what the analysis prefers.
"""

from __future__ import annotations

#: the forward call read: the first may run outside the loop's autocast (a dry run, a summary)
READ_AT = 2


def precision_knobs(device_type: str) -> dict:
    """What autocast and the fp32 matmul precision are right now, for `device_type`."""
    import torch

    try:
        on = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        on = torch.is_autocast_enabled() if device_type == "cuda" else \
            torch.is_autocast_cpu_enabled()
    out = {"float32_matmul_precision": str(torch.get_float32_matmul_precision())}
    if not on:
        out["autocast_dtype"] = "off"
        return out
    try:
        dtype = torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):  # torch < 2.4
        dtype = torch.get_autocast_gpu_dtype() if device_type == "cuda" else \
            torch.get_autocast_cpu_dtype()
    out["autocast_dtype"] = str(dtype).replace("torch.", "")
    return out


class PrecisionProbe:
    """A forward pre-hook on `module` that reads precision_knobs on the READ_AT-th call, hands
    them to `note`, and removes itself; `remove()` takes it out earlier."""

    def __init__(self, module, device_type: str, note):
        self.device_type = device_type
        self.note = note
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.calls += 1
        if self.calls >= READ_AT:
            self.remove()
            try:
                self.note(precision_knobs(self.device_type))
            except Exception:  # a torch without these functions: the dtype stays unknown
                pass
        return None

    def remove(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass
