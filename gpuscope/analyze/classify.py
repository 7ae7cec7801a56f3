"""Labels each step data-bound, comm-bound, imbalanced, jitter-bound, host-bound, pipeline-bound
or compute-bound, and the run as a whole.

Per step, across ranks (a synchronous step is as slow as its slowest rank):
  data share     = mean over ranks of data_ns / step_ns
  comm share     = mean over ranks of (comm_exposed_ns - wait_ns) / step_ns   (exposed transfer)
  wait share     = max over ranks of wait_ns / step_ns                       (the waiting ranks)
Each share over its threshold is a candidate (each bottleneck's module, bottlenecks/, declares
its share, threshold and own rule in its SPEC; bottlenecks/table.py holds them in one order:
Bottleneck.held(steps, th)); the largest candidate is the label, the others are secondary; with
no candidate the step is compute-bound when compute is the larger of compute and "other" (time
in no op, data wait or collective gpuscope saw), else unexplained: a step made mostly of time
nobody can attribute is not the healthy state. The run verdict is the label that holds
the most step time, each step's time shared among its candidates in proportion to their shares;
compute-bound, the healthy state, must lead all lost time together (every other label's share
summed) by NEAR_TIE; else the largest lost-time label is the verdict. Whether the run is healthy
is decided before which problem it has, so how two sources split the same lost time between two
labels (waiting judged jitter in one, transfer in the other) cannot flip it.

Waiting makes a step imbalanced only when it follows a persistent pattern (consistency.py): the
step's last rank is one that is late step after step, or a rank that always waits waited. Waiting
that moves between ranks at random is jitter: still time lost, never compute. It is a candidate
of its own, "jitter-bound", with the wait share; "jitter" is listed as secondary whenever it is
over the threshold, and the report says how much time it costs. With fewer than three steps the
two cannot be told apart and waiting over the threshold counts as imbalanced (with low
confidence, confidence.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import Jitter, StepResult, Verdict
from ..runtable import shares
from ..thresholds import Thresholds
from ..vocab import COMPUTE, JITTER, JITTER_BOUND, MODERATE_DATA, UNEXPLAINED
from .bottlenecks import imbalance
from .bottlenecks.table import TABLE
from .consistency import Roles
from .rowgroups import Groups


#: the verdict's lead (share of step time) over the next label under which the two are a near
#: tie: compute-bound does not win one (confidence.py makes a near tie low)
NEAR_TIE = 0.15


def classify_steps(frame: pd.DataFrame, th: Thresholds, roles: Roles | None = None) -> pd.DataFrame:
    """One row per step: step, step_ns (slowest rank), the shares, label, secondary labels.

    `roles` (consistency.find_roles) tells persistent waiting from jitter; None counts all
    waiting over the threshold as imbalanced."""
    sh = shares(frame)
    g = Groups(frame["step"].to_numpy())
    steps = g.keys

    def per_step(part: str, how) -> np.ndarray:  # a part no column measured: 0, no rows
        return np.zeros(steps.size) if sh.absent(part) else how(sh[part])

    out = pd.DataFrame({
        "step": steps,
        "step_ns": g.max(frame["step_ns"].to_numpy()).astype(np.int64),
        "data_share": g.mean(sh["data"]), "comm_share": g.mean(sh["transfer"]),
        "wait_share": g.max(sh["wait"]), "compute_share": g.mean(sh["compute"]),
        "other_share": g.mean(sh["other"]),
        "host_share": per_step("host", g.mean), "bubble_share": per_step("bubble", g.max),
        "n_ranks": g.counts,
        "micro_steps": (g.max(frame["micro_steps"].to_numpy()).astype(np.int64)
                        if "micro_steps" in frame else np.ones(steps.size, np.int64)),
    })
    # each bottleneck's module says, per step, whether its label holds and with what share
    waits, jitter = imbalance.waiting_steps(out, th, roles)
    out["jitter"] = jitter
    out["waiting"] = waits  # read by imbalance's evidence, not kept
    cand = np.column_stack([b.held(out, th) for b in TABLE])
    names = np.array([b.label for b in TABLE])
    out = out.drop(columns="waiting")
    best = cand.argmax(axis=1)
    has = cand.max(axis=1) >= 0
    unexplained = ~has & (out["other_share"].to_numpy() > out["compute_share"].to_numpy())
    out["label"] = np.where(has, names[best], np.where(unexplained, UNEXPLAINED, COMPUTE))
    # the step's time, shared among the labels that hold in it in proportion to their shares
    # (a step 43% comm and 42% waiting is both): the run verdict sums these, so a step on the
    # edge between two labels moves the verdict by a little, not by its whole time
    held = np.maximum(cand, 0.0)
    total = held.sum(axis=1)
    for i, name in enumerate(names):
        out[f"w:{name}"] = np.where(has, held[:, i] / np.where(total > 0, total, 1.0), 0.0)
    out[f"w:{UNEXPLAINED}"] = np.where(unexplained, 1.0, 0.0)
    out[f"w:{COMPUTE}"] = np.where(has | unexplained, 0.0, 1.0)
    secondary = []
    for row_cand, b, h, data, jit in zip(cand, best, has, out["data_share"].to_numpy(), jitter):
        extra = [str(names[i]) for i in range(names.size)
                 if row_cand[i] >= 0 and (not h or i != b) and names[i] != JITTER_BOUND]
        if jit:
            extra.append(JITTER)
        if th.data_moderate <= data < th.data_high:
            extra.append(MODERATE_DATA)
        secondary.append(extra)
    out["secondary"] = secondary
    return out


def jitter_cost(steps: pd.DataFrame) -> Jitter:
    """Share of step time in jitter steps, and share of step time lost waiting in them."""
    total = float(steps["step_ns"].sum())
    if total <= 0 or "jitter" not in steps:
        return Jitter()
    j = steps[steps["jitter"]]
    step_ns = j["step_ns"].to_numpy(np.float64)
    return Jitter(float(step_ns.sum() / total),
                  float((step_ns * j["wait_share"].to_numpy()).sum() / total))


def step_results(steps: pd.DataFrame) -> list[StepResult]:
    """The typed per-step results of `classify_steps`' table."""
    cols = [steps[c].tolist() for c in ("step", "label", "step_ns", "data_share", "comm_share",
                                        "wait_share", "compute_share", "secondary",
                                        "micro_steps", "host_share", "bubble_share")]
    return [StepResult(int(st), str(lb), int(ns), d, c, w, cp, tuple(sec), int(k), hs, bs)
            for st, lb, ns, d, c, w, cp, sec, k, hs, bs in zip(*cols)]


