"""pytorch/examples' distributed/minGPT-ddp (BSD-3-Clause), fetched at a pinned commit and run as
a user would with gpuscope: a public training program for benchmarks/bench_try.py.

What changes in the program (each edit must apply exactly once, so a changed upstream fails
loudly instead of measuring something else):
- CPU under torchrun: with no accelerator, the device is the CPU, the backend gloo, DDP gets no
  device_ids, and the 2-GPU check at the start is skipped; `boto3` is imported only where a
  snapshot goes to S3 (it is not installed here);
- gpuscope as the README shows for a DataLoader loop: `record(...)` around `train()`, the train
  loader through `rec.data`, `rec.step()` after each batch. The program has no step limit of its
  own (it trains whole epochs): a run is ended by the recorder after $GPUSCOPE_STOP_AFTER
  micro-steps, as `gpuscope try` ends its trials.

Its knobs are hydra overrides: trainer_config.batch_size, trainer_config.data_loader_workers.
The data is the repository's own tinyshakespeare copy (mingpt/data/input.txt).
"""

from __future__ import annotations

import os

from public_repo import git_dir, source

COMMIT = "77f55b912142e11fcfdf5b530231fb9c52f181e8"
URL = "https://github.com/pytorch/examples"
DIR = "distributed/minGPT-ddp/mingpt"
FILES = ("main.py", "trainer.py", "model.py", "char_dataset.py", "gpt2_train_cfg.yaml",
         "data/input.txt")
MIRROR = os.environ.get("PYTORCH_EXAMPLES_GIT", "/work/.mirror/pytorch+examples/repo")

EDITS = {
    "trainer.py": (
        ("import boto3\n", ""),
        ("    buffer = io.BytesIO()\n", "    import boto3\n    buffer = io.BytesIO()\n"),
        ('        self.device: torch.device = torch.device(f"{self.acc}:{self.local_rank}")\n',
         '        self.device: torch.device = (torch.device(f"{self.acc}:{self.local_rank}") '
         'if self.acc is not None else torch.device("cpu"))\n'),
        ("        self.model = model.to(self.local_rank)\n",
         "        self.model = model.to(self.device)\n"),
        ("        self.model = DDP(self.model, device_ids=[self.local_rank])\n",
         "        self.model = DDP(self.model, device_ids=None if self.acc is None "
         "else [self.local_rank])\n"),
        ("        for iter, (source, targets) in enumerate(dataloader):\n",
         "        batches = self.rec.data(dataloader) if train else dataloader\n"
         "        for iter, (source, targets) in enumerate(batches):\n"),
        ("            source = source.to(self.local_rank)\n            targets = "
         "targets.to(self.local_rank)\n            batch_loss = self._run_batch(source, targets, "
         "train)\n",
         "            source = source.to(self.device)\n            targets = "
         "targets.to(self.device)\n            batch_loss = self._run_batch(source, targets, "
         "train)\n            if train:\n                self.rec.step()\n"),
        ("    def train(self):\n",
         "    def train(self):\n        import gpuscope\n"
         "        self.rec = gpuscope.record(os.environ.get('GPUSCOPE_RUN_DIR', 'runs/mingpt'), "
         "model=self.model)\n        with self.rec:\n            self._train()\n\n"
         "    def _train(self):\n"),
    ),
    "main.py": (
        ("    device: torch.device = torch.device(f\"{acc}:{rank}\")\n"
         "    backend = torch.distributed.get_default_backend_for_device(device)\n"
         "    init_process_group(backend=backend)\n    torch.accelerator.set_device_index(rank)\n",
         "    if acc is None:\n        init_process_group(backend='gloo')\n        return\n"
         "    device: torch.device = torch.device(f\"{acc}:{rank}\")\n"
         "    backend = torch.distributed.get_default_backend_for_device(device)\n"
         "    init_process_group(backend=backend)\n    torch.accelerator.set_device_index(rank)\n"),
        ("    if not verify_min_gpu_count(min_gpus=_min_gpu_count):\n",
         "    if torch.accelerator.is_available() and "
         "not verify_min_gpu_count(min_gpus=_min_gpu_count):\n"),
    ),
}

#: a small GPT on one CPU core a rank: 2 layers of 128, 64 characters of context, fp32 (the
#: program's fp16 autocast is for GPUs), a twentieth of tinyshakespeare, no snapshots
BASE = ("data_config.path=data/input.txt", "data_config.block_size=64",
        "gpt_config.n_layer=2", "gpt_config.n_head=4", "gpt_config.n_embd=128",
        "trainer_config.use_amp=False", "trainer_config.save_every=1000",
        "trainer_config.max_epochs=1000", "trainer_config.snapshot_path=none.pt")


def prepare(workdir: str) -> str:
    """minGPT-ddp's files, edited, in `workdir`; returns it."""
    os.makedirs(os.path.join(workdir, "data"), exist_ok=True)
    for name in FILES:
        text = source(git_dir(MIRROR, URL, "pytorch-examples"), COMMIT, f"{DIR}/{name}")
        for old, new in EDITS.get(name, ()):
            if text.count(old) != 1:
                raise SystemExit(f"minGPT-ddp {COMMIT[:8]}: an edit no longer applies: {old!r}")
            text = text.replace(old, new)
        with open(os.path.join(workdir, name), "w") as fh:
            fh.write(text)
    return workdir


def missing() -> str | None:
    """What the program needs that is not installed (hydra-core, fsspec), else None."""
    import importlib.util

    lack = [m for m in ("hydra", "fsspec") if importlib.util.find_spec(m) is None]
    return f"minGPT-ddp needs {', '.join(lack)}: pip install hydra-core fsspec" if lack else None
