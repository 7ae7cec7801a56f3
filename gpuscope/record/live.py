"""Live diagnosis: every N steps the ranks exchange a summary of their last N steps and rank 0
says what holds the run back, while it trains.

How, without slowing or hanging training:

1. each rank sums its own rows as they are flushed (off the step path) into a window;
2. at every N-th rec.step() every rank (all of them: the step count is what keeps them in
   lockstep) puts the window into a small float64 tensor and starts one all_gather on a gloo
   group of its own, created once (at start when torch.distributed is up, else at the first
   exchange), with async_op=True: the call returns at once, the gather runs on gloo's threads;
3. the result is looked at when rows are next flushed (and at the next exchange): if it is
   there, rank 0 classifies the window and logs one line, then calls ``on_diagnosis(summary)``;
   if not, nothing waits for it. An exchange that fails (a rank died: gloo reports the closed
   connection; or the group's time-out passed) turns live diagnosis off with one warning;
4. at exit the last exchange gets a short grace (CLOSE_GRACE_S, polled, never a blocking
   wait), then anything still in flight is dropped (more than one still out: a rank stopped
   answering, said in one warning); rank 0 logs one closing line: the windows it diagnosed,
   the steps after the last one that no window covered, and the command for the whole run.

The window's numbers follow the analysis (analyze/classify.py) on window sums: transfer = the
least exposed communication of any rank, a rank's wait = its excess over that, shares of the
rank's step time, mean over ranks (wait: max). Sums over N steps keep a rank that is late in
every step and drop most lateness that moves between ranks; what is left of it can still make
one short window look like one rank is late. So a straggler is named only once the same rank
was the last in enough windows in a row that chance is an unlikely reason: k windows, when
(1/n)^(k-1) <= STRAGGLER_CHANCE for n ranks (2 ranks: 5 windows; 3: 4; 4-9: 3; 10 or more: 2),
or 2 when both windows lose at least CLEAR_WAIT x the wait threshold (a clear straggler).
This module stays light (no numpy/pandas): it runs inside training.
"""

from __future__ import annotations

import sys
import time

from .._log import warn_once
from ..run_format import STEP_COLUMNS
from ..thresholds import Thresholds
from ..vocab import COMM, COMPUTE, DATA, IMBALANCED

#: what each rank sends: these window sums (ns) after [steps, first_step, last_step]
SUMS = ("step_ns", "data_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "other_ns",
        "forward_ns", "backward_ns", "optimizer_ns")
_IDX = [STEP_COLUMNS.index(c) for c in SUMS]
_STEP = STEP_COLUMNS.index("step")
WIDTH = 3 + len(SUMS)
MAX_IN_FLIGHT = 64  # exchanges started and not yet back; past this a peer is gone or far behind
STRAGGLER_CHANCE = 0.1  # at most this likely by chance: the same rank last k windows in a row
CLEAR_WAIT = 3.0  # x the wait threshold: waiting this large names the rank after 2 windows
CLOSE_GRACE_S = 1.0  # at exit, the last exchange is polled this long (the ranks launched it together)


