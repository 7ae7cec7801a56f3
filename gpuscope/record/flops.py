"""FLOPs of one training micro-step, counted once (``record(count_flops=True)``).

torch.utils.flop_counter.FlopCounterMode (a dispatch mode: it sees every op and counts the
matmuls, convolutions and attention; the maths is untouched) is entered when micro-step
`at` begins (as the previous rec.step() returns) and left at its own rec.step(): forward,
backward and optimizer of that one micro-step, on this rank. That step runs slower (every op
goes through Python; the analysis leaves it out); every other step runs as before. Off by default: a dispatch mode that
stays on across a compiled model's call makes it recompile. Give ``flops_per_step=`` instead
when the number is known (6 x parameters x tokens for a transformer's training step).

Each counted op's FLOPs are also tallied by the dtype its inputs had as it ran (`by_dtype`):
a dispatch mode sees an op after autocast has cast its inputs, so a matmul under
`torch.autocast(dtype=torch.bfloat16)` counts as bfloat16 whatever the parameters are. MFU's
peak follows that (analyze/throughput.py).
"""

from __future__ import annotations


def _dtype_of(args) -> str | None:
    """The dtype of an op's first floating-point tensor input."""
    import torch

    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return str(a.dtype).replace("torch.", "")
    return None


class FlopCount:
    """One count, from `start()` to `stop()` (returns the FLOPs; None if nothing counted)."""

    def __init__(self, at: int = 2):
        self.at = at
        self._mode = None
        self.by_dtype: dict[str, int] = {}

    def start(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        mode = FlopCounterMode(display=False)
        count = getattr(mode, "_count_flops", None)  # where each op's FLOPs are added up
        if count is not None:
            tally, registry = self.by_dtype, mode.flop_registry

            def by_dtype(func_packet, out, args, kwargs):
                if func_packet in registry:
                    try:
                        n = int(registry[func_packet](*args, **kwargs, out_val=out))
                        d = _dtype_of(args) or "unknown"
                        tally[d] = tally.get(d, 0) + n
                    except Exception:
                        pass
                return count(func_packet, out, args, kwargs)

            mode._count_flops = by_dtype
        mode.__enter__()
        self._mode = mode

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def stop(self) -> int | None:
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        mode.__exit__(None, None, None)
        total = int(mode.get_total_flops())
        if sum(self.by_dtype.values()) != total:  # the tally missed ops: not told at all
            self.by_dtype = {}
        return total if total > 0 else None
