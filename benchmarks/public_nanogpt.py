"""nanoGPT's train.py (karpathy/nanoGPT, MIT), fetched at a pinned commit and run as a user would
with gpuscope: for benchmarks/bench_whatif.py's public-script cases.

What changes in the script (each edit is checked to apply exactly once, so a changed upstream fails
loudly instead of measuring something else):
- CPU under torchrun: the device nanoGPT's DDP branch hard-codes to `cuda:LOCAL_RANK` stays the
  configured one (`--device=cpu`), and DDP gets no device_ids on a CPU;
- gpuscope as the README shows for nanoGPT's loop: `record(...).start()` after the DDP wrap, the
  batches through `rec.data`, `rec.step()` after each micro-step's backward, `rec.stop()` at the
  end.

The truth is nanoGPT's own clock: the `iter N: ... time T ms` lines rank 0 prints (time.time()
around each optimizer step), not gpuscope's.
"""

from __future__ import annotations

import os
import re

import numpy as np

from public_repo import git_dir, source

COMMIT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"
URL = "https://github.com/karpathy/nanoGPT"
FILES = ("train.py", "model.py", "configurator.py")
MIRROR = os.environ.get("NANOGPT_GIT", "/work/.mirror/karpathy+nanoGPT/repo")

EDITS = (
    ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    if device != 'cpu':\n        device = f'cuda:{ddp_local_rank}'\n"
     "        torch.cuda.set_device(device)\n"),
    ("    model = DDP(model, device_ids=[ddp_local_rank])\n",
     "    model = DDP(model, device_ids=None if device == 'cpu' else [ddp_local_rank])\n"),
    ("# training loop\nX, Y = get_batch('train') # fetch the very first batch\n",
     "# training loop\nimport gpuscope\nrec = gpuscope.record(os.environ['GPUSCOPE_RUN_DIR'], "
     "model=model)\nrec.start()\nbatches = rec.data(iter(lambda: get_batch('train'), None))\n"
     "X, Y = next(batches) # fetch the very first batch\n"),
    ("        X, Y = get_batch('train')\n", "        X, Y = next(batches)\n"),
    ("        scaler.scale(loss).backward()\n",
     "        scaler.scale(loss).backward()\n        rec.step()\n"),
    ("if ddp:\n    destroy_process_group()", "rec.stop()\nif ddp:\n    destroy_process_group()"),
)

#: a small GPT that trains in tens of ms a micro-step on one core: its embedding (nanoGPT's
#: padded GPT-2 vocabulary x 128) makes the gradient all-reduce the larger part, as in the
#: data-parallel runs users ask about
BASE = ("--device=cpu", "--backend=gloo", "--compile=False", "--dtype=float32",
        "--dataset=synthetic", "--eval_interval=100000", "--eval_iters=1", "--log_interval=1",
        "--always_save_checkpoint=False", "--n_layer=2", "--n_head=2", "--n_embd=128",
        "--block_size=64", "--decay_lr=False", "--warmup_iters=0")
WARMUP_ITERS = 3  # iterations nanoGPT's clock leaves out (the first holds the eval and start-up)


def _source(name: str) -> str:
    return source(git_dir(MIRROR, URL, "nanoGPT"), COMMIT, name)


def prepare(workdir: str) -> str:
    """nanoGPT's files, edited, with a synthetic token dataset; returns `workdir`."""
    os.makedirs(os.path.join(workdir, "data", "synthetic"), exist_ok=True)
    for name in FILES:
        text = _source(name)
        if name == "train.py":
            for old, new in EDITS:
                if text.count(old) != 1:
                    raise SystemExit(f"nanoGPT {COMMIT[:8]}: an edit no longer applies: {old!r}")
                text = text.replace(old, new)
        with open(os.path.join(workdir, name), "w") as fh:
            fh.write(text)
    rng = np.random.default_rng(0)
    for split, n in (("train", 400_000), ("val", 20_000)):
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(
            os.path.join(workdir, "data", "synthetic", f"{split}.bin"))
    return workdir


def flag(args: tuple, key: str) -> int:
    return int(next(a.split("=", 1)[1] for a in args if a.startswith(f"--{key}=")))


def set_flag(args: tuple, key: str, value) -> tuple:
    out = [a for a in args if not a.startswith(f"--{key}=")]
    return tuple(out) + (f"--{key}={value}",)


def iteration_ms(stdout: str) -> list[float]:
    """nanoGPT's own time per optimizer step (rank 0), warm-up left out."""
    t = [(int(i), float(ms)) for i, ms in
         re.findall(r"^iter (\d+): loss [-\d.naif]+, time ([\d.]+)ms", stdout, re.M)]
    return [ms for i, ms in t if i >= WARMUP_ITERS]
