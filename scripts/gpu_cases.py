"""Compare gpuscope's analysis of tests/workloads runs (cases.py / trainers.py, e.g. on a GPU with
--device cuda) with the loops' own perf_counter timing: one JSON line per run dir.

    python scripts/gpu_cases.py DIR [DIR ...]

Per run dir and rank: gpuscope's mean optimizer-step time (ms) beside the loop's own (the
micro-step marks summed per optimizer step, the first optimizer step left out, as gpuscope's
default warm-up), their ratio, both medians, the verdict, collectives by kind, device timing source, warnings.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpuscope  # noqa: E402


def own_steps_ms(out: str, rank: int, k: int) -> np.ndarray | None:
    path = os.path.join(out, f"timings-rank{rank}.json")
    if not os.path.exists(path):
        return None
    t = json.load(open(path))
    if "micro_s" in t:
        v = np.array(t["micro_s"]) * 1e3
    else:  # trainers.py: perf_counter at each micro-step end
        v = np.diff(np.array(t["micro_end_s"])) * 1e3
    n = len(v) // k * k
    cycles = v[:n].reshape(-1, k).sum(axis=1)[1:]
    return cycles if len(cycles) else None


def header_gpu(out: str) -> dict:
    """What rank 0's recorder said about the GPU (device timing, telemetry) in its header."""
    rec = os.path.join(out, "record")
    for name in sorted(os.listdir(rec)):
        if name.endswith(".gpuscope.jsonl"):
            with open(os.path.join(rec, name)) as fh:
                return json.loads(fh.readline()).get("gpu", {})
    return {}


def main() -> None:
    for out in sys.argv[1:]:
        line: dict = {"run": out}
        try:
            rep = gpuscope.analyze(os.path.join(out, "record"))
        except Exception as exc:  # report and go on with the next run
            line["error"] = f"{type(exc).__name__}: {exc}"
            print(json.dumps(line), flush=True)
            continue
        k = int(rep.knobs.get("sync_interval") or 1)
        line.update(verdict=rep.verdict.label, confidence=getattr(rep.verdict, "confidence", None),
                    steps=len(rep.steps), sync_interval=k,
                    gpu=header_gpu(out),
                    warnings=[str(w)[:200] for w in rep.warnings])
        ranks = []
        frame = rep.table.frame
        for r in rep.ranks:
            ours = r.step_ns / 1e6
            ours_med = float(frame.loc[frame["rank"] == r.rank, "step_ns"].median()) / 1e6
            cycles = own_steps_ms(out, r.rank, k)
            own = None if cycles is None else float(cycles.mean())
            own_med = None if cycles is None else float(np.median(cycles))
            ranks.append({"rank": r.rank, "gpuscope_step_ms": round(ours, 3),
                          "own_step_ms": None if own is None else round(own, 3),
                          "ratio": None if not own else round(ours / own, 4),
                          "median_ms": round(ours_med, 3),
                          "own_median_ms": None if own_med is None else round(own_med, 3),
                          "data_pct": round(r.data_pct, 1), "other_pct": round(r.other_pct, 1),
                          "comm_exposed_pct": round(r.comm_exposed_pct, 1),
                          "comm_by_kind": sorted(r.comm_by_kind),
                          "phases_pct": {p: round(v, 1) for p, v in r.phases_pct.items()}})
        line["ranks"] = ranks
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
