"""FLOPs of one training micro-step, counted once (``record(count_flops=True)``).

torch.utils.flop_counter.FlopCounterMode (a dispatch mode: it sees every op and counts the
matmuls, convolutions and attention; the maths is untouched) is entered when micro-step
`at` begins (as the previous rec.step() returns) and left at its own rec.step(): forward,
backward and optimizer of that one micro-step, on this rank. That step runs slower (every op
goes through Python; the analysis leaves it out); every other step runs as before. Off by default: a dispatch mode that
stays on across a compiled model's call makes it recompile. Give ``flops_per_step=`` instead
when the number is known (6 x parameters x tokens for a transformer's training step).
"""

from __future__ import annotations


class FlopCount:
    """One count, from `start()` to `stop()` (returns the FLOPs; None if nothing counted)."""

    def __init__(self, at: int = 2):
        self.at = at
        self._mode = None

    def start(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        mode = FlopCounterMode(display=False)
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
        return total if total > 0 else None
