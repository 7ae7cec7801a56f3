"""The record's vocabulary is declared once (run_format.SIDE_RECORDS, run_format.KNOBS): the
reader has a handler for each side record and a checker for each knob type, and everything the
recorder writes (a fresh recording with most of its options on, the committed records, the
H200's) is declared there."""

import glob
import json
import os

import pytest

import gpuscope
from gpuscope.readers.rundir import SIDE_HANDLERS
from gpuscope.readers.validate import KNOB_TYPES, clean_knobs
from gpuscope.run_format import KNOBS, SIDE_RECORDS

HERE = os.path.dirname(__file__)


def test_the_reader_handles_every_side_record_and_checks_every_knob_type():
    assert set(SIDE_HANDLERS) == set(SIDE_RECORDS)
    assert set(KNOBS.values()) <= set(KNOB_TYPES)


def test_a_knob_of_the_wrong_type_is_dropped_and_an_undeclared_scalar_kept():
    clean, bad = clean_knobs({"batch_size": "8", "num_workers": 4, "pin_memory": 1,
                              "profiled_steps": [[3, 2]], "someone_elses": "x",
                              "nested": {"a": 1}, "flops_per_step": 2.5e12})
    assert clean == {"num_workers": 4, "someone_elses": "x", "flops_per_step": 2.5e12}
    assert bad == 4


def _written(path: str) -> tuple[set, set]:
    """(side record keys, knob names) in a rank file: header knobs and knob updates."""
    sides, knobs = set(), set()
    with open(path) as fh:
        header = json.loads(fh.readline())
        knobs |= set(header.get("knobs") or {})
        for line in fh:
            if line.startswith("{"):
                obj = json.loads(line)
                sides |= set(obj) - {"at_step"}
                knobs |= set(obj.get("knobs") or {})
    return sides, knobs


def test_what_a_recording_with_most_options_on_writes_is_declared(tmp_path):
    """One process, DDP on gloo, a DataLoader, accumulation, module times, counted FLOPs, a
    price, a profiler window and a pause past stall_s: every side record and knob it writes."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4)
        prof = torch.profiler.profile(schedule=torch.profiler.schedule(wait=2, warmup=1,
                                                                       active=2, repeat=1))
        with prof, gpuscope.record(tmp_path / "run", model=model, modules=True,
                                   count_flops=True, price_per_gpu_hour=2.0, stall_s=0.3,
                                   flush_s=0.1, telemetry=False) as rec:
            for i, (x,) in enumerate(rec.data(loader)):
                if i == 8:
                    import time

                    time.sleep(1.0)  # a pause: the stall and its end
                if i % 2 == 0:
                    with model.no_sync():
                        model(x).sum().backward()
                else:
                    model(x).sum().backward()
                    opt.step()
                    opt.zero_grad()
                rec.step()
                prof.step()
    finally:
        dist.destroy_process_group()
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            os.environ.pop(var, None)
    sides, knobs = _written(str(tmp_path / "run" / "rank-00000.gpuscope.jsonl"))
    assert {"knobs", "end", "stall", "stall_end", "modules"} <= sides, sides
    assert sides <= set(SIDE_RECORDS), sides - set(SIDE_RECORDS)
    assert {"sync_interval", "flops_per_step", "profiled_steps", "bucket_cap_bytes",
            "batch_size", "num_workers"} <= knobs, knobs
    assert knobs <= set(KNOBS), knobs - set(KNOBS)


def test_the_committed_records_and_the_h200_s_write_only_declared_words():
    paths = glob.glob(os.path.join(HERE, "..", "sample_traces", "**", "*.gpuscope.jsonl"),
                      recursive=True)
    paths += glob.glob(os.path.join(HERE, "fixtures", "**", "*.gpuscope.jsonl"), recursive=True)
    paths += glob.glob(os.path.join(HERE, "..", "..", "shared", "gpu-h200", "**",
                                    "*.gpuscope.jsonl"), recursive=True)
    assert len(paths) > 20
    sides, knobs = set(), set()
    for p in paths:
        s, k = _written(p)
        sides |= s
        knobs |= k
    assert sides <= set(SIDE_RECORDS), sides - set(SIDE_RECORDS)
    assert knobs <= set(KNOBS), knobs - set(KNOBS)


def _port() -> int:
    from gpuscope.doctor import free_port

    return free_port()


def test_every_bottleneck_label_has_one_entry_in_the_bottleneck_table():
    """Issue 72: a label is declared once, by its module (bottlenecks/<x>.SPEC), and confidence
    and invariants read it from bottlenecks/table.py: a bottleneck label of vocab.LABELS with no
    entry (or two) fails here, as does an entry whose share or threshold does not exist."""
    from dataclasses import fields

    from gpuscope.analyze import confidence, invariants
    from gpuscope.analyze.bottlenecks import table
    from gpuscope.analyze.bottlenecks.spec import Bottleneck
    from gpuscope.thresholds import Thresholds
    from gpuscope.vocab import COMPUTE, LABEL_COLORS, LABEL_STYLES, LABELS, UNEXPLAINED

    bottlenecks = [x for x in LABELS if x not in (COMPUTE, UNEXPLAINED)]
    assert table.missing(bottlenecks) == []
    assert {b.label for b in table.TABLE} == set(bottlenecks)
    limits = {f.name for f in fields(Thresholds)}
    for b in table.TABLE:
        assert b.threshold in limits and b.share.endswith("_share") and b.recovers, b
        assert callable(b.recover)
        assert (b.asks is None) == (b.suggest is None)  # asked, it makes suggestions
        assert b.label in LABEL_COLORS and b.label in LABEL_STYLES
        assert confidence._DECIDING[b.label] == (b.share, b.threshold)
        assert invariants.RECOVERS[b.label] == b.recovers
    # the check sees a label left out, and one declared twice
    short = tuple(b for b in table.TABLE if b.label != bottlenecks[0])
    assert table.missing(bottlenecks, short) == [bottlenecks[0]]
    twice = table.TABLE + (Bottleneck(bottlenecks[1], "x_share", "wait", "x", lambda t, f: 0),)
    assert table.missing(bottlenecks, twice) == [bottlenecks[1]]
