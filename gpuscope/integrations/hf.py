"""gpuscope for transformers' Trainer: ``Trainer(..., callbacks=[GpuscopeCallback("runs/exp1")])``.

What it hooks, and where transformers offers the seam:
- the model the Trainer calls: callbacks are handed the bare model, so at train begin the
  DistributedDataParallel (or FSDP) wrapper around it is looked up once;
- batch fetches: the train dataloader handed to callbacks is the one the loop iterates (the
  Trainer prefetches an optimizer step's micro-batches at its start), timed per next();
- micro-steps: `on_substep_end` (a micro-step that accumulates) and `on_step_end` (the one that
  synchronizes and steps the optimizer) each close one;
- knobs: per-device batch size, gradient accumulation steps, dataloader workers.
Forward, backward, optimizer and communication are timed as `gpuscope.record` times them.
"""

from __future__ import annotations

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("gpuscope.integrations.hf needs transformers: pip install 'gpuscope[hf]'") \
        from exc

from ..record.recorder import Recorder
from ._common import TimedLoader, find_wrapper


class GpuscopeCallback(TrainerCallback):
    """Records a transformers Trainer run into `run_dir` (options as for gpuscope.record)."""

    def __init__(self, run_dir, **record_options):
        self.run_dir = run_dir
        self.options = record_options
        self.recorder: Recorder | None = None
        self._loader: TimedLoader | None = None

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self.recorder = Recorder(self.run_dir, find_wrapper(model), **self.options).start()
        rec = self.recorder
        if train_dataloader is not None:
            rec.note_loader(train_dataloader)
            self._loader = TimedLoader(train_dataloader, rec)
        rec.note_knobs({"batch_size": getattr(args, "per_device_train_batch_size", None),
                        "gradient_accumulation_steps": args.gradient_accumulation_steps,
                        "num_workers": getattr(args, "dataloader_num_workers", None),
                        "trainer": "transformers.Trainer"})

    def on_substep_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.step()

    def on_step_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self._loader is not None:
            self._loader.restore()
            self._loader = None
        if self.recorder is not None:
            self.recorder.stop()