def label_times(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(labels, (steps x labels) step time held by each label): each step's time shared among
    the labels that hold in it, in proportion to their shares (classify_steps' "w:" columns; a
    table without them counts each step's time for its label alone)."""
    step_ns = steps["step_ns"].to_numpy(np.float64)
    weights = [c for c in steps.columns if isinstance(c, str) and c.startswith("w:")]
    if weights:
        held = step_ns[:, None] * steps[weights].to_numpy(np.float64)
        keep = held.sum(axis=0) > 0
        labels = np.array([c[2:] for c in weights], dtype=object)[keep]
        held = held[:, keep]
        order = np.argsort(labels.astype(str))
        return labels[order], held[:, order]
    labels, inv = np.unique(steps["label"].to_numpy(dtype=object).astype(str), return_inverse=True)
    held = np.zeros((len(steps), labels.size))
    held[np.arange(len(steps)), inv.reshape(-1)] = step_ns
    return labels.astype(object), held


def decide(labels: np.ndarray, by: np.ndarray) -> np.ndarray:
    """The verdict's index for each row of `by` (shares of step time per label): the label
    holding the most time, but compute-bound, the healthy state, must lead all the time lost
    together by NEAR_TIE, else the largest lost-time label wins (a same-run pair split compute
    52% / lost 48% as jitter 38% + comm 6% in one source and jitter 32% + comm 11% in the
    other)."""
    by = np.atleast_2d(by)
    best = by.argmax(axis=1)
    is_compute = labels == COMPUTE
    if is_compute.any() and labels.size > 1:
        c = int(np.flatnonzero(is_compute)[0])
        lost = np.where(is_compute, -1.0, by)
        lead = by[:, c] - np.clip(lost, 0, None).sum(axis=1)
        best = np.where((best == c) & (lead < NEAR_TIE), lost.argmax(axis=1), best)
    return best


#: resamples of the steps that resampled_lead draws, and the most steps it resamples (past that
#: a share's sampling spread is ~1 point, inside the near tie that confidence checks anyway)
RESAMPLES, RESAMPLE_MAX_STEPS = 400, 4000


def resampled_lead(steps: pd.DataFrame, label: str) -> tuple[float, str] | None:
    """(share of bootstrap resamples of the steps in which another label than `label` wins, the
    one that wins most often there) where the steps as they are give `label`; None where they do
    not, or there are too few (under 3) or too many steps to resample (RESAMPLE_MAX_STEPS).
    Deterministic: the same steps draw the same resamples."""
    n = len(steps)
    if n < 3 or n > RESAMPLE_MAX_STEPS:
        return None
    labels, held = label_times(steps)
    total = held.sum()
    if total <= 0 or str(labels[int(decide(labels, held.sum(axis=0) / total)[0])]) != label:
        return None
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=RESAMPLES).astype(np.float64)
    sums = counts @ held
    by = sums / np.maximum(sums.sum(axis=1, keepdims=True), 1.0)
    got = labels[decide(labels, by)].astype(str)
    other = got[got != label]
    if not other.size:
        return 0.0, ""
    names, k = np.unique(other, return_counts=True)
    return other.size / RESAMPLES, str(names[int(k.argmax())])


def run_verdict(steps: pd.DataFrame) -> Verdict:
    """The label holding the most step time (label_times, decide)."""
    total = float(steps["step_ns"].to_numpy(np.float64).sum())
    if total <= 0:
        return Verdict(COMPUTE, 0.0, "low", {})
    labels, held = label_times(steps)
    by = held.sum(axis=0) / total
    best = int(decide(labels, by)[0])
    label, share = str(labels[best]), float(by[best])
    conf = "high" if share >= 0.75 else "medium" if share >= 0.5 else "low"
    return Verdict(label, share, conf, {str(k): round(float(v), 4) for k, v in zip(labels, by)})


def changes_without_one_step(steps: pd.DataFrame, label: str) -> tuple[int, str] | None:
    """(step, verdict) for the first step without which the run verdict would not be `label`
    (leave-one-out over the steps, in one pass); None when no single step decides it."""
    if len(steps) < 3:
        return None
    labels, held = label_times(steps)
    step_ns = steps["step_ns"].to_numpy(np.float64)
    rest = step_ns.sum() - step_ns
    ok = rest > 0
    if not ok.any():
        return None
    by = (held.sum(axis=0)[None, :] - held[ok]) / rest[ok, None]
    got = labels[decide(labels, by)]
    moved = np.flatnonzero(got.astype(str) != label)
    if not moved.size:
        return None
    i = int(moved[0])
    return int(steps["step"].to_numpy()[ok][i]), str(got[i])
