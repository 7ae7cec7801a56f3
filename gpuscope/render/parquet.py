"""`gpuscope export PATH --parquet FILE`: the analysed rank x step table, one row per rank and
(optimizer) step, with the step's label, the run's verdict, the knobs, memory where sampled and
each rank's rates, communication by mesh dimension where a DeviceMesh names the groups
(comm_<dim>_ms, comm_exposed_<dim>_ms, wait_<dim>_ms), for DuckDB, Polars or Spark over many runs. Times in ms, shares in %; pyarrow is an optional extra
(`pip install 'gpuscope[parquet]'`)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ..errors import GpuscopeError, InputError
from ..vocab import MS

if TYPE_CHECKING:
    import pandas as pd

    from ..results import ReportData

#: time columns of the analysed table, exported in ms as <name>_ms
TIMES = ("step", "data", "compute", "comm", "comm_exposed", "wait", "other", "forward",
         "backward", "optimizer", "bubble", "host", "between")
#: knobs worth a typed column of their own (all of them are also in knobs_json)
KNOB_DTYPES = {"batch_size": "Int64", "num_workers": "Int64", "sync_interval": "Int64",
               "world_size": "Int64", "device": "string", "backend": "string",
               "model": "string", "param_dtype": "string", "comm_hook": "string"}


def step_table(report: "ReportData") -> "pd.DataFrame":
    """The table a Parquet export holds (a pandas DataFrame)."""
    import pandas as pd

    if report.table is None:
        raise InputError("a report read back from JSON has no rank x step table to export: "
                         "export the run dir or traces themselves")
    f = report.table.frame
    out = pd.DataFrame({"run": report.path, "source": report.source,
                        "rank": f["rank"].astype("int32"), "step": f["step"].astype("int64"),
                        "start_unix_ns": f["start_ns"].astype("int64")})
    for name in TIMES:
        col = f"{name}_ns"
        if col in f:
            out[f"{name}_ms"] = f[col].to_numpy("float64") / MS
    if "micro_steps" in f:
        out["micro_steps"] = f["micro_steps"].astype("int32")
    step = out["step_ms"].where(out["step_ms"] > 0)
    for name in ("data", "compute", "comm_exposed", "wait", "other"):
        out[f"{name}_pct"] = (100 * out[f"{name}_ms"] / step).fillna(0.0)
    labels = {s.step: s for s in report.steps}
    out["label"] = [labels[s].label if s in labels else None for s in out["step"].tolist()]
    out["secondary"] = [",".join(labels[s].secondary) if s in labels else ""
                        for s in out["step"].tolist()]
    hosts = {r.rank: r.host for r in report.ranks}
    out["host"] = out["rank"].map(hosts).astype("string")
    out["straggler"] = out["rank"].isin(report.straggler_ranks)
    out["verdict"] = report.verdict.label
    out["world_size"] = int(report.world_size)
    knobs = report.knobs
    for name, dtype in KNOB_DTYPES.items():
        if name == "world_size":
            continue
        value = knobs.get(name)
        ok = isinstance(value, str) if dtype == "string" else (
            isinstance(value, int) and not isinstance(value, bool))
        out[name] = pd.Series([value if ok else None] * len(out), dtype=dtype)
    out["knobs_json"] = json.dumps(knobs, sort_keys=True, default=str)
    _memory_columns(out, report)
    _mesh_columns(out, report)
    per_rank = {r.rank: r.to_dict() for r in (report.throughput.per_rank
                                               if report.throughput is not None else [])}
    for key in ("samples_per_s", "tokens_per_s", "mfu_pct"):
        out[f"rank_{key}"] = pd.Series([per_rank.get(r, {}).get(key) for r in
                                        out["rank"].tolist()], dtype="Float64")
    return out.reset_index(drop=True)


#: memory columns (record/memory.py samples, in MiB), on the step that closed each sample's
#: window; null on the steps between samples
MEMORY = {"rss_bytes": "memory_resident_mib", "device_peak_bytes": "memory_device_peak_mib",
          "device_reserved_bytes": "memory_device_reserved_mib"}


def _memory_columns(out: "pd.DataFrame", report: "ReportData") -> None:
    import pandas as pd

    mem = report.table.memory if report.table is not None else None
    if mem is None or not len(mem):
        return
    keyed = mem.set_index(["rank", "step"])
    at = pd.MultiIndex.from_arrays([out["rank"].astype("int64"), out["step"]])
    for col, name in MEMORY.items():
        if col in keyed and keyed[col].notna().any():
            out[name] = (keyed[col].reindex(at).to_numpy("float64") / 2**20)
            out[name] = out[name].astype("Float64")


#: per mesh dimension D (analyze/comm_groups.dim_steps): comm_D_ms, comm_exposed_D_ms, wait_D_ms
MESH = {"comm_ns": "comm_{}_ms", "exposed_ns": "comm_exposed_{}_ms", "wait_ns": "wait_{}_ms"}


def _mesh_columns(out: "pd.DataFrame", report: "ReportData") -> None:
    import pandas as pd

    per = report.comm_by_dim_steps
    if per is None or not len(per):
        return
    at = pd.MultiIndex.from_arrays([out["rank"].astype("int64"), out["step"]])
    for dim, rows in per.groupby("dim", sort=True):
        keyed = rows.set_index(["rank", "step"])
        for col, name in MESH.items():
            if col in keyed:  # a step without that dimension's collectives: 0, it had none
                out[name.format(dim)] = keyed[col].reindex(at).fillna(0).to_numpy("float64") / MS


def write(report: "ReportData", path: str) -> int:
    """Write the table to `path` (Parquet); returns the number of rows."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise GpuscopeError("--parquet needs pyarrow: pip install 'gpuscope[parquet]'") from None
    table = pa.Table.from_pandas(step_table(report), preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           b"gpuscope.report": json.dumps({
                                               "schema": "gpuscope.steps/1",
                                               "verdict": report.verdict.label,
                                               "stragglers": report.straggler_ranks}).encode()})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(table, path)
    return table.num_rows