class Live:
    """One rank's side of the live exchange (see the module doc)."""

    def __init__(self, every: int, on_diagnosis=None, *, rank: int = 0, world_size: int = 1,
                 knobs: dict | None = None, timeout_s: float = 60.0, log: bool = True,
                 thresholds: Thresholds | None = None, run_dir: str | None = None):
        self.every = max(int(every), 1)
        self.on_diagnosis = on_diagnosis
        self.rank, self.world_size = rank, world_size
        self.knobs = knobs if knobs is not None else {}
        self.timeout_s = timeout_s
        self.log = log
        self.th = thresholds or Thresholds()
        self.run_dir = run_dir            # named in the closing line
        self._steps_seen = [0, None]      # rows fed, the last one's step
        self.summaries: list[dict] = []   # rank 0: what it diagnosed, in order
        self.off = ""                     # why live diagnosis stopped, once it did
        self._group = None
        self._window = [0.0] * WIDTH
        self._pending: list = []          # (work, outputs, tensor) in launch order
        self._late: dict = {}             # rank 0: the rank last in the latest windows

    # ------------------------------------------------------------ rows in, exchange out
    def feed(self, rows: list) -> None:
        """Add flushed rows (STEP_COLUMNS order) to the window."""
        w = self._window
        if rows:
            self._steps_seen[0] += len(rows)
            self._steps_seen[1] = rows[-1][_STEP]
        for row in rows:
            if not w[0]:
                w[1] = row[_STEP]
            w[0] += 1
            w[2] = row[_STEP]
            for j, i in enumerate(_IDX):
                w[3 + j] += row[i]

    def launch(self) -> None:
        """Start this window's exchange (every rank, at the same step) and open a new window."""
        if self.off:
            return
        window, self._window = self._window, [0.0] * WIDTH
        if self.world_size <= 1:
            self._report([window])
            return
        if len(self._pending) >= MAX_IN_FLIGHT:
            self._stop(f"{len(self._pending)} exchanges did not come back: a rank stopped or is "
                       "far behind")
            return
        import torch
        import torch.distributed as dist

        from .collectives import quiet

        if not dist.is_initialized():
            self._stop("torch.distributed is not initialized: no ranks to hear from")
            return
        if self._group is None:
            self._group = self._new_group(dist)
        # on the CPU whatever the loop's torch.set_default_device() says: the group is gloo's,
        # and a device tensor would queue on the training's stream
        t = torch.tensor(window, dtype=torch.float64, device="cpu")
        outs = [torch.empty_like(t) for _ in range(self.world_size)]
        with quiet():  # ours: not the training's communication
            work = dist.all_gather(outs, t, group=self._group, async_op=True)
        self._pending.append((work, outs, t))

    def _new_group(self, dist):
        import datetime

        return dist.new_group(backend="gloo",
                              timeout=datetime.timedelta(seconds=self.timeout_s))

    def start_group(self) -> None:
        """Create the gloo group now (all ranks at once, at record() start)."""
        import torch.distributed as dist

        if self.world_size > 1 and self._group is None:
            self._group = self._new_group(dist)

    def poll(self) -> None:
        """Report the exchanges that came back; never waits."""
        while self._pending and not self.off:
            work, outs, _ = self._pending[0]
            try:
                if not work.is_completed():
                    return
                work.wait()  # complete: returns at once, raises what gloo saw
            except Exception as exc:
                self._stop(f"an exchange failed ({str(exc).splitlines()[0][:200]})")
                return
            self._pending.pop(0)
            if self.rank == 0:
                self._report([o.tolist() for o in outs])

    def close(self) -> None:
        """At stop(): report what already came back, drop the rest, wait for nothing. More than
        the last exchange still out means a rank stopped answering: said once."""
        try:
            self.poll()
            until = time.monotonic() + CLOSE_GRACE_S
            while len(self._pending) == 1 and not self.off and time.monotonic() < until:
                time.sleep(0.005)  # the last exchange: every rank launched it at the same step
                self.poll()
        except Exception:
            pass
        if len(self._pending) > 1 and not self.off:
            self._stop(f"{len(self._pending)} exchanges were not answered when recording "
                       "stopped: a rank stopped early or is far behind")
        dropped = len(self._pending)
        self._pending = []
        if self.log and self.rank == 0 and self._steps_seen[0]:
            line = closing_line(self.summaries, self._steps_seen[1], dropped, self.run_dir)
            print(f"gpuscope live: {line}", file=sys.stderr, flush=True)

    def _stop(self, why: str) -> None:
        self.off = why
        self._pending = []
        warn_once("live-off", "gpuscope: live diagnosis stopped: %s; recording goes on", why)

    # ------------------------------------------------------------------ diagnosis
    def _report(self, windows: list) -> None:
        summary = diagnose(windows, self.th, self.knobs, self._late)
        if summary is None:
            return
        self._late = summary["late"]
        self.summaries.append(summary)
        if self.log:
            print(f"gpuscope live {summary['line']}", file=sys.stderr, flush=True)
        if self.on_diagnosis is not None:
            try:
                self.on_diagnosis(summary)
            except Exception as exc:
                warn_once("live-callback", "gpuscope: on_diagnosis raised %r; it is not called "
                          "again", exc)
                self.on_diagnosis = None


