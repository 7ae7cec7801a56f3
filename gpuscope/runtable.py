"""RunTable: the one rank x step table both readers produce and every rule and renderer reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from .breakdown import GpuBreakdown

#: columns every reader fills (integer ns unless noted); readers may add more
TIME_COLUMNS = ("step_ns", "data_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "wait_ns",
                "other_ns")
DETAIL_COLUMNS = ("forward_ns", "backward_ns", "optimizer_ns", "n_comm", "data_cpu_ns")
KEY_COLUMNS = ("rank", "step", "start_ns")
#: the long table of collectives per step: key = "kind:group"
COMM_COLUMNS = ("rank", "step", "key", "comm_ns", "exposed_ns", "count")
#: an optional column of the collectives table: the part of exposed_ns that synchronized
#: gradients (traces mark it by when it was issued; without it, grad_sync_exposed() judges by
#: the key: the recorder's DDP tail, FSDP's reduce-scatters)
GRADS_COLUMN = "grads_exposed_ns"


@dataclass
class RankInfo:
    """What is known of one rank besides its steps: host, knobs, how it was measured."""

    rank: int
    host: str = ""
    knobs: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


@dataclass
class RunTable:
    """Per-rank, per-step timings. `frame` has one row per (rank, step), sorted, with
    KEY_COLUMNS + TIME_COLUMNS (+ DETAIL_COLUMNS where known)."""

    frame: pd.DataFrame
    source: str  # "record" | "kineto"
    path: str
    ranks: dict[int, RankInfo]
    world_size: int
    warnings: list[str] = field(default_factory=list)
    #: NVML samples, one row each: rank + run_format.NVML_FIELDS (recorded runs on GPUs)
    telemetry: pd.DataFrame | None = None
    #: HTA-compatible GPU time breakdown per rank (Kineto traces with device events)
    gpu_breakdown: dict[int, GpuBreakdown] = field(default_factory=dict)
    #: collectives per rank and step by kind and process group (COMM_COLUMNS), where timed
    comm: pd.DataFrame | None = None
    #: memory per rank and step where sampled (readers/memory_records.MEMORY_COLUMNS)
    memory: pd.DataFrame | None = None
    #: rows each all_to_all_single delivered, per rank, step and instance
    #: (readers/routing_records.ROUTING_COLUMNS), where recorded
    routing: pd.DataFrame | None = None
    #: the op and kernel views of profiler traces (readers/kineto/ops.py): per rank and step,
    #: time by top-level torch op, record_function range and kernel (rank, step, kind, name,
    #: count, ns, gpu_ns)
    ops: pd.DataFrame | None = None
    #: each communication kernel with its message (rank, step, group, collective, bytes,
    #: group_size, dtype, dur_ns, seq), where the trace's args say
    messages: pd.DataFrame | None = None
    #: HTA's kernel breakdown per rank and kernel name (rank, name, type, count, sum_ns, min_ns,
    #: max_ns), and its kernel-type time per rank ({rank: {"COMPUTATION": ns, ...}})
    kernel_breakdown: pd.DataFrame | None = None
    kernel_types: dict = field(default_factory=dict)
    #: torch's Flight Recorder dumps beside a recorded run (readers/flight_recorder.find):
    #: ({rank: RankDump}, [(file, why it is not one)]), or None where there are none
    flight_recorder: tuple | None = None
    #: (2-D int64 array, its column names): the frame's int columns as the reader wrote them,
    #: writable, where it made them as one block; the owner of the table may reuse that memory
    #: (analyze/prepare.py leaves the warm-up out in place) and the frame is then not the same
    int_block: tuple | None = field(default=None, repr=False)
    #: each rank's first rows, left out of `frame` as the files were read where the analysis
    #: asked (readers/warm_split.WarmRows: the rows, how many per rank, and how to put them
    #: back); None where the frame holds every row
    warm: object | None = field(default=None, repr=False)

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    def mesh_dims(self) -> dict[str, str]:
        """{process group name: mesh dimension} over all ranks (knob `mesh_dims`: recorded
        runs from the model's DTensor parameters, traces from pg_config's pg_desc)."""
        out: dict[str, str] = {}
        for info in self.ranks.values():
            dims = info.knobs.get("mesh_dims")
            if isinstance(dims, dict):
                out.update({str(k): str(v) for k, v in dims.items() if isinstance(v, str)})
        return out

    def knobs(self) -> dict:
        """Knobs of the lowest rank (ranks normally share their settings)."""
        if not self.ranks:
            return {}
        return dict(self.ranks[self.rank_ids[0]].knobs)


def key_parts(comm: pd.DataFrame) -> tuple[pd.Categorical, pd.Categorical]:
    """(kind, group) of each row of a collectives table ("all_reduce:ddp" -> "all_reduce",
    "ddp"; no group: ""), as categoricals worked out once per distinct key (a run has a handful
    of keys and up to millions of rows); the record reader stores them as columns."""
    if "kind" in comm and "group" in comm and isinstance(comm["kind"].dtype, pd.CategoricalDtype):
        return comm["kind"].array, comm["group"].array
    return parts_of_codes(*key_codes(comm))


def key_codes(comm: pd.DataFrame) -> tuple[np.ndarray, list]:
    """(each row's key code, -1 where missing; the keys) of a collectives table: the
    categorical's own codes where the key is one, else factorized."""
    key = comm["key"]
    if isinstance(key.dtype, pd.CategoricalDtype):
        return key.cat.codes.to_numpy(), list(key.cat.categories)
    codes, uniques = pd.factorize(key)
    return codes, list(uniques)


def split_keys(keys: list) -> tuple[list[str], list[str]]:
    """(kinds, groups) of keys "kind:group" ("all_reduce:ddp" -> "all_reduce", "ddp"; no
    group: "")."""
    parts = [str(k).split(":", 1) for k in keys]
    return [p[0] for p in parts], [p[1] if len(p) > 1 else "" for p in parts]


def parts_of_codes(codes: np.ndarray, keys: list) -> tuple[pd.Categorical, pd.Categorical]:
    """key_parts of the rows whose keys are keys[code] (code -1: missing, read as "")."""
    def cat(names: list[str]) -> pd.Categorical:
        cats, inv = np.unique(np.array(names + [""], dtype=object), return_inverse=True)
        return pd.Categorical.from_codes(inv.reshape(-1)[codes], categories=cats)

    return tuple(cat(names) for names in split_keys(keys))


def present_keys(comm: pd.DataFrame) -> list[str]:
    """The distinct keys of a collectives table's rows, as strings, in order of first appearance
    (worked out on the categorical's codes: a handful of keys over up to millions of rows)."""
    key = comm["key"]
    if isinstance(key.dtype, pd.CategoricalDtype):
        codes = pd.unique(key.cat.codes.to_numpy())
        cats = key.cat.categories
        return [str(cats[c]) for c in codes.tolist() if c >= 0]
    return [str(k) for k in pd.unique(key.to_numpy(dtype=object)) if not pd.isna(k)]


def mask_of(cat: pd.Categorical, test) -> np.ndarray:
    """Bool per row: test(value), evaluated once per category."""
    per = np.array([bool(test(c)) for c in cat.categories] + [False], dtype=bool)
    return per[cat.codes]  # code -1 (missing) reads the trailing False


def ns_column(frame: pd.DataFrame, name: str) -> np.ndarray:
    """Column `name` as int64 ns, negatives as 0; zeros where the frame lacks it."""
    if name in frame:
        return np.maximum(frame[name].to_numpy(dtype=np.int64), 0)
    return np.zeros(len(frame), dtype=np.int64)


def empty_frame() -> pd.DataFrame:
    cols = list(KEY_COLUMNS) + list(TIME_COLUMNS) + list(DETAIL_COLUMNS)
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})


