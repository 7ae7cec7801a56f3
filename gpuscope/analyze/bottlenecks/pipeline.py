"""Pipeline stages: per stage how busy it is and how long it waits on its neighbours, the bubble
against the schedule's ideal, the slowest stage, and what to change.

- busy = step - wait (on other ranks in collectives) - bubble (on other stages, point to point);
  the slowest stage is the busiest, and in a pipeline every stage runs at its pace.
- ideal bubble: with S stages and M micro-batches, GPipe and 1F1B leave each stage idle for
  S - 1 of the M + S - 1 micro-batch slots, (S - 1) / (M + S - 1), when stages are balanced.
- step model (GPipe and 1F1B): with per-micro-batch stage times t_s = busy_s / M, a step takes
  sum(t_s) to fill and drain plus (M - 1) max(t_s) in steady state, so
  step ~ sum(busy) / M + (M - 1) / M * max(busy). Estimates scale the measured step by this
  model's ratio after / before the change, so what the model leaves out (optimizer, Python)
  stays as measured.
- repartition: move whole layers from the slowest stage to its lighter neighbour. A layer's cost
  on the stage is taken as its share of the stage's parameters times the stage's compute (the
  recorder notes each stage's top-level layers with their parameter counts). Without the layers
  (profiler traces) the suggestion gives the time to move instead.
- more micro-batches: with balanced stages the bubble is the schedule's; M' micro-batches of the
  same global batch shrink the fill and drain, while the stages' work outside compute (the
  schedule's own, per micro-batch) grows M'/M times.
- blocking neighbours: balanced stages whose bubble is well above the ideal wait on each other
  beyond fill and drain (blocking send/recv posted late serialize the stages).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ...results import PipelineResult, StageResult, Suggestion
from ...runtable import RunTable
from ...vocab import MS, PIPELINE
from ..layout import Layout
from .spec import Bottleneck

LABEL = PIPELINE


def recoverable(t, frame: pd.DataFrame) -> float | None:
    """What a pipeline change can recover at most: each step's largest wait and bubble, the
    mean over steps; None without rows."""
    if frame.empty:
        return None
    lost = frame["wait_ns"].to_numpy(np.float64)
    if "bubble_ns" in frame:
        lost = lost + frame["bubble_ns"].to_numpy(np.float64)
    return float(pd.Series(lost).groupby(frame["step"].to_numpy()).max().mean())


SPEC = Bottleneck(LABEL, "bubble_share", "bubble", "the bubble and the waiting", recoverable)


BALANCED = 1.15   # slowest stage's busy within 15% of the mean: balanced
EXCESS = 0.10     # bubble this far above the ideal (share of the step): stages block each other
#: more micro-batches only when that saves this share of the step by the model: smaller
#: micro-batches cost per-micro-batch overhead inside compute (launches, small-matrix
#: efficiency) that one run cannot measure; on 2 stages, 4 -> 8 micro-batches of a small model
#: ran 9% slower in tests/workloads/parallel.py although the bubble fell from 22% to 16%
MICRO_GAIN = 0.15


def model_step(busy: list[float], m: int | None) -> float:
    """GPipe / 1F1B step time from per-stage busy time per step and M micro-batches (None:
    unknown, taken as many: the slowest stage alone sets the pace)."""
    if m is None:
        return max(busy)
    m = max(m, 1)
    return sum(busy) / m + (m - 1) / m * max(busy)


def _microbatches(table: RunTable, rank: int) -> int | None:
    info = table.ranks.get(rank)
    n = info.knobs.get("forwards_per_step") if info else None
    return int(n) if isinstance(n, int) and n > 0 else None


def summarize_pipeline(table: RunTable, frame: pd.DataFrame, layout: Layout,
                       exposed_by_kind: dict[int, dict]) -> PipelineResult | None:
    """The stages' figures over the analysed steps, means per step (None without pipeline
    stages)."""
    ranks = [r for r in layout.stage_ranks if r in set(frame["rank"].tolist())]
    if not ranks or "bubble_ns" not in frame:
        return None
    sub = frame[frame["rank"].isin(ranks)]
    # means per step, as every figure of the report
    meds = sub.assign(busy_ns=sub["step_ns"] - sub["wait_ns"] - sub["bubble_ns"]) \
        .groupby("rank").mean(numeric_only=True)
    stages = []
    sides = _side_waits(table.comm, sub) if "micro_steps" not in sub else None
    for r in ranks:
        m = meds.loc[r]
        if sides is not None:
            prev, nxt = sides.get((r, "prev"), 0.0), sides.get((r, "next"), 0.0)
        else:  # optimizer steps of several micro-steps: means per step
            kinds = exposed_by_kind.get(r, {})
            prev = sum(v for k, v in kinds.items() if k.endswith("_prev"))
            nxt = sum(v for k, v in kinds.items() if k.endswith("_next"))
        where = layout.stage_of(r)
        stages.append(StageResult(
            int(r), where[1] if where else None, where[0] if where else None,
            float(m["step_ns"]), float(max(m["busy_ns"], 0.0)),
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
    p = PipelineResult(tuple(stages), n_stages, m, share, ideal, slowest.rank, 1.0)
    return replace(p, imbalance=imbalance(stage_view(p)))


def _side_waits(comm: pd.DataFrame | None, frame: pd.DataFrame) -> dict | None:
    """{(rank, "prev" | "next"): mean per analysed step of the exposed point-to-point time
    with that side's neighbour} from the recorder's collectives table."""
    if comm is None or comm.empty:
        return None
    kind = comm["key"].str.split(":", n=1).str[0]
    side = np.where(kind.str.endswith("_prev"), "prev",
                    np.where(kind.str.endswith("_next"), "next", ""))
    c = comm.assign(side=side)
    c = c[c["side"] != ""]
    per = c.groupby(["rank", "step", "side"])["exposed_ns"].sum().unstack("side", fill_value=0)
    idx = pd.MultiIndex.from_frame(frame[["rank", "step"]])
    per = per.reindex(idx, fill_value=0)
    out = {}
    for s in per.columns:
        for r, v in per[s].groupby(level="rank").mean().items():
            out[(int(r), s)] = float(v)
    return out


def _layers(table: RunTable, rank: int) -> list[tuple[str, int]]:
    info = table.ranks.get(rank)
    out = []
    for item in (info.knobs.get("layers") or []) if info else []:
        try:
            out.append((str(item[0]), int(item[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return out


@dataclass(frozen=True)
class _Stage:
    """One stage of the pipeline, over its replicas (median of their ranks)."""

    stage: int | None
    ranks: tuple[int, ...]
    busy_ns: float
    compute_ns: float

    @property
    def name(self) -> str:
        ranks = ", ".join(str(r) for r in self.ranks)
        plural = "s" if len(self.ranks) > 1 else ""
        return f"stage {self.stage} (rank{plural} {ranks})" if self.stage is not None \
            else f"rank {ranks}"


def stage_view(p: PipelineResult) -> list[_Stage]:
    """The stages in order, each as its least busy replica: a stage slow in one replica only
    is a straggler there (imbalance), not a partition to change (with two replicas a median
    would still carry half of the slow one's excess: a busy-core run of 2 replicas x 2 stages
    with one slow rank got a repartition suggestion from it). Without a known order (traces),
    each stage rank on its own."""
    if all(s.stage is not None for s in p.stages):
        by: dict[int, list[StageResult]] = {}
        for s in p.stages:
            by.setdefault(s.stage, []).append(s)
        view = []
        for k, v in sorted(by.items()):
            least = min(v, key=lambda x: x.busy_ns)
            view.append(_Stage(k, tuple(x.rank for x in v), float(least.busy_ns),
                               float(least.compute_ns)))
        return view
    return [_Stage(None, (s.rank,), s.busy_ns, s.compute_ns) for s in p.stages]


def imbalance(view: list[_Stage]) -> float:
    busy = [s.busy_ns for s in view]
    return max(busy) / max(float(np.mean(busy)), 1.0) if busy else 1.0


def suggest_repartition(p: PipelineResult, table: RunTable, step_ns: float) -> list[Suggestion]:
    view = stage_view(p)
    if len(view) < 2 or imbalance(view) < BALANCED:
        return []
    heavy = max(view, key=lambda s: s.busy_ns)
    others = [s for s in view if s is not heavy]
    if heavy.stage is not None:  # its neighbours in the chain
        near = [s for s in others if abs(s.stage - heavy.stage) == 1]
    else:
        near = others
    target = min(near or others, key=lambda s: s.busy_ns)
    rest_max = max((s.busy_ns for s in others if s is not target), default=0.0)
    layers = _layers(table, heavy.ranks[0])
    total = sum(n for _, n in layers)

    def shifted(moved: float) -> list[float]:  # the stages' busy time, `moved` across one boundary
        return [s.busy_ns - moved if s is heavy else s.busy_ns + moved if s is target
                else s.busy_ns for s in view]

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
        share = 100 * sum(n for _, n in order[:best]) / total
        side = "first" if order is layers else "last"
        proposed = (f"move its {side} {best} layer(s) ({', '.join(names)}) from {heavy.name} "
                    f"to {target.name}")
        how = (f"{best} of its {len(layers)} layers ({share:.0f}% of its parameters; a layer's "
               "cost is taken as its share of the stage's parameters)")
        after = shifted(moved)
    elif heavy.stage is not None and len(view) > 2:
        # stages in order, layers unknown: shift every boundary so each stage does the mean
        # (boundary k carries the excess of stages 0..k over the mean to the stage after it)
        mean = float(np.mean([s.busy_ns for s in view]))
        flows = np.cumsum([s.busy_ns - mean for s in view])[:-1]
        moves = [(view[k], view[k + 1], f) if f > 0 else (view[k + 1], view[k], -f)
                 for k, f in enumerate(flows) if abs(f) >= 0.01 * mean]
        moves.sort(key=lambda x: -x[2])
        proposed = "; ".join(f"move ~{f / MS:.1f} ms of work per step from {a.name} to {b.name}"
                             for a, b, f in moves)
        how = ("work across the stage boundaries (the input does not say which layers each "
               "stage holds)")
        best_max, after = mean, [mean] * len(view)
    else:
        moved = (heavy.busy_ns - target.busy_ns) / 2
        best_max = max(heavy.busy_ns - moved, rest_max)
        proposed = f"move ~{moved / MS:.1f} ms of work per step from {heavy.name} to {target.name}"
        how = "that much work (the trace does not say which layers each stage holds)"
        after = shifted(moved)
    m = p.microbatches
    before = [s.busy_ns for s in view]
    est = step_ns * model_step(after, m) / max(model_step(before, m), 1.0)
    if step_ns - est < 0.03 * step_ns:
        return []
    current = f"{heavy.name} busy {heavy.busy_ns / MS:.1f} ms, {target.name} {target.busy_ns / MS:.1f} ms"
    why = (f"every stage runs at the pace of the slowest: {heavy.name} is busy "
           f"{heavy.busy_ns / MS:.1f} ms per step against {target.busy_ns / MS:.1f} ms on "
           f"{target.name}, which waits for it; moving {how} evens them out to a slowest stage "
           f"of ~{best_max / MS:.1f} ms"
           + ("" if m else " (micro-batches per step unknown: the estimate takes the slowest "
              "stage as setting the pace, as with many micro-batches)"))
    why += ("; assumes a layer's cost is its share of the stage's parameters (range: +-10%, "
            "measured -4% to -2% against re-partitioned runs)" if len(layers) >= 2 else
            "; assumes the work can be split that finely and moves at its cost (range: +-10%)")
    return [Suggestion("pipeline_partition", current, proposed, est / MS, why, PIPELINE,
                       (step_ns / max(est, 1.0) - 1) * 100,
                       (0.9 * est / MS, min(1.1 * est, step_ns) / MS))]


def suggest_microbatches(p: PipelineResult, step_ns: float) -> tuple[list[Suggestion], str]:
    m, s = p.microbatches, p.n_stages
    view = stage_view(p)
    if not m or s < 2 or imbalance(view) >= BALANCED or p.bubble_share < 0.05:
        return [], ""
    new = max(2 * m, 4 * s)
    busy = [x.busy_ns for x in view]
    # compute splits with the micro-batches; the rest of a stage's busy time (the schedule's
    # own work, launches) is per micro-batch and grows with their number
    after = [x.compute_ns + (x.busy_ns - x.compute_ns) * new / m for x in view]
    est = step_ns * model_step(after, new) / max(model_step(busy, m), 1.0)
    if step_ns - est < MICRO_GAIN * step_ns:
        return [], (f"the stages are balanced and the bubble ({100 * p.bubble_share:.0f}%) is "
                    f"the schedule's own ({100 * (p.ideal_bubble_share or 0):.0f}% for {s} stages "
                    f"and {m} micro-batches); {new} micro-batches would save at most "
                    f"{100 * max(step_ns - est, 0) / step_ns:.0f}% of the step, less than smaller "
                    "micro-batches usually cost in per-micro-batch overhead")
    why = (f"the stages are balanced (slowest within {100 * (imbalance(view) - 1):.0f}% of the "
           f"mean) and {100 * p.bubble_share:.0f}% of each step is bubble; with {s} stages and "
           f"{m} micro-batches GPipe and 1F1B idle {100 * (s - 1) / (m + s - 1):.0f}% by "
           f"construction, {new} micro-batches of the same global batch leave "
           f"{100 * (s - 1) / (new + s - 1):.0f}% (the estimate counts the stages' work outside "
           "compute once per micro-batch; keep each micro-batch large enough to fill the device)")
    return [Suggestion("n_microbatches", m, new, est / MS, why, PIPELINE,
                       (step_ns / max(est, 1.0) - 1) * 100, (est / MS, step_ns / MS))], ""


def suggest_overlap(p: PipelineResult, step_ns: float) -> list[Suggestion]:
    if p.ideal_bubble_share is None or imbalance(stage_view(p)) >= BALANCED:
        return []
    excess = p.bubble_share - p.ideal_bubble_share
    if excess < EXCESS:
        return []
    est = step_ns * (1 - excess)
    why = (f"the stages are balanced, yet {100 * p.bubble_share:.0f}% of each step is spent "
           f"waiting on neighbours against {100 * p.ideal_bubble_share:.0f}% that fill and drain "
           f"of {p.microbatches} micro-batches over {p.n_stages} stages explain: the stages "
           "block each other in between; post receives before computing (irecv / isend, "
           "batch_isend_irecv) so a stage's send does not wait on its neighbour's compute, or "
           "run a torch.distributed.pipelining schedule (ScheduleGPipe, Schedule1F1B)")
    return [Suggestion("p2p_overlap", f"bubble {100 * p.bubble_share:.0f}%",
                       f"~{100 * p.ideal_bubble_share:.0f}% (the schedule's ideal)", est / MS,
                       why + "; assumes the excess bubble goes entirely (range: none of it)",
                       PIPELINE, (step_ns / max(est, 1.0) - 1) * 100, (est / MS, step_ns / MS))]


def suggest_pipeline(p: PipelineResult | None, table: RunTable,
                     step_ns: float) -> tuple[list[Suggestion], str]:
    """Suggestions for a pipeline-bound run, or why there is none."""
    if p is None:
        return [], ""
    out = suggest_repartition(p, table, step_ns) or suggest_overlap(p, step_ns)
    if out:
        return out, ""
    return suggest_microbatches(p, step_ns)
