"""Per-rank summaries of the analysed rows: the mean of each part per step and its share of the
rank's time, the compute phases, and the timed collectives by kind (in numpy: the collective table has
a row per rank, step and collective, up to millions)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import RankResult
from ..runtable import GRADS_COLUMN, RunTable, key_codes, key_parts, mask_of, split_keys
from ..vocab import COMPUTE_PHASES, PARTS
from .rowgroups import Groups, PerRank, in_analysed


def analysed_rows(comm: pd.DataFrame | None, frame: pd.DataFrame, mapping) -> np.ndarray | None:
    """Bool per row of a collectives table: in an analysed step (rowgroups.in_analysed); None
    without a table. Worked out once for the callers below that take `hit`."""
    if comm is None or comm.empty:
        return None
    return in_analysed(frame, mapping, comm["rank"].to_numpy(np.int64),
                       comm["step"].to_numpy(np.int64))[0]


def comm_by_kind(table: RunTable, frame: pd.DataFrame, mapping,
                 columns: tuple[str, ...] = ("comm_ns",), part: int = 0,
                 hit: np.ndarray | None = None) -> list[dict[int, dict]]:
    """For each column: per rank, {kind: mean ns per analysed step} of the timed collectives
    (their time, comm_ns, or the part the step was blocked on, exposed_ns); `part` 1: by process
    group instead of kind. `hit`: analysed_rows(table.comm, frame, mapping), when the caller
    has it."""
    return comm_by_parts(table, frame, mapping, columns, hit)[part]


def comm_by_parts(table: RunTable, frame: pd.DataFrame, mapping,
                  columns: tuple[str, ...] = ("comm_ns",), hit: np.ndarray | None = None
                  ) -> tuple[list[dict[int, dict]], list[dict[int, dict]]]:
    """comm_by_kind by kind and by process group at once: the table (a row per rank, step and
    collective, up to millions) is summed once per (rank, key) in numpy, and the handful of
    keys ("kind:group") folded into their kinds and groups after. The sums are of integer ns
    in float64, exact in any order (below 2**53 ns: 104 days)."""
    comm = table.comm
    if comm is None or comm.empty:
        return [{} for _ in columns], [{} for _ in columns]
    code, keys = key_codes(comm)
    # analysed steps only (micro-steps counted in the optimizer step they belong to)
    if hit is None:
        hit = analysed_rows(comm, frame, mapping)
    ok = hit & (code >= 0)
    if not ok.any():
        return [{} for _ in columns], [{} for _ in columns]
    n_keys = len(keys)
    r = comm["rank"].to_numpy(np.int64)
    summed = _cell_sums(r, code, ok, n_keys)
    seen = np.flatnonzero(summed(None)).tolist()
    n_steps = np.bincount(frame["rank"].to_numpy(np.int64))
    names = split_keys(keys)
    outs: tuple[list, list] = ([], [])
    for column in columns:
        total = summed(comm[column].to_numpy())
        for part, out in enumerate(outs):
            sums: dict[int, dict] = {}
            for c in seen:
                rank, k = divmod(c, n_keys)
                per = sums.setdefault(rank, {})
                per[names[part][k]] = per.get(names[part][k], 0.0) + float(total[c])
            out.append({rank: {n: v / int(n_steps[rank]) for n, v in sorted(per.items())}
                        for rank, per in sums.items()})
    return outs


def _cell_sums(r: np.ndarray, code: np.ndarray, ok: np.ndarray, n_keys: int):
    """A function of a row-long column (None: each row counts 1) that sums it per (rank, key)
    cell (rank * n_keys + key) over the rows `ok`, no row-long copies where there is one key:
    all rows summed by rank, less the few rows left out (integer ns in float64: exact)."""
    size = (int(r.max()) + 1) * n_keys
    if n_keys == 1:
        out = np.flatnonzero(~ok)  # the rows left out (a warm-up step: one per rank)
        groups = Groups(r)  # sorted ranks (the readers' tables): runs summed where they lie

        def summed(w):
            total = np.zeros(size)
            total[groups.keys] = groups.counts if w is None else groups.sum(w)
            if out.size:
                total -= np.bincount(r[out], None if w is None else w[out], minlength=size)
            return total
        return summed
    cell = r * n_keys + code
    np.putmask(cell, ~ok, size)  # the rows left out: one cell past the others
    return lambda w: np.bincount(cell, w, minlength=size + 1)[:size]


#: the recorder's keys of gradient synchronization: DDP's backward tail, FSDP's reduce-scatters
GRAD_GROUPS, GRAD_KINDS = ("ddp",), ("reduce_scatter",)


def grad_sync_share(table: RunTable, frame: pd.DataFrame, mapping,
                    hit: np.ndarray | None = None, rank: int | None = None) -> float | None:
    """The share of the analysed steps' exposed communication (collectives table) that
    synchronized gradients: what syncing less often can save, where the loop's own collectives
    (metrics, an EMA, a sampler's all-gather) stay. Traces mark it by when each collective was
    issued (GRADS_COLUMN); a record by its key (the DDP tail, FSDP's reduce-scatters). `rank`:
    that rank's alone. None without a collectives table or exposed communication."""
    comm = table.comm
    if comm is None or comm.empty:
        return None
    if hit is None:
        hit = analysed_rows(comm, frame, mapping)
    if rank is not None:
        hit = hit & (comm["rank"].to_numpy() == rank)
    exposed = comm["exposed_ns"].to_numpy(np.float64)[hit]
    total = float(exposed.sum())
    if total <= 0:
        return None
    if GRADS_COLUMN in comm:
        grads = comm[GRADS_COLUMN].to_numpy(np.float64)[hit]
    else:
        kind, group = key_parts(comm)
        mask = (mask_of(group, lambda g: g in GRAD_GROUPS)
                | mask_of(kind, lambda k: k in GRAD_KINDS))[hit]
        grads = np.where(mask, exposed, 0.0)
    return float(min(grads.sum() / total, 1.0))


def summarize_ranks(table: RunTable, frame: pd.DataFrame, telemetry: dict,
                    by_kind: dict, per_rank: PerRank | None = None) -> list[RankResult]:
    """Per rank: mean ns per step of each part, its share of the rank's summed step time in %
    (the same figure: mean part over mean step); the compute phases, collectives by kind and the
    breakdown of "other" where known. `per_rank`: means already known for these rows."""
    per_rank = per_rank or PerRank(frame)
    g = per_rank.groups
    med = {p: per_rank.mean(f"{p}_ns").tolist() for p in ("step",) + PARTS}
    step_total = np.maximum(per_rank.sum("step_ns"), 1.0)
    share = lambda col: (100 * per_rank.sum(col) / step_total).tolist()  # noqa: E731
    pct = {p: share(f"{p}_ns") for p in PARTS}
    phases = [p for p in COMPUTE_PHASES if f"{p}_ns" in frame and frame[f"{p}_ns"].any()]
    phase_med = {p: per_rank.mean(f"{p}_ns").tolist() for p in phases}
    phase_pct = {p: share(f"{p}_ns") for p in phases}
    between = (share("between_ns") if table.source == "record" and "between_ns" in frame
               and frame["between_ns"].notna().all() else None)
    host = share("host_ns") if "host_ns" in frame and frame["host_ns"].any() else None
    after_syncs, in_maths, in_python = (
        share(c) if host is not None and c in frame and frame[c].any() else None
        for c in ("sync_idle_ns", "cpu_math_ns", "python_ns"))
    has_bubble = "bubble_ns" in frame and frame["bubble_ns"].any()
    bubble_med = per_rank.mean("bubble_ns").tolist() if has_bubble else None
    bubble_pct = share("bubble_ns") if has_bubble else None
    out = []
    for i, rank in enumerate(g.keys.tolist()):
        info = table.ranks.get(rank)
        out.append(RankResult(
            rank, info.host if info else "", int(g.counts[i]), med["step"][i],
            *(med[p][i] for p in PARTS), *(pct[p][i] for p in PARTS),
            telemetry=telemetry.get(rank), gpu_breakdown=table.gpu_breakdown.get(rank),
            phases_ns={p: phase_med[p][i] for p in phases},
            phases_pct={p: phase_pct[p][i] for p in phases},
            comm_by_kind=by_kind.get(rank, {}),
            between_pct=between[i] if between is not None else None,
            host_pct=host[i] if host is not None else None,
            sync_idle_pct=after_syncs[i] if after_syncs is not None else None,
            cpu_math_pct=in_maths[i] if in_maths is not None else None,
            python_pct=in_python[i] if in_python is not None else None,
            bubble_ns=bubble_med[i] if has_bubble else 0.0,
            bubble_pct=bubble_pct[i] if has_bubble else 0.0))
    return out
