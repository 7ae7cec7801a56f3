"""The per-rank record file: its name, header, step columns and side records.

Layout of ``rank-00000.gpuscope.jsonl`` (a later recording into the same run dir writes
``rank-00000-2.gpuscope.jsonl``, and so on: files are never appended to by a second run)::

    {"schema": "gpuscope.record/1", "rank": 0, ..., "columns": [...]}   header (object)
    [0, 1700000000000000000, 12000000, ...]                              one step row (array)
    {"knobs": {...}, "at_step": 12}                                      knob update (object)
    {"device": [...]} / {"nvml": [[...], ...]}                           CUDA times, NVML samples
    {"end": {"steps": 100, ...}}                                         clean close (object)

Beside it, ``rank-00000.gpuscope.cols`` (optional; a reader that finds it damaged, stale or absent
decodes the JSON, which stays the record) holds the same step rows as int64 columns, so a big run
reads without decoding JSON. It is a sequence of chunks, each standing for a run of whole lines
of the record file (up to Chunk.MAX_ROWS rows; the last one is written when the recording
closes)::

    header (CHUNK_HEADER, 48 bytes): magic, offset and length of the lines in the record file,
        crc32 of those bytes, lines, rows, collectives, side records, bytes of keys, crc32 of
        the chunk's body (CHUNK_MAGIC_V1, the first layout: crc32 of those bytes followed by
        the body, then 0)
    body (little-endian int64): rows x STEP_COLUMNS; each row's "_samples" (-1: none);
        collectives x (row in the chunk, key index, comm_ns, exposed_ns, count); side records x
        (line in the chunk, byte offset in the chunk's lines, length): their JSON is read from
        the record file; then the keys ("kind:group") as a JSON list in order of first
        appearance, padded with spaces to a multiple of 8 bytes

Rows are arrays in the order of the header's "columns" (``STEP_COLUMNS`` when written); an
optional trailing object holds named phases that are not one of the fixed columns and, under
"_comm", the step's collectives by "kind:group": [comm_ns, exposed_ns, count]. Where the header
has "comm_key" (``COMM_KEY``, DDP's gradient all-reduce), a row with collectives (n_comm > 0)
and no "_comm" had them all under that key, [comm_ns, comm_exposed_ns, n_comm] of the row
itself: a DDP step, timed by its backward's tail, writes no object then. One row is one
micro-step (one rec.step()); with gradient accumulation, several make one optimizer step. All
times are integer nanoseconds. Both sides (the recorder
and the reader) take these names from here.
"""

from __future__ import annotations

import glob
import os
import re

SCHEMA = "gpuscope.record/1"
COMM_KEY = "all_reduce:ddp"  # the header's "comm_key": a row's collectives when it has no "_comm"
FILE_GLOB = "rank-*.gpuscope.jsonl"
FILE_SUFFIX = ".gpuscope.jsonl"
_NAME = re.compile(r"^rank-(\d+)(?:-(\d+))?\.gpuscope\.jsonl$")


COLUMNS_SUFFIX = ".gpuscope.cols"
CHUNK_MAGIC = b"GSC2"
CHUNK_MAGIC_V1 = b"GSC1"  # still read: one crc32 over the record file's bytes and the body
CHUNK_HEADER = "<4sQQIIIIIII"  # little-endian struct format of a chunk's header (48 bytes)


#: what the stall watcher and the recorder write beside a record file when a run hangs or dies:
#: torch's Flight Recorder dump, faulthandler's stacks of a fatal signal
FR_SUFFIX = ".gpuscope.fr.json"
FATAL_SUFFIX = ".gpuscope.fatal"


def beside(record_path: str, suffix: str) -> str:
    """The file of `suffix` beside a record file (its column side file, dump, fatal trace)."""
    return record_path[:-len(FILE_SUFFIX)] + suffix


def columns_path(record_path: str) -> str:
    """The column side file of a record file."""
    return beside(record_path, COLUMNS_SUFFIX)


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, FILE_GLOB)))


