"""transformers' Trainer and Lightning's Trainer with gpuscope's one-line callback, and a
Lightning Fabric loop with gpuscope.record(), on CPU/gloo.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/workloads/trainers.py \\
        --trainer hf|lightning|fabric --out DIR [--accum 4] [--steps 8] [--profile]
        [--live-every N] [--slow-rank-ms MS] [--device cuda]

Tiny models built from a config (no downloads), synthetic data. Beside gpuscope, a plain
callback of the framework's own notes perf_counter at every micro-step end (the independent
timing): DIR/timings-rank<r>.json. With --profile, torch.profiler traces go to DIR/kineto.
With --live-every, the callback gets record(live_every=N) and rank 0's live summaries go to
DIR/live.jsonl; --slow-rank-ms makes rank 1 a straggler (a sleep at each micro-step).
--device cuda: the frameworks' own GPU path (NCCL, one GPU per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

_now = time.perf_counter


def options(args) -> dict:
    """record() options for the callback: live diagnosis when asked, summaries to a file."""
    if not args.live_every:
        return {}
    path = os.path.join(args.out, "live.jsonl")

    def keep(summary):
        with open(path, "a") as fh:
            fh.write(json.dumps(summary) + "\n")

    return {"live_every": args.live_every, "on_diagnosis": keep}


SLEPT = [0.0]  # seconds rank 1 was made to sleep (the framework's hooks decide how often)


def slow_down(args) -> None:
    if args.slow_rank_ms and int(os.environ.get("RANK", 0)) == 1:
        t = _now()
        time.sleep(args.slow_rank_ms / 1000)
        SLEPT[0] += _now() - t


def save(out: str, marks: list[float], **extra) -> None:
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(out, f"timings-rank{rank}.json"), "w") as fh:
        json.dump({"micro_end_s": marks, "slept_s": SLEPT[0], **extra}, fh)


def run_hf(args) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from gpuscope.integrations.hf import GpuscopeCallback

    marks: list[float] = []

    class Marks(TrainerCallback):  # the independent timing: perf_counter at each micro-step end
        def on_step_begin(self, *a, **k):
            slow_down(args)

        def on_substep_end(self, *a, **k):
            slow_down(args)
            marks.append(_now())

        def on_step_end(self, *a, **k):
            marks.append(_now())

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256,
                                       n_positions=64))
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 256, (args.steps * args.accum * 2 * 8 + 64, 64))]
    cpu = args.device == "cpu"
    targs = TrainingArguments(output_dir=os.path.join(args.out, "hf"), use_cpu=cpu,
                              ddp_backend="gloo" if cpu else "nccl", per_device_train_batch_size=8,
                              gradient_accumulation_steps=args.accum, max_steps=args.steps,
                              logging_steps=10_000, save_strategy="no", report_to=[],
                              dataloader_num_workers=0, disable_tqdm=True)
    callbacks = [GpuscopeCallback(os.path.join(args.out, "record"), **options(args)), Marks()]
    trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks)
    trainer.train()
    save(args.out, marks, accum=args.accum)


def run_lightning(args) -> None:
    import lightning.pytorch as pl
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from gpuscope.integrations.lightning import GpuscopeCallback

    marks: list[float] = []

    class Marks(pl.Callback):
        def on_train_batch_start(self, *a, **k):
            slow_down(args)

        def on_train_batch_end(self, *a, **k):
            marks.append(_now())

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512),
                                     nn.ReLU(), nn.Linear(512, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    n = args.steps * args.accum * 2 * 16 + 64
    loader = DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))),
                        batch_size=16, num_workers=0)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 2))
    trainer = pl.Trainer(accelerator="cpu" if args.device == "cpu" else "gpu", devices=devices,
                         strategy="ddp", max_steps=args.steps,
                         accumulate_grad_batches=args.accum, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         callbacks=[GpuscopeCallback(os.path.join(args.out, "record"),
                                                     **options(args)), Marks()])
    trainer.fit(Net(), loader)
    save(args.out, marks, accum=args.accum)


def run_fabric(args) -> None:
    """Lightning Fabric, as its examples write a loop: the model and optimizer from
    fabric.setup, the loader from setup_dataloaders, fabric.backward, no_backward_sync while
    accumulating; gpuscope.record(model=) gets the module fabric.setup returned (a
    _FabricModule holding DDP, which forwards attribute writes to the module inside)."""
    from lightning.fabric import Fabric
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import gpuscope

    fabric = Fabric(accelerator="cpu" if args.device == "cpu" else "cuda",
                    devices=int(os.environ.get("LOCAL_WORLD_SIZE", 2)), strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    n = args.steps * args.accum * 2 * 16 + 64
    loader = fabric.setup_dataloaders(DataLoader(
        TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=16))
    marks: list[float] = []
    with gpuscope.record(os.path.join(args.out, "record"), model=model, **options(args)) as rec:
        for i, (x, y) in enumerate(rec.data(loader)):
            if i == args.steps * args.accum:
                break
            slow_down(args)
            last = (i + 1) % args.accum == 0
            with fabric.no_backward_sync(model, enabled=not last):
                fabric.backward(nn.functional.cross_entropy(model(x), y))
            if last:
                opt.step()
                opt.zero_grad()
            rec.step()
            marks.append(_now())
    save(args.out, marks, accum=args.accum)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainer", choices=("hf", "lightning", "fabric"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--live-every", type=int, default=0)
    ap.add_argument("--slow-rank-ms", type=float, default=0.0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    {"hf": run_hf, "lightning": run_lightning, "fabric": run_fabric}[args.trainer](args)
    import torch.distributed as dist

    if dist.is_initialized():  # both Trainers leave the group up
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is written (the callback closed the recording at the end of training, the
    # timings are saved). Leave without the interpreter's teardown: there, gloo's threads can
    # abort the process ("terminate called without an active exception", PyTorch's, with
    # gpuscope switched off too), which made the suite run this training again in most runs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
