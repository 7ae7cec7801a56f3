"""Pipeline stages: per stage how busy it is and how long it waits on its neighbours, the bubble
against the schedule's ideal, the slowest stage, and what to change.

- busy = step - wait (on other ranks in collectives) - bubble (on other stages, point to point);
  the slowest stage is the busiest, and in a pipeline every stage runs at its pace.
- ideal bubble: with S stages and M micro-batches, GPipe and 1F1B leave each stage idle for
  S - 1 of the M + S - 1 micro-batch slots, (S - 1) / (M + S - 1), when stages are balanced.
- repartition: move whole layers from the slowest stage to its lighter neighbour. A layer's cost
  on the stage is taken as its share of the stage's parameters times the stage's compute (the
  recorder notes each stage's top-level layers with their parameter counts); the estimated step
  loses what the slowest stage sheds, less what its new busiest stage gains. Without the layers
  (profiler traces) the suggestion gives the time to move instead.
- more micro-batches: with balanced stages the bubble is the schedule's; M' micro-batches of the
  same global batch scale the step by ((M' + S - 1) / M') / ((M + S - 1) / M).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..report import PipelineResult, StageResult, Suggestion
from ..runtable import RunTable
from ..vocab import MS, PIPELINE
from .layout import Layout

BALANCED = 1.15   # slowest stage's busy within 15% of the mean: balanced


def _microbatches(table: RunTable, rank: int) -> int | None:
    info = table.ranks.get(rank)
    n = info.knobs.get("forwards_per_step") if info else None
    return int(n) if isinstance(n, int) and n > 0 else None


def summarize_pipeline(table: RunTable, frame: pd.DataFrame, layout: Layout,
                       exposed_by_kind: dict[int, dict]) -> PipelineResult | None:
    """The stages' figures over the analysed steps (None without pipeline stages)."""
    ranks = [r for r in layout.stage_ranks if r in set(frame["rank"].tolist())]
    if not ranks or "bubble_ns" not in frame:
        return None
    means = frame[frame["rank"].isin(ranks)].groupby("rank").mean(numeric_only=True)
    stages = []
    for r in ranks:
        m = means.loc[r]
        kinds = exposed_by_kind.get(r, {})
        prev = sum(v for k, v in kinds.items() if k.endswith("_prev"))
        nxt = sum(v for k, v in kinds.items() if k.endswith("_next"))
        where = layout.stage_of(r)
        stages.append(StageResult(
            int(r), where[1] if where else None, where[0] if where else None,
            float(m["step_ns"]), float(max(m["step_ns"] - m["wait_ns"] - m["bubble_ns"], 0.0)),
            float(m["compute_ns"]), float(prev), float(nxt), float(m["bubble_ns"]),
            _microbatches(table, r)))
    stages.sort(key=lambda s: (s.pipeline if s.pipeline is not None else -1,
                               s.stage if s.stage is not None else s.rank))
    n_stages = (max(len(c) for c in layout.chains) if layout.chains
                else len(stages) // max(len(layout.chains), 1))
    micro = [s.microbatches for s in stages if s.microbatches]
    m = int(np.median(micro)) if micro else None
    ideal = (n_stages - 1) / (m + n_stages - 1) if m and n_stages > 1 else None
    busy = np.array([s.busy_ns for s in stages])
    slowest = stages[int(busy.argmax())]
    share = float(np.mean([s.bubble_ns / max(s.step_ns, 1.0) for s in stages]))
    return PipelineResult(tuple(stages), n_stages, m, share, ideal, slowest.rank,
                          float(busy.max() / max(busy.mean(), 1.0)))


def _layers(table: RunTable, rank: int) -> list[tuple[str, int]]:
    info = table.ranks.get(rank)
    out = []
    for item in (info.knobs.get("layers") or []) if info else []:
        try:
            out.append((str(item[0]), int(item[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return out


def _chain_of(p: PipelineResult, stage: StageResult) -> list[StageResult]:
    if stage.pipeline is None:
        return list(p.stages)
    return [s for s in p.stages if s.pipeline == stage.pipeline]


def suggest_repartition(p: PipelineResult, table: RunTable, step_ns: float) -> list[Suggestion]:
    heavy = p.slowest()
    chain = _chain_of(p, heavy)
    if len(chain) < 2 or p.imbalance < BALANCED:
        return []
    others = [s for s in chain if s.rank != heavy.rank]
    if heavy.stage is not None:  # its neighbours in the chain
        near = [s for s in others if s.stage is not None and abs(s.stage - heavy.stage) == 1]
    else:
        near = others
    target = min(near or others, key=lambda s: s.busy_ns)
    rest_max = max((s.busy_ns for s in others if s.rank != target.rank), default=0.0)
    layers = _layers(table, heavy.rank)
    total = sum(n for _, n in layers)
    where = (f"stage {heavy.stage} (rank {heavy.rank})" if heavy.stage is not None
             else f"rank {heavy.rank}")
    dest = (f"stage {target.stage} (rank {target.rank})" if target.stage is not None
            else f"rank {target.rank}")
    if len(layers) >= 2 and total > 0 and heavy.compute_ns > 0:
        # move boundary layers: its first ones to the previous stage, its last to the next
        order = layers if (target.stage is None or heavy.stage is None
                           or target.stage < heavy.stage) else layers[::-1]
        best, best_max, moved = 0, max(heavy.busy_ns, target.busy_ns), 0.0
        cost = 0.0
        for j in range(1, len(order)):
            cost += heavy.compute_ns * order[j - 1][1] / total
            new_max = max(heavy.busy_ns - cost, target.busy_ns + cost, rest_max)
            if new_max < best_max:
                best, best_max, moved = j, new_max, cost
        if best == 0:
            return []
        names = [n for n, _ in order[:best]]
        proposed = f"move layer(s) {', '.join(names)} from {where} to {dest}"
        how = (f"{best} of its {len(layers)} layers ({100 * sum(n for _, n in order[:best]) / total:.0f}% "
               "of its parameters; a layer's cost is taken as its share of the stage's "
               "parameters)")
    else:
        moved = (heavy.busy_ns - target.busy_ns) / 2
        best_max = max(heavy.busy_ns - moved, rest_max)
        proposed = f"move ~{moved / MS:.1f} ms of work per step from {where} to {dest}"
        how = "work (the trace does not say which layers each stage holds)"
    est = max(step_ns - (heavy.busy_ns - best_max), best_max)
    if step_ns - est < 0.03 * step_ns:
        return []
    current = f"{where} busy {heavy.busy_ns / MS:.1f} ms, {dest} {target.busy_ns / MS:.1f} ms"
    why = (f"every stage runs at the pace of the slowest: {where} is busy "
           f"{heavy.busy_ns / MS:.1f} ms per step against {target.busy_ns / MS:.1f} ms on {dest}, "
           f"which waits for it; moving {how} evens them out to a slowest stage of "
           f"~{best_max / MS:.1f} ms")
    return [Suggestion("pipeline_partition", current, proposed, est / MS, why, PIPELINE,
                       (step_ns / max(est, 1.0) - 1) * 100)]


def suggest_microbatches(p: PipelineResult, step_ns: float) -> list[Suggestion]:
    m, s = p.microbatches, p.n_stages
    if not m or s < 2 or p.imbalance >= BALANCED or p.bubble_share < 0.05:
        return []
    new = max(2 * m, 4 * s)
    factor = ((new + s - 1) / new) / ((m + s - 1) / m)
    est = step_ns * factor
    why = (f"the stages are balanced (slowest within {100 * (p.imbalance - 1):.0f}% of the "
           f"mean) and {100 * p.bubble_share:.0f}% of each step is bubble; with {s} stages and "
           f"{m} micro-batches GPipe and 1F1B idle {100 * (s - 1) / (m + s - 1):.0f}% by "
           f"construction, {new} micro-batches of the same global batch leave "
           f"{100 * (s - 1) / (new + s - 1):.0f}% (smaller micro-batches may run less "
           "efficiently: keep each large enough to fill the device)")
    return [Suggestion("n_microbatches", m, new, est / MS, why, PIPELINE,
                       (1 / factor - 1) * 100)]


def suggest_pipeline(p: PipelineResult | None, table: RunTable,
                     step_ns: float) -> list[Suggestion]:
    if p is None:
        return []
    return suggest_repartition(p, table, step_ns) or suggest_microbatches(p, step_ns)