def closing_line(summaries: list, last_step, dropped: int, run_dir: str | None) -> str:
    """Rank 0's last line at stop(): what the live windows covered, what they did not, and
    where the whole run is told."""
    whole = f"gpuscope analyze {run_dir}" if run_dir else "gpuscope analyze on the run dir"
    end = int(last_step)
    if not summaries:
        return (f"ended after step {end}: no window diagnosed (fewer steps than one window, "
                f"or none came back); the whole run: {whole}")
    first, last = summaries[0]["steps"][0], summaries[-1]["steps"][1]
    s = summaries[-1]
    who = (f"straggler: rank {s['straggler']['rank']}" if s.get("straggler") else
           "no straggler named")
    tail = ""
    if end > last:
        tail = f"; steps {last + 1}-{end} in no window" + (
            " (the last exchange did not come back in time)" if dropped else "")
    return (f"ended after step {end}: {len(summaries)} window(s) diagnosed, steps "
            f"{first}-{last}; the last: {s['verdict']}, {who}{tail}; the whole run: {whole}")


def windows_needed(n_ranks: int) -> int:
    """Windows in a row the same rank must be last before chance is an unlikely reason."""
    k = 2
    while (1 / max(n_ranks, 2)) ** (k - 1) > STRAGGLER_CHANCE:
        k += 1
    return k


