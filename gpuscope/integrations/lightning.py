"""gpuscope for Lightning: ``Trainer(..., callbacks=[GpuscopeCallback("runs/exp1")])``.

What it hooks, and where Lightning offers the seam:
- the model the Trainer calls: `trainer.strategy.model` (the DDP / FSDP wrapper) at train start;
- batch fetches: Lightning reports each fetch to its profiler as
  "[_TrainingEpochLoop].train_dataloader_next"; the callback listens on the trainer's profiler
  (whichever it is) for those two calls and hands the rest through;
- micro-steps: `on_train_batch_end` closes one (with accumulate_grad_batches, Lightning runs a
  batch's training_step and backward without an optimizer step);
- forward and backward run inside `optimizer.step(closure)`: they count as forward and backward;
- knobs: the train dataloader's batch size and workers, accumulate_grad_batches.
"""

from __future__ import annotations

import time

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise ImportError("gpuscope.integrations.lightning needs Lightning: "
                          "pip install 'gpuscope[lightning]'") from exc

from ..record.recorder import Recorder
from ._common import find_wrapper

_cpu = time.thread_time_ns
FETCH = "train_dataloader_next"


class _FetchListener:
    """Put on the trainer's profiler: times the fetch actions, passes every call through."""

    def __init__(self, profiler, recorder):
        self.profiler = profiler
        self.recorder = recorder
        self.start0, self.stop0 = profiler.start, profiler.stop
        self._now = recorder.options.clock  # the recorder's own clock, as its other timers
        self._t0 = self._c0 = None
        profiler.start, profiler.stop = self.start, self.stop

    def start(self, action_name: str) -> None:
        if action_name.endswith(FETCH):
            self.recorder.fetch_started()
            self._c0, self._t0 = _cpu(), self._now()
        return self.start0(action_name)

    def stop(self, action_name: str) -> None:
        if action_name.endswith(FETCH) and self._t0 is not None:
            self.recorder.batch_fetched(self._t0, self._now(), _cpu() - self._c0)
            self._t0 = None
        return self.stop0(action_name)

    def restore(self) -> None:
        for name in ("start", "stop"):
            if getattr(self.profiler, name, None) == getattr(self, name):
                delattr(self.profiler, name)  # the instance attribute goes: the class's returns


class GpuscopeCallback(Callback):
    """Records a Lightning Trainer run into `run_dir` (options as for gpuscope.record)."""

    def __init__(self, run_dir, **record_options):
        super().__init__()
        self.run_dir = run_dir
        self.options = record_options
        self.recorder: Recorder | None = None
        self._listener: _FetchListener | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        model = getattr(trainer.strategy, "model", None) or find_wrapper(pl_module)
        self.recorder = rec = Recorder(self.run_dir, model, **self.options).start()
        self._listener = _FetchListener(trainer.profiler, rec)
        loader = getattr(trainer, "train_dataloader", None)
        if loader is not None:
            rec.note_loader(loader)
        rec.note_knobs({"accumulate_grad_batches": trainer.accumulate_grad_batches,
                        "trainer": "lightning.Trainer"})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.recorder is not None:
            self.recorder.note_batch(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.recorder is not None:
            self.recorder.step()

    def on_train_end(self, trainer, pl_module) -> None:
        if self._listener is not None:
            self._listener.restore()
            self._listener = None
        if self.recorder is not None:
            self.recorder.stop()
