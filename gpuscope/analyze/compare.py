"""Two reports of one training side by side: what each part of the step did, whether the verdict
changed, which knobs changed, and for each suggestion BEFORE made whose knob changed, the step time
it predicted against the one AFTER measured.

Times compare per micro-step (one batch through forward and backward), so that runs with another
accumulation interval line up; throughput compares per sample when both runs know their batch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..report import Report
from ..sections import known
from ..vocab import MS
from .ops import op_changes

#: the parts compared, as (name, how to read them off a report): ms per micro-step
PARTS = ("step", "data", "compute", "forward", "backward", "optimizer", "comm", "comm_exposed",
         "wait", "other")

#: a suggestion's knob -> the report knobs that show it was applied
KNOB_KEYS = {
    "num_workers": ("num_workers",),
    "batch_size": ("batch_size",),
    "sync_frequency": ("sync_interval", "gradient_accumulation_steps", "accumulate_grad_batches"),
    "grad_compression": ("comm_hook",),
    "prefetch_factor": ("prefetch_factor",),
    "pin_memory": ("pin_memory",),
    "persistent_workers": ("persistent_workers",),
    "pipeline_partition": ("layers",),
    "n_microbatches": ("n_microbatches", "microbatches"),
}
#: knobs that describe the run, not the training: never listed as changed
IGNORED = {"start_unix_ns", "hostname", "pid", "cpu_count", "cpus_available", "torch", "gpuscope",
           "cuda_available", "memory_used_fraction", "batches_per_epoch", "run_id",
           # measured, not set: what DDP's logging saw (its hidden communication, its share of
           # backward, how it was taken), the steps a profiler wrote its trace in, the step
           # whose FLOPs were counted
           "hidden_comm_ns", "hidden_comm_share", "hidden_comm", "profiler_trace_steps",
           "data_cpu_share", "flops_counted_step", "flops_source", "load_avg"}
#: knobs that follow from another when it changes: {the knob chosen: those it moves}
FOLLOWS = {"batch_size": ("batch_bytes", "flops_per_step")}


@dataclass(frozen=True)
class PartDelta:
    part: str
    before_ms: float
    after_ms: float

    @property
    def delta_ms(self) -> float:
        return self.after_ms - self.before_ms

    @property
    def delta_pct(self) -> float | None:
        return 100 * self.delta_ms / self.before_ms if self.before_ms > 0 else None

    def to_dict(self) -> dict:
        pct = self.delta_pct
        return {"part": self.part, "before_ms": round(self.before_ms, 3),
                "after_ms": round(self.after_ms, 3), "delta_ms": round(self.delta_ms, 3),
                "delta_pct": None if pct is None else round(pct, 1)}


@dataclass(frozen=True)
class Prediction:
    """A BEFORE suggestion whose knob AFTER changed: predicted against measured step time (ms per
    step of BEFORE's shape: its micro-steps per row, the batch AFTER ran with)."""

    knob: str
    current: object
    proposed: object
    applied: object                  # what AFTER ran with
    predicted_ms: float
    predicted_range: tuple[float, float] | None
    measured_ms: float
    #: AFTER's step-to-step spread: ± half the IQR of its step times, % of the median (None:
    #: too few steps to tell)
    noise_pct: float | None

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def in_range(self) -> bool | None:
        if self.predicted_range is None:
            return None
        lo, hi = self.predicted_range
        return lo <= self.measured_ms <= hi

    @property
    def as_suggested(self) -> bool:
        return str(self.applied) == str(self.proposed) or self.knob == "straggler"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["predicted_ms"] = round(self.predicted_ms, 3)
        d["measured_ms"] = round(self.measured_ms, 3)
        d["predicted_range"] = (None if self.predicted_range is None
                                else [round(x, 3) for x in self.predicted_range])
        d["noise_pct"] = None if self.noise_pct is None else round(self.noise_pct, 1)
        d["error_pct"] = round(self.error_pct, 1)
        d["in_range"] = self.in_range
        d["as_suggested"] = self.as_suggested
        return d


@dataclass
class Comparison:
    before: str
    after: str
    parts: list[PartDelta]
    verdict_before: tuple[str, float]
    verdict_after: tuple[str, float]
    knobs_changed: dict[str, tuple]
    predictions: list[Prediction]
    per_sample: bool                 # the slowdown is per sample (both batches known)
    slower_pct: float                # AFTER's time per unit of work against BEFORE's, in %
    stragglers_before: list[int] = field(default_factory=list)
    stragglers_after: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: rates and memory, [before, after] where either side knows them (None: unknown)
    rates: dict = field(default_factory=dict)
    #: why BEFORE and AFTER are not one training before and after a change ("" when they are)
    different: str = ""
    #: the ops, ranges and kernels whose time per micro-step changed most (analyze/ops.py)
    ops: list = field(default_factory=list)

    def slower_than(self, pct: float) -> bool:
        return self.slower_pct > pct

    def to_dict(self) -> dict:
        return {
            "schema": "gpuscope.compare/1", "before": self.before, "after": self.after,
            "different_trainings": self.different or None,
            "slower_pct": round(self.slower_pct, 2),
            "unit": "sample" if self.per_sample else "micro-step",
            "verdict": {"before": self.verdict_before[0], "before_share": round(self.verdict_before[1], 4),
                        "after": self.verdict_after[0], "after_share": round(self.verdict_after[1], 4)},
            "stragglers": {"before": self.stragglers_before, "after": self.stragglers_after},
            "parts": [p.to_dict() for p in self.parts],
            "knobs_changed": {k: list(v) for k, v in self.knobs_changed.items()},
            "predictions": [p.to_dict() for p in self.predictions],
            "rates": {k: list(v) for k, v in self.rates.items()},
            "ops": [dict(o) for o in self.ops],
            "warnings": self.warnings,
        }


def micro_steps(rep: Report) -> float:
    """Micro-steps per analysed step (rows are optimizer steps of several with accumulation)."""
    m = [s.micro_steps for s in rep.steps if getattr(s, "micro_steps", 0)]
    return float(np.median(m)) if m else 1.0


def step_ms_per_micro(rep: Report) -> np.ndarray:
    """Each analysed step's time (slowest rank) per micro-step, ms."""
    return np.array([s.step_ns / max(getattr(s, "micro_steps", 1) or 1, 1) for s in rep.steps],
                    dtype=float) / MS


def part_ms(rep: Report, part: str) -> float:
    """Mean ms per micro-step of one part, over ranks (step: the slowest rank's, per step)."""
    if part == "step":  # the report's own figure (ReportData.step_ns), per micro-step
        return rep.step_ns / MS / micro_steps(rep)
    vals = []
    for r in rep.ranks:
        if part in ("forward", "backward", "optimizer"):
            pct = r.phases_pct.get(part)
            if pct is None:
                continue
        else:
            pct = r.part_pct(part)
        vals.append(r.step_ns * pct / 100 / MS)
    return float(np.mean(vals)) / micro_steps(rep) if vals else 0.0


def _noise_pct(rep: Report) -> float | None:
    """AFTER's spread (PredictionCheck.noise_pct); None under 4 steps: unknown, not none."""
    t = step_ms_per_micro(rep)
    if t.size < 4:
        return None
    q1, q3 = np.percentile(t, [25, 75])
    return float(100 * (q3 - q1) / 2 / max(np.median(t), 1e-9))


def changed_knobs(before: dict, after: dict) -> dict[str, tuple]:
    out = {}
    for k in sorted(set(before) | set(after)):
        if k in IGNORED:
            continue
        a, b = before.get(k), after.get(k)
        if a != b and not (isinstance(a, (dict, list)) or isinstance(b, (dict, list))):
            out[k] = (a, b)
    if before.get("layers") != after.get("layers") and ("layers" in before or "layers" in after):
        out["layers"] = ("changed", "changed")  # per-stage layer lists: too long to print
    # knobs that follow from another: a DataLoader given workers takes torch's prefetch_factor
    # (None with none), with batches_per_epoch and such from the same loader
    if "num_workers" in out and out.get("prefetch_factor", (0, 0))[0] is None:
        out.pop("prefetch_factor")
    for knob, moved in FOLLOWS.items():  # a batch's bytes and FLOPs go with its size
        if knob in out:
            for k in moved:
                out.pop(k, None)
    # workers kept across epochs go with giving a loader workers (the suggestion says so)
    if out.get("num_workers", (None, None))[0] in (0, None) and \
            out.get("persistent_workers") == (False, True):
        out.pop("persistent_workers")
    return out


def _batch(rep: Report):
    bs = rep.knobs.get("batch_size")
    return bs if isinstance(bs, int) and bs > 0 else None


def _applied(sug, before: Report, after: Report, changed: dict):
    """What AFTER ran with for the suggestion's knob, or None when it did not change it."""
    if sug.knob == "straggler":
        if not before.stragglers:
            return None
        gone = set(before.straggler_ranks) - set(after.straggler_ranks)
        if gone:
            return "no straggler"
        # still named (the others are now within noise of it), but the waiting it caused went
        if part_ms(after, "wait") < 0.5 * part_ms(before, "wait"):
            return "waiting halved"
        return None
    if sug.knob == "rank_jitter":
        return None
    for key in KNOB_KEYS.get(sug.knob, (sug.knob,)):
        if key in changed:
            val = changed[key][1]
            if sug.knob == "sync_frequency":
                val = f"accumulation {val}" if micro_steps(before) > 1 else f"every {val} steps"
            return val
    return None


def different_trainings(before: dict, after: dict) -> str:
    """Why two runs' knobs say they are not one training before and after a change: another
    model class, or parameters more than 10% apart (a knob change never adds a tenth of the
    model); "" when nothing says so."""
    for key in ("model", "wrapper"):
        a, b = before.get(key), after.get(key)
        if a and b and a != b:
            return f"{key} {a} against {b}"
    a, b = before.get("params"), after.get("params")
    if isinstance(a, int) and isinstance(b, int) and a > 0 and b > 0 \
            and max(a, b) > 1.1 * min(a, b):
        return f"{a:,} against {b:,} parameters"
    return ""


def compare(before: Report, after: Report) -> Comparison:
    warnings = []
    different = different_trainings(before.knobs, after.knobs)
    if different:
        warnings.append(f"BEFORE and AFTER look like different trainings ({different}): the "
                        "comparison says how two runs differ, not what a change did")
    if before.world_size != after.world_size:
        warnings.append(f"world size differs ({before.world_size} -> {after.world_size}): per-rank "
                        "parts compare, the step is not the same amount of work")
    if before.source != after.source:
        warnings.append(f"BEFORE is a {before.source} analysis and AFTER a {after.source} one: "
                        "their parts are measured differently")
    for name, rep in (("BEFORE", before), ("AFTER", after)):
        if len(rep.steps) < 5:
            warnings.append(f"{name} has {len(rep.steps)} analysed step(s): its times are noisy")
    parts = [PartDelta(p, part_ms(before, p), part_ms(after, p)) for p in PARTS]
    changed = changed_knobs(before.knobs, after.knobs)
    b_bs, a_bs = _batch(before), _batch(after)
    per_sample = b_bs is not None and a_bs is not None
    unit_b = part_ms(before, "step") / (b_bs if per_sample else 1)
    unit_a = part_ms(after, "step") / (a_bs if per_sample else 1)
    slower = 100 * (unit_a / unit_b - 1) if unit_b > 0 else 0.0
    # predicted vs measured, on the suggestions' basis (the time of BEFORE's global batch): AFTER's
    # time per micro-step (per sample where both batches are known: a larger batch's step holds
    # more of them), times BEFORE's micro-steps per row
    measured = (unit_a * b_bs if per_sample else part_ms(after, "step")) * micro_steps(before)
    preds = []
    seen = set()
    for s in before.suggestions:
        if s.knob in seen:
            continue
        applied = _applied(s, before, after, changed)
        if applied is None:
            continue
        seen.add(s.knob)
        rng = getattr(s, "estimated_step_ms_range", None)
        preds.append(Prediction(s.knob, s.current, s.proposed, applied, s.estimated_step_ms,
                                tuple(rng) if rng else None, measured, _noise_pct(after)))
    if len([c for c in changed if c != "layers"]) > 1 and preds:
        warnings.append("more than one knob changed: each prediction assumed its change alone")
    return Comparison(before.path, after.path, parts,
                      (before.verdict.label, before.verdict.share),
                      (after.verdict.label, after.verdict.share), changed, preds, per_sample, slower,
                      before.straggler_ranks, after.straggler_ranks, warnings,
                      rates_before_after(before, after), different,
                      op_changes(before.ops, after.ops, micro_steps(before), micro_steps(after)))


#: what `rates` compares: (name, where in a report)
RATES = (("samples_per_s", ("throughput", "samples_per_s")),
         ("tokens_per_s", ("throughput", "tokens_per_s")),
         ("mfu_pct", ("throughput", "mfu_pct")))


def _memory_stat(rep: Report, key: str):
    """The largest over ranks of a host series' `key` (peak or rate), None without memory."""
    ss = [getattr(s, key) for s in (rep.memory.series if rep.memory is not None else [])
          if s.memory == "host" and getattr(s, key) is not None]
    return max(ss) if ss else None


def _rate(section, key: str):
    """A rate of a typed section, None where it has none (absent or unknown)."""
    value = getattr(section, key, None) if section is not None else None
    return value if known(value) else None


def rates_before_after(before: Report, after: Report) -> dict:
    out = {}
    for name, (section, key) in RATES:
        pair = tuple(_rate(getattr(r, section), key) for r in (before, after))
        if any(v is not None for v in pair):
            out[name] = pair
    for name, key in (("resident_peak_bytes", "peak_bytes"),
                      ("resident_growth_bytes_per_step", "rate_bytes_per_step")):
        pair = (_memory_stat(before, key), _memory_stat(after, key))
        if any(v is not None for v in pair):
            out[name] = pair
    return out