def is_record_file(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(FILE_SUFFIX)

STEP_COLUMNS = (
    "step",             # step index on this rank, from 0
    "start_ns",         # unix-epoch ns at the start of the step (aligned across ranks by host clocks)
    "step_ns",          # wall time of the step
    "data_ns",          # blocked waiting for the batch
    "compute_ns",       # forward + backward + optimizer, exposed communication excluded
    "comm_ns",          # time inside collectives (union of their intervals)
    "comm_exposed_ns",  # part of comm_ns the step was blocked on
    "other_ns",         # the rest: host overhead, Python, logging
    "forward_ns",
    "backward_ns",
    "optimizer_ns",
    "n_comm",           # collectives completed in the step
    "data_cpu_ns",      # CPU time of the training thread inside next(): ~data_ns when loading
                        # runs in-process and is CPU-bound, ~0 when it waits on I/O or workers;
                        # -1 not measured (a trace; a recorded step of fast fetches but one in 16)
    "synced",           # gradients were synchronized in this micro-step: 1, 0, -1 unknown
    "between_ns",       # part of other_ns before the step's first event: the loop's own work
                        # after the previous rec.step() (logging, checkpoints, a profiler)
)
#: columns a file written before a column was added lacks, and the value to assume
COLUMN_DEFAULTS = {"synced": -1}

#: one NVML sample (record side writes them as arrays in this order under {"nvml": [...]})
NVML_FIELDS = ("t_ns", "util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "sm_clock_mhz",
               "temp_c", "throttle", "energy_mj")
#: samples written before the energy counter was read have the first 8 fields (read as unknown)
NVML_FIELDS_V1 = 8

#: clock throttle reason bits (nvml.h: nvmlClocksEventReason*)
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake", 0x100: "display_clocks"}


#: the side records a rank file holds beside its step rows: one JSON object a line, whose key is
#: one of these (a knob update also has "at_step"); the reader (readers/rundir/side_records.py) has one
#: handler for each, and tests/test_vocabulary.py checks that both, and what the recorder
#: writes, agree
SIDE_RECORDS = {
    "knobs": "settings that changed since the header (merged into its knobs)",
    "end": "how the recording ended: steps, crashed, terminated, error and where, warnings",
    "device": "CUDA-event times of steps (device_timing)",
    "nvml": "NVML samples, rows of NVML_FIELDS",
    "memory": "the resident set and the allocator's peaks, per window of steps",
    "routing": "rows each all_to_all_single delivered",
    "modules": "forward times of the chosen modules",
    "dataparallel": "nn.DataParallel's totals (the latest replaces the earlier)",
    "stall": "the stall watcher's record: where the training thread was, since when",
    "stall_end": "steps resumed after a stall: how long it lasted",
}

#: every knob (a setting the suggestions are about, in the header's "knobs" or a knob update),
#: with the type a reader accepts (readers/validate.py checks it):
#:   count: an integer >= 0; flag: a bool; text: a string; number: a finite number >= 0;
#:   fraction: 0 to 1; scalar: any JSON scalar (a value passed through as given);
#:   layers: [[name, params], ...]; process_groups: {name: [ranks]}; mesh_dims: {group: dim};
#:   windows: [[first, last], ...] of steps; steps: [step, ...]; flops_by_dtype: {dtype: FLOPs};
#:   texts: [string, ...]
#: A knob not declared here (another tool's, a user's note_knobs) is kept when it is a scalar.
KNOBS = {
    # the process and its machine
    "world_size": "count", "local_world_size": "count", "cpu_count": "count",
    "cpus_available": "count", "torch_threads": "count", "cuda_available": "flag",
    "load_avg": "number",
    "torch": "text", "python": "text", "backend": "text",
    # the model and how it is split
    "model": "text", "wrapper": "text", "device": "text", "param_dtype": "text",
    "params": "count", "param_bytes": "count", "layers": "layers", "parallel": "text",
    "dp_devices": "texts", "pipeline_stage": "count", "pipeline_stages": "count", "p2p": "flag",
    "forwards_per_step": "count", "process_groups": "process_groups", "mesh_dims": "mesh_dims",
    # DDP's settings
    "bucket_cap_bytes": "count", "find_unused_parameters": "flag",
    "gradient_as_bucket_view": "flag", "static_graph": "flag", "broadcast_buffers": "flag",
    "comm_hook": "text",
    # loading
    "dataloader": "flag", "loader": "text", "batch_size": "count", "batches_per_epoch": "count",
    "batch_bytes": "count", "tokens_per_sample": "count", "num_workers": "count",
    "prefetch_factor": "count", "persistent_workers": "flag", "pin_memory": "flag",
    "drop_last": "flag",
    # accumulation (a Trainer's settings as it says them)
    "sync_interval": "count", "gradient_accumulation_steps": "count",
    "accumulate_grad_batches": "scalar", "trainer": "text",
    # precision, FLOPs, price
    "autocast_dtype": "text", "float32_matmul_precision": "text", "compute_dtype": "text",
    "flops_per_step": "number", "flops_source": "text", "flops_counted_step": "count",
    "flops_by_dtype": "flops_by_dtype", "peak_flops": "number", "price_per_gpu_hour": "number",
    # profiling beside the recording
    "profiled_steps": "windows", "profiler_trace_steps": "steps",
    # set by the analysis from what it read (never in a file written by the recorder)
    "memory_used_fraction": "fraction",
}


def comm_kind(key: str) -> str:
    """The kind of a collective's key "kind:group" (point-to-point: "recv_prev:3" = from rank 3,
    the previous in rank order)."""
    return key.split(":", 1)[0]


def is_p2p(kind: str) -> bool:
    """Communication between pipeline stages: point-to-point (send / recv), or a collective that
    ties stages together ("stages_all_reduce": Megatron's embedding all-reduce between the first
    and last stage, where the last waits for the first to finish its backward: the pipeline's
    drain, part of the bubble, not one rank waiting for a slower peer)."""
    return kind.startswith(("send", "recv", "stages_"))


def throttle_names(mask: int) -> list[str]:
    """Names of the throttle reasons set in `mask` (idle is not throttling)."""
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit and name != "gpu_idle"]


def rank_file_name(rank: int, recording: int = 1) -> str:
    """File name of `rank`'s file in the `recording`-th recording made into one run dir."""
    tail = "" if recording <= 1 else f"-{recording}"
    return f"rank-{rank:05d}{tail}{FILE_SUFFIX}"


def parse_file_name(name: str) -> tuple[int, int] | None:
    """(rank, recording) of a record file name, or None when it is not one."""
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2) or 1)) if m else None