def diagnose(windows: list, th: Thresholds, knobs: dict | None = None,
             before: dict | None = None) -> dict | None:
    """The summary of one window from every rank's sums (lists of WIDTH floats, by rank).
    `before`: the previous summary's "late" ({rank, windows in a row, least waiting share of
    them}); the summary's own "late" carries it on."""
    ranks = [dict(zip(("steps", "first_step", "last_step", *SUMS), w)) for w in windows]
    ranks = [dict(r, rank=i) for i, r in enumerate(ranks) if r["steps"] > 0 and r["step_ns"] > 0]
    if not ranks:
        return None
    transfer = min(r["comm_exposed_ns"] for r in ranks)
    for r in ranks:
        r["wait_ns"] = r["comm_exposed_ns"] - transfer
        r["busy_ns"] = r["step_ns"] - r["comm_exposed_ns"]
    n = len(ranks)
    share = lambda key: sum(r[key] / r["step_ns"] for r in ranks) / n  # noqa: E731
    shares = {DATA: share("data_ns"),
              COMM: sum((r["comm_exposed_ns"] - r["wait_ns"]) / r["step_ns"] for r in ranks) / n,
              IMBALANCED: max(r["wait_ns"] / r["step_ns"] for r in ranks)}
    limits = {DATA: th.data_high, COMM: th.comm, IMBALANCED: th.wait}
    over = {k: v for k, v in shares.items() if v >= limits[k]}
    verdict = max(over, key=over.get) if over else COMPUTE
    steps = max(r["steps"] for r in ranks)
    step_ms = max(r["step_ns"] for r in ranks) / steps / 1e6
    before = before or {}
    straggler, late, streak = None, None, {}
    if n > 1 and shares[IMBALANCED] >= th.wait:
        late = min(ranks, key=lambda r: r["wait_ns"])  # the one the others waited for
        again = before.get("rank") == late["rank"]
        streak = {"rank": late["rank"], "windows": before["windows"] + 1 if again else 1,
                  "least_wait_share": min(shares[IMBALANCED], before["least_wait_share"])
                  if again else shares[IMBALANCED]}
    needed = windows_needed(n)
    if late is not None and (streak["windows"] >= needed or (
            streak["windows"] >= 2 and streak["least_wait_share"] >= CLEAR_WAIT * th.wait)):
        others = [r for r in ranks if r is not late]
        busy = sorted(r["busy_ns"] for r in others)
        m = len(busy)
        median = busy[m // 2] if m % 2 else (busy[m // 2 - 1] + busy[m // 2]) / 2
        typical = {k: sum(r[k] for r in others) / len(others)
                   for k in ("data_ns", "compute_ns", "other_ns")}
        cause = max(typical, key=lambda k: late[k] - typical[k])
        straggler = {"rank": late["rank"],
                     "excess_ms": round((late["busy_ns"] - median) / late["steps"] / 1e6, 3),
                     "cause": cause[:-3], "windows": streak["windows"]}
    summary = {
        "steps": [int(min(r["first_step"] for r in ranks)), int(max(r["last_step"] for r in ranks))],
        "ranks_reporting": n, "verdict": verdict,
        "share": round(shares.get(verdict, share("compute_ns")), 4),
        "shares": {k: round(v, 4) for k, v in shares.items()},
        "step_ms": round(step_ms, 3), "straggler": straggler,
        "late_rank": late["rank"] if late is not None else None, "late": streak,
        "per_rank": [{"rank": r["rank"], "step_ms": round(r["step_ns"] / r["steps"] / 1e6, 3),
                      "data_ms": round(r["data_ns"] / r["steps"] / 1e6, 3),
                      "compute_ms": round(r["compute_ns"] / r["steps"] / 1e6, 3),
                      "comm_exposed_ms": round(r["comm_exposed_ns"] / r["steps"] / 1e6, 3),
                      "wait_ms": round(r["wait_ns"] / r["steps"] / 1e6, 3)} for r in ranks],
        "at_unix_s": round(time.time(), 3),
    }
    summary["suggestion"] = suggestion(dict(summary, late_before=before.get("rank")), knobs or {})
    what = {DATA: "loading data", COMM: "in exposed communication",
            IMBALANCED: "waiting for other ranks", COMPUTE: ""}[verdict]
    head = f"[steps {summary['steps'][0]}-{summary['steps'][1]}, {step_ms:.1f} ms/step]: "
    if verdict == COMPUTE:
        line = head + (f"{verdict} (data {100 * shares[DATA]:.0f}%, exposed comm "
                       f"{100 * shares[COMM]:.0f}%, waiting {100 * shares[IMBALANCED]:.0f}%: "
                       "none over its threshold)")
    else:
        line = head + f"{verdict} ({100 * summary['share']:.0f}% of the step {what})"
    if straggler:
        line += (f"; straggler: rank {straggler['rank']} (+{straggler['excess_ms']:.1f} ms/step, "
                 f"{straggler['cause']}, last {streak['windows']} windows in a row)")
    elif late is not None:
        soon = 2 if shares[IMBALANCED] >= CLEAR_WAIT * th.wait else needed  # waiting this large
        line += (f"; last to arrive: rank {late['rank']} ({streak['windows']} window(s) in a "
                 f"row; named a straggler once last in {soon} in a row)")
    line += f"; {summary['suggestion']}"
    summary["line"] = line
    return summary


def suggestion(s: dict, knobs: dict) -> str:
    """The first thing to try for the window's verdict (`gpuscope analyze` estimates gains)."""
    v = s["verdict"]
    if v == IMBALANCED and s["straggler"]:
        st = s["straggler"]
        where = {"data": "input pipeline (storage, workers)",
                 "compute": "device (clocks, temperature, other jobs) or share of the work",
                 "other": "work between steps (logging, checkpoints)"}[st["cause"]]
        return f"try: look at rank {st['rank']}'s {where}"
    if v == IMBALANCED and s["late_rank"] is not None and s.get("late_before") not in (
            None, s["late_rank"]):
        return ("try: even out per-step work (uneven inputs, noisy hosts, periodic host work): "
                "the late rank changes from window to window")
    if v == IMBALANCED:
        return "try: see the next windows: they name the rank the others wait for if it stays late"
    if v == DATA:
        workers = knobs.get("num_workers")
        now = f" (now {workers})" if isinstance(workers, int) else ""
        return f"try: more DataLoader workers{now}, pin_memory=True, prefetching"
    if v == COMM:
        if "FSDP" in str(knobs.get("model", "")) or "fsdp" in str(knobs.get("parallel", "")).lower():
            return ("try: more work per collective (a larger batch per rank, gradient "
                    "accumulation) or fewer, larger all-gathers (bigger fully_shard units)")
        return ("try: synchronize gradients less often (gradient accumulation) or overlap more "
                "(larger DDP buckets)")
    return "nothing to fix first: the step is compute-bound"