class Shares(Mapping):
    """Per row, the disjoint parts of the step as fractions of it: data, transfer (exposed comm
    minus waiting and bubble), wait (for slower ranks in a collective), bubble (waiting on
    another pipeline stage), compute, other; and host, the part of other in which the GPU waited
    for the host to launch work (0 where unknown). Each part is worked out when asked, not
    kept: a caller reducing them one at a time holds one row-long array, not seven."""

    _KEYS = ("data", "transfer", "wait", "bubble", "compute", "other", "host")
    _COLUMN = {"data": "data_ns", "wait": "wait_ns", "bubble": "bubble_ns",
               "compute": "compute_ns", "other": "other_ns", "host": "host_ns"}

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame
        # (each array below made in one pass: the int columns cast as they are read)
        self.step = np.maximum(self._col("step_ns"), 1.0, dtype=np.float64)

    def _col(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy()

    def absent(self, part: str) -> bool:
        """Whether the part is 0 in every row because the frame has no column for it (bubble
        and host where nothing measured them): a caller may skip the row-long zeros."""
        return part in ("bubble", "host") and self._COLUMN[part] not in self.frame

    def __getitem__(self, part: str) -> np.ndarray:
        if part not in self._KEYS:
            raise KeyError(part)
        if self.absent(part):
            return np.zeros(len(self.frame))
        if part == "transfer":
            out = np.subtract(self._col("comm_exposed_ns"), self._col("wait_ns"),
                              dtype=np.float64)
            if not self.absent("bubble"):
                out -= self._col("bubble_ns")
            np.maximum(out, 0.0, out=out)
            out /= self.step
            return out
        return np.divide(self._col(self._COLUMN[part]), self.step, dtype=np.float64)

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


def shares(frame: pd.DataFrame) -> Shares:
    """The parts of each row's step as fractions of it (Shares: worked out when asked)."""
    return Shares(frame)
