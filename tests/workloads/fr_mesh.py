"""A Megatron-shaped job on 8 ranks (gloo, CPU) that hangs, for tests/test_flight_recorder.py:
tensor-, data-, pipeline- and expert-parallel groups, every group of one kind built with one
description (TENSOR_MODEL_PARALLEL_GROUP, ...), as Megatron builds them. Each step: a TP
all-reduce, an EP all-to-all, a send / recv between the two pipeline stages, a DP all-reduce.

    python -m torch.distributed.run --standalone --nproc_per_node 8 tests/workloads/fr_mesh.py \\
        --out DIR --rank 5 --at 3 --how python [--prefix _dump_] [--dump full|empty|json] \\
        [--buffer N]

python:   the rank stops in Python (a stuck loader, a lock) before its EP all-to-all of step --at
mismatch: the rank calls an all-reduce of [1] on its EP group where the others call the all-to-all
lost:     the rank stops in Python as above and its dump is lost (its node went down with it)

After --dump-after seconds every rank writes torch's own dump of its Flight Recorder as
DIR/<prefix><rank>, as TORCH_FR_DUMP_TEMP_FILE + rank names it (--dump: full: the pickle
`_dump_fr_trace()` gives; json: `_dump_fr_trace_json()`; empty: for the faulted rank only, the
JSON dump without its entries, `includeCollectives=False`, as a rank stuck in Python leaves a ring
with nothing active), waits until every live rank has written its own, and exits.
`--buffer N` gives the faulted rank a ring of N entries (TORCH_FR_BUFFER_SIZE), so that its older
entries are overwritten.
"""

import argparse
import os
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, default=5)
ap.add_argument("--at", type=int, default=3)
ap.add_argument("--how", default="python", choices=["python", "mismatch", "lost"])
ap.add_argument("--prefix", default="_dump_")
ap.add_argument("--dump", default="full", choices=["full", "empty", "json"])
ap.add_argument("--dump-after", type=float, default=6.0)
ap.add_argument("--buffer", type=int, default=0)
args = ap.parse_args()
me = int(os.environ["RANK"]) == args.rank
os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.buffer if me and args.buffer else 2000)

import torch  # noqa: E402 - after the ring's size is set
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pp, dp, tp = rank // 4, (rank // 2) % 2, rank % 2


def build(desc, member_lists):
    mine = None
    for ranks in member_lists:
        g = dist.new_group(ranks, group_desc=desc)
        if rank in ranks:
            mine = g
    return mine


TP = build("TENSOR_MODEL_PARALLEL_GROUP", [[0, 1], [2, 3], [4, 5], [6, 7]])
DP = build("DATA_PARALLEL_GROUP", [[0, 2], [1, 3], [4, 6], [5, 7]])
PP = build("PIPELINE_MODEL_PARALLEL_GROUP", [[0, 4], [1, 5], [2, 6], [3, 7]])
EP = build("EXPERT_MODEL_PARALLEL_GROUP", [[0, 1, 2, 3], [4, 5, 6, 7]])
alive = world - (1 if args.how == "lost" else 0)


def dump():
    if me and args.how == "lost":
        os._exit(0)
    path = os.path.join(args.out, f"{args.prefix}{rank}")
    if me and args.dump == "empty":
        blob = _dump_fr_trace_json(False, False)
    elif args.dump == "json":
        blob = _dump_fr_trace_json()
    else:
        blob = _dump_fr_trace()
    with open(path + ".part", "wb") as fh:
        fh.write(blob)
    os.rename(path + ".part", path)
    deadline = time.time() + 20
    while time.time() < deadline and sum(
            1 for n in os.listdir(args.out) if n.startswith(args.prefix)
            and not n.endswith(".part")) < alive:
        time.sleep(0.1)
    os._exit(0)


threading.Timer(args.dump_after, dump).start()
x = torch.ones(16)
for step in range(10_000):
    if pp == 1:
        dist.recv(x, src=rank - 4, group=PP)
    dist.all_reduce(x, group=TP)
    if me and step == args.at:
        if args.how in ("python", "lost"):
            while True:
                time.sleep(1)
        dist.all_reduce(torch.ones(1), group=EP)
    out = torch.empty(16)
    dist.all_to_all_single(out, x, group=EP)
    x = out / 4
    if pp == 0:
        dist.send(x, dst=rank + 4, group=PP)
    dist.all_reduce(x, group=DP)
    x = x / 2
