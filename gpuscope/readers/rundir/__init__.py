"""Reads a run dir written by gpuscope.record into a RunTable.

A run dir can hold several recordings (a script run twice into the same dir): each wrote its own
rank files (rank-00000.gpuscope.jsonl, then rank-00000-2.gpuscope.jsonl, ...). They are never
merged: files are grouped into recordings (ranks of one recording ran at the same time, and share
the launcher's job id when it has one), and the newest recording is read, with a warning naming
the others; giving one rank file as the path reads the recording that file belongs to.

Its parts, as kineto/'s: side_records.py (a rank file's header and side records, checked),
rank_data.py (RankFile), rank_file.py (one rank file read), parallel_load.py (many read in two processes, into one row
block), recordings.py (the files grouped into recordings, one chosen), frames.py (the run's
tables assembled); here, the rank's RankInfo and the RunTable. What DDP's logging says backward
hid is the analysis's (analyze/ddp_share.py).
"""

from __future__ import annotations

import os

import pandas as pd

from ...runtable import RankInfo, RunTable
from ..memory_records import capacity_of, memory_frame
from ..module_records import modules_frame
from ..routing_records import routing_frame
from ..warm_split import WarmRows, unsplit
from .frames import (all_split, apply_device_times, block_maker, device_comm, host_comm_share,
                     merger, step_table, telemetry_frame, with_bubble)
from .rank_data import RankFile
from .rank_file import load_rank_file, read_rank_file
from .recordings import chosen_files, group_recordings
from .side_records import SIDE_HANDLERS


#: the names other modules use (the package's parts hold the rest)
__all__ = ["RankFile", "SIDE_HANDLERS", "group_recordings", "load_rank_file", "read_rank_file",
           "read_run_dir", "with_bubble"]


def _rank_info(f: "RankFile") -> RankInfo:
    """A rank file's RankInfo: its knobs (with what its end record adds: the comm hook, that
    backward's hidden communication is not in the rows) and what else the analysis reads of
    it (meta)."""
    header = f.header
    knobs = header["knobs"]
    if isinstance(f.end, dict) and isinstance(f.end.get("comm_hook"), str):
        knobs = {**knobs, "comm_hook": f.end["comm_hook"]}  # known when the run ends
    if "ddp_tail" in str(header.get("comm_timing", "")).split("+"):
        # DDP timed by its backward's tail: what backward hid is not in the rows; DDP's own
        # logging (its sampled iterations, kept in the end record) may say: analyze/ddp_share
        knobs = {**knobs, "hidden_comm": "unmeasured"}
    meta = {k: header.get(k) for k in ("pid", "comm_timing", "start_unix_ns", "placement_source",
                                       "local_rank", "gpu", "run_id", "flush")}
    meta |= {"end": f.end, "file": os.path.basename(f.path), "capacity": capacity_of(header)}
    if f.dataparallel:
        meta["dataparallel"] = f.dataparallel
    if f.stalls or f.stall_ends:
        meta |= {"stalls": f.stalls, "stall_ends": f.stall_ends}
    if not f.end:  # killed: by a fatal signal, where its trace says so (readers/fatal.py)
        from ..fatal import read_fatal

        fatal = read_fatal(f.path)
        if fatal:
            meta["fatal"] = fatal
    return RankInfo(f.rank, header.get("host", ""), knobs, meta)


def read_run_dir(path: str, loaded: list | None = None, warm: int = 0) -> RunTable:
    """A run dir (its newest recording), or one rank file (the recording it belongs to).
    `loaded`: (name, RankFile or TraceFormatError) per record file, read elsewhere (the Ray
    engine's tasks); else they are read here. `warm`: each rank's first rows the analysis
    leaves out, set apart as the files are read where they can be (RunTable.warm)."""
    warnings: list[str] = []
    path, chosen, placed = chosen_files(path, loaded, warnings, warm)
    split = placed is not None and all_split(chosen)
    if not split:
        for f in chosen:
            unsplit(f)
    frames, blocks, ranks, world, telemetry, comm = [], [], {}, 0, [], []  # comm: (rank, columns)
    memory, routing, modules = [], [], []  # (rank, its memory / all-to-all / module records)
    host_timed: list[int] = []  # CUDA ranks with collectives the device did not time
    for f in chosen:
        warnings += f.warnings
        header, rank = f.header, f.rank
        world = max(world, int(header.get("world_size") or 1))
        ranks[rank] = _rank_info(f)
        tel = telemetry_frame(rank, f.nvml)
        if tel is not None:
            telemetry.append(tel)
        if f.memory:
            memory.append((rank, f.memory))
        if f.routing:
            routing.append((rank, f.routing))
        if f.modules:
            modules.append((rank, f.modules))
        frame = f.frame
        rank_comm = f.comm
        warnings += f.tally.warnings()
        if frame is not None and len(frame["step"]):
            if f.device:
                frame = apply_device_times(pd.DataFrame(frame), f.device)
                rank_comm = device_comm(rank_comm, frame, header.get("comm_key"))
                share = host_comm_share(frame)
                if share > 0:
                    ranks[rank].meta["host_comm_share"] = share
                    host_timed.append(rank)
            frames.append(frame)
            blocks.append(None if f.device else f.block)
        else:
            warnings.append(f"{os.path.basename(f.path)}: rank {rank} recorded no "
                            f"{'usable ' if f.n_rows else ''}steps")
        if rank_comm is not None:
            comm.append((rank, rank_comm))
    if host_timed:
        worst = max(ranks[r].meta["host_comm_share"] for r in host_timed)
        warnings.append(
            f"rank(s) {', '.join(map(str, host_timed[:8]))}: collectives outside DDP on the GPU "
            f"(up to {worst:.0%} of the step) are timed on the host, from launch to completion; "
            "how long the GPU waited for them is not seen (exposed counts what the host blocked "
            "on, a lower bound): torch.profiler traces give the device's view")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no readable record file (ranks {shown}); "
                        "analysis covers the others")
    warms = [f.warm for f in chosen if f.frame is not None and len(f.frame["step"])] \
        if split else []
    spill = placed[0].spill_dir if placed is not None else None
    frame, int_block, comm_frame, wf = step_table(frames, blocks, placed, warms, comm, spill)
    tel = pd.concat(telemetry, ignore_index=True) if telemetry else None
    table = RunTable(frame, "record", path, ranks, world or len(ranks), warnings, telemetry=tel,
                     comm=comm_frame, memory=memory_frame(memory),
                     routing=routing_frame(routing), int_block=int_block,
                     ops=modules_frame(modules),
                     warm=None if wf is None else WarmRows(wf, warm, merger(
                         wf, int_block[1], block_maker(spill))))
    if os.path.isdir(path):
        from ..flight_recorder import find  # torch's and the stall watcher's, beside the records

        dumps, bad = find(path, quiet=True)
        table.flight_recorder = (dumps, bad) if dumps else None
    return table
