"""Tells a persistent imbalance (the same ranks late step after step) from per-step jitter.

In a synchronous step the rank that arrives last at the collective waits least. Centre each
rank's wait on the step's mean wait across ranks: a straggler sits below the mean in every step,
the ranks that wait for it sit above, and under jitter (noisy host, uneven inputs) the sign moves
between ranks from step to step. A one-sample t statistic per rank over the steps every rank
recorded measures how consistent that offset is, so a large, steady offset is found in a few
steps and random lateness is not called a straggler however many steps wait.

The tests are one-sided, at a family-wise 1% per run: each of n ranks at 1%/n (Bonferroni; the
largest tabled level at or below it, t_table.py), so random jitter names a rank in about one run
in a hundred whatever the world size (0.5% per rank for 2 ranks, 0.001% for 1,000). A fixed
per-rank level would both miss a clear straggler in a short run of 2 ranks (8 profiled steps,
rank 0 waiting in all of them: not significant at 0.1%) and name a false one among a thousand
ranks in most runs. Significance alone is not enough over many
steps, where a tiny steady offset (a rank that always starts its collective 1% later) becomes
significant; the offset must also be material: the waiting it causes, on average, is at least
`min_share` of the typical step (the imbalance threshold).

A few huge steps (a profiler or checkpoint writing for a second on one rank) inflate the t
statistic's spread and can hide a straggler that is late in every other step. So Yuen's
trimmed t test runs beside it: the fifth of the steps with the largest and the fifth with the
smallest offset of each rank are set aside (their values winsorized into the spread), which keeps
its power when a step or two are outliers (8 profiled steps, rank 1 late in all, one of them 5x
longer: the plain t test misses it) but not for a rank late in a third of the steps (a
checkpoint every third step), which the plain test finds. A third test only looks at order: per step, each rank's rank of wait among the ranks
(ties share the average rank). When ranks are exchangeable each step's ranks are a random
permutation, so a rank's mean rank is (n + 1) / 2 with variance (n^2 - 1) / (12 S) over S steps
(less with ties: conservative); a normal z beyond the same level's point, with the median offset
material, is consistent too. Outliers cannot move an order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import order_stats
from .chunks import col_chunks, each_chunk, row_chunks
from .rowgroups import repeated_run, dense_unique
from .t_table import LEVELS, T, Z

MIN_STEPS = 3  # fewer steps cannot tell a straggler from jitter

FAMILY_ALPHA = 0.01  # the chance, per run, that random jitter names a rank
#: the one-sided level at which a jitter verdict's steps must rule out a straggler (Roles.unruled)
RULE_OUT_ALPHA = 0.05
#: the smallest steady lateness named as a minor straggler (Roles.minor), as a share of the
#: typical step: a rank the tests find consistently late by less than the imbalance threshold
#: decides no verdict, but is named apart (a 2 ms fault, 5% of the step, was "comm-bound,
#: nobody named" in 2 rows of 3)
MINOR_SHARE = 0.03


def rank_alpha(n_ranks: int) -> float:
    """The per-rank level: FAMILY_ALPHA / n_ranks, down to the next tabled level (conservative)."""
    want = FAMILY_ALPHA / max(n_ranks, 1)
    return max((a for a in LEVELS if a <= want), default=LEVELS[-1])


def t_critical(dof: int, alpha: float = 0.001) -> float:
    """Critical t at `alpha` (one-sided, a tabled level); between table rows the smaller dof
    (conservative); from 1,000 degrees of freedom on, the normal's."""
    if dof >= 1000:
        return Z[alpha]
    row = T[alpha]
    return row[max(k for k in row if k <= max(dof, 1))]


@dataclass
class Roles:
    """Which ranks are consistently late (stragglers' side) or early (waiting side)."""
    late: set[int] = field(default_factory=set)
    early: set[int] = field(default_factory=set)
    t: dict[int, float] = field(default_factory=dict)   # per rank; < 0: arrives late
    n_steps: int = 0                                     # steps every rank recorded
    steps: np.ndarray | None = None                      # the steps every rank recorded
    ranks: np.ndarray | None = None
    slow: np.ndarray | None = None                       # steps x ranks: arrived last (bool)
    waits: np.ndarray | None = None                      # steps x ranks: wait_ns
    #: (rank, steps last, share of the waiting caused) of a rank that is probably a straggler:
    #: late most of the time, though too few or too noisy steps to be sure (leaning())
    probable: tuple[int, int, float] | None = None
    #: where some steps lack a rank (a lost row, a file cut): every step, and who arrived last
    #: among the ranks present in it (the tests above use the complete steps only)
    all_steps: np.ndarray | None = None
    all_slow: np.ndarray | None = None
    all_present: np.ndarray | None = None
    #: (steps, the busiest rank of each: most step time less waiting), every step recorded
    busiest: tuple | None = None
    #: (rank, mean lateness ns, its upper bound ns, the material lateness ns) of the rank no test
    #: found late whose lateness, step by step, could still be a material straggler's: the upper
    #: end of a one-sided RULE_OUT_ALPHA interval around its mean reaches the material bound
    #: (a 40 ms straggler whose host stalled rank 0 in 3 of 8 profiled steps: last in 5, 68% of
    #: the waiting). A jitter verdict cannot be confident that no rank is a straggler then
    unruled: tuple[int, float, float, float] | None = None
    #: rank -> its mean lateness (ns, against the other ranks' mean arrival) for the ranks the
    #: tests find consistently late by at least MINOR_SHARE of the typical step but less than
    #: the material share (a minority of the ranks): minor stragglers, named apart
    minor: dict = field(default_factory=dict)
    #: the typical step the material and minor shares are of (ns; 0: not worked out)
    typical_ns: float = 0.0
    #: rank -> its busy time less the other ranks' median, step by step (roles.steps), for the
    #: ranks steadily busier than their peers (at most BUSY_KEPT): where a straggler's own
    #: excess lies, which the waits do not tell on a loaded machine (bursts)
    busy_excess: dict = field(default_factory=dict)
    #: the most any rank's mean lateness could be and still look like chance in these steps
    #: (ns: the largest upper end of a one-sided RULE_OUT_ALPHA interval over the ranks no test
    #: found late): what the steps can see. A rank slowed by less hides in them (a rank 1%
    #: slower, or late in 1 step of 5 by 2 ms), and the report says so; 0: not worked out
    floor_ns: float = 0.0

    @property
    def decided(self) -> bool:
        return self.n_steps >= MIN_STEPS

    @property
    def persistent(self) -> bool:
        return bool(self.late or self.early)

    @property
    def late_ranks(self) -> set[int]:
        """The ranks whose lateness is the pattern of the waiting: consistently late, or
        probably so (the steps they arrive last in are imbalance, not jitter)."""
        return self.late | ({self.probable[0]} if self.probable else set())

    def leaning(self, share: float = 0.75) -> tuple[int, int, float] | None:
        """(rank, steps, share of the waiting) for a rank that arrived last in at least `share`
        of the steps, or whose lateness caused at least `share` of all the waiting, though no
        test found it consistent (too few or too noisy steps): what a jitter verdict must not
        be confident against. Jitter is lateness that moves between ranks; a rank the others
        waited for in 9 of 13 steps, causing 87% of the waiting (a 40 ms straggler on a busy
        core, whose own stalls reversed the other four), is not that either. The waiting of a
        step is the one caused by the rank(s) that arrived last in it, shared among them. None
        when no rank leans so or roles are decided already."""
        if self.persistent or self.slow is None or not self.decided or self.ranks is None:
            return None
        counts = self.slow.sum(axis=0)
        if not counts.size:
            return None
        caused = np.zeros(counts.size)
        if self.waits is not None:
            last = self.slow / np.maximum(self.slow.sum(axis=1, keepdims=True), 1)
            caused = (self.waits.sum(axis=1, keepdims=True) * last).sum(axis=0)
        total = float(caused.sum())
        shares = caused / total if total > 0 else caused
        i = int(np.argmax(np.where(counts >= share * self.n_steps, np.inf, shares)))
        n = int(counts[i])
        if n >= share * self.n_steps or shares[i] >= share:
            return int(self.ranks[i]), n, float(shares[i])
        return None


def find_roles(frame: pd.DataFrame, min_share: float = 0.0) -> Roles:
    """Per-rank lateness consistency over the steps that every rank recorded.

    `min_share`: the smallest steady offset that counts, as a share of the median step (slowest
    rank); one late rank among n makes the others wait n/(n-1) times its offset below the mean."""
    step, rank = frame["step"].to_numpy(), frame["rank"].to_numpy()
    # each row's busy time (its step less its waiting for others): the paired test's
    staged = "bubble_ns" in frame and bool(frame["bubble_ns"].to_numpy().any())
    # (pipeline stages do different work: compared within a stage's group by
    # bottlenecks/pipeline.py, not against every rank here)
    busy = "step_ns" in frame and not staged
    # ... and less its loading too: a rank steadily busier in its own work, which a loader's
    # jitter around it hides from the test of the whole busy time (a minor straggler's test)
    own = busy and "data_ns" in frame
    width = repeated_run(step)
    if width and bool((rank.reshape(-1, width) == rank[::width, None]).all()) and \
            bool((rank[width::width] > rank[:-width:width]).all()):
        t = _rank_major_tables(frame, step[:width], rank[::width], busy, own, min_share > 0)
    else:
        t = _step_tables(frame, step, rank, busy, own, min_share > 0)
    steps, ranks, w, b, own_t, slowest, busiest, partial = t
    del t
    roles = Roles(n_steps=int(steps.size))
    if ranks.size < 2 or not steps.size:
        return roles
    if partial is not None:
        roles.all_steps, roles.all_slow, roles.all_present = partial
    if busiest is not None:
        roles.busiest = busiest
    max_wait = w.max(axis=1, keepdims=True)
    roles.steps, roles.ranks, roles.slow = steps, ranks, w <= 0.5 * max_wait
    roles.waits = w
    if not roles.decided:
        return roles
    return _tested(roles, w, ranks, slowest, min_share, max_wait, b, own_t)


def _rank_major_tables(frame, steps, ranks, busy: bool, own: bool, slowest: bool) -> tuple:
    """find_roles' (steps x ranks) tables where the rows are rank after rank, each with the same
    steps: a transpose, each table made from its column straight (no row-long float copies
    beside them). Returns (steps, ranks, waits, busy, own work, the slowest rank's step,
    the busiest rank per step, None)."""
    width = steps.size

    def table(col: str) -> np.ndarray:
        out = np.empty((width, ranks.size))
        np.copyto(out, frame[col].to_numpy().reshape(-1, width).T)
        return out

    w = table("wait_ns")
    b = own_t = busiest = None
    if busy:
        b = table("step_ns")
        np.subtract(b, w, out=b)
        if own:  # busy less loading, made row by row where it is tested (_busier): no table
            own_t = (b, frame["data_ns"].to_numpy().reshape(-1, width).T)
        if ranks.size:
            busiest = (steps, ranks[np.argmax(b, axis=1)])
    top = (frame["step_ns"].to_numpy().reshape(-1, width).max(axis=0).astype(np.float64)
           if slowest else None)
    return steps, ranks, w, b, own_t, top, busiest, None


def _step_tables(frame, step, rank, busy: bool, own: bool, slowest: bool) -> tuple:
    """The same tables from rows in any order, of the steps every rank recorded (NaN where a
    rank lacks a step, then those steps left out); the last item: (steps, arrived last,
    present) over every step, where some lack a rank."""
    step_ns = frame["step_ns"].to_numpy(np.float64) if slowest else None
    busy_ns = (frame["step_ns"].to_numpy(np.float64) - frame["wait_ns"].to_numpy(np.float64)
               if busy else None)
    own_ns = busy_ns - frame["data_ns"].to_numpy(np.float64) if own else None
    steps, si, _ = dense_unique(step)
    ranks, ri, _ = dense_unique(rank)

    def table(values: np.ndarray) -> np.ndarray:
        out = np.full((steps.size, ranks.size), np.nan)
        out[si, ri] = values
        return out

    w = table(frame["wait_ns"].to_numpy(np.float64))
    b = table(busy_ns) if busy_ns is not None else None
    own_t = table(own_ns) if own_ns is not None else None
    del busy_ns, own_ns  # in the tables now: the row-long copies go before the tests
    busiest = partial = None
    if b is not None and ranks.size:
        busiest = (steps, ranks[np.argmax(np.where(np.isnan(b), -np.inf, b), axis=1)])
    complete = ~np.isnan(w).any(axis=1)
    if not complete.all():  # who arrived last among the ranks present, in every step
        top = np.nanmax(np.where(np.isnan(w), -np.inf, w), axis=1, keepdims=True)
        partial = (steps, ~np.isnan(w) & (np.nan_to_num(w, nan=np.inf) <= 0.5 * top),
                   ~np.isnan(w))
    top = None
    if step_ns is not None:  # the slowest rank's step, per complete step
        top = np.zeros(si.max() + 1)
        np.maximum.at(top, si, step_ns)
        top = top[complete]
    return (steps[complete], ranks, w[complete], b[complete] if b is not None else None,
            own_t[complete] if own_t is not None else None, top, busiest, partial)


#: the ranks whose step-by-step busy excess Roles keeps (the busiest ones, by mean excess)
BUSY_KEPT = 16


def _busier(w, busy, own, crit: float, tiny: float, material_ns: float) -> tuple:
    """(late by being busier by a material amount, steadily busier whatever the amount, how
    much busier in its own work where steadily so, {rank column: busy excess per step} of the
    steadily busier) per rank, from its busy time (`busy`) and its own work less its loading
    (`own`) against the median of the other ranks' in the same step (the tables shaped as the
    waits `w`, steps x ranks)."""
    # the paired test: each rank's busy time against the median of the other ranks' in the
    # same step; a rank consistently busier than its peers by a material amount is late
    # whatever the jitter around it (the waits above move with who happened to arrive last).
    # Against the others, not all: of 4 ranks 2 slowed alike, the median of all sits halfway
    # and each looked half as slow (the traces of such a fault row named one of the two)
    n, n_ranks = w.shape
    paired = np.zeros(n_ranks, dtype=bool)
    steady = np.zeros(n_ranks, dtype=bool)  # significantly busier, whatever the amount
    own_excess = np.zeros(n_ranks)  # where steadily busier in its own work: by how much
    kept: dict = {}
    for table in (busy, own):
        # a table, or (busy, loading): the busy time less the loading, made rows at a time
        rows_of = (lambda rows, t=table: t[0][rows] - t[1][rows]) if isinstance(table, tuple) \
            else (lambda rows, t=table: t[rows])
        if table is None or _shape(table) != w.shape or n_ranks < 2:
            continue
        d = np.empty(w.shape)  # each value less the others' median, some rows at a time

        def less_median(rows, rows_of=rows_of, d=d):
            values = rows_of(rows)
            np.subtract(values, others_median(values), out=d[rows])

        each_chunk(less_median, row_chunks(d), d.size)
        dm, ds = d.mean(axis=0), d.std(axis=0, ddof=1)
        for j in range(n_ranks):
            tp = _t(dm[j], ds[j] / math.sqrt(n), tiny)
            steady[j] |= tp >= crit and dm[j] > 0
            if table is busy:
                paired[j] = tp >= crit and dm[j] >= material_ns and dm[j] > 0
            elif tp >= crit and dm[j] > 0:
                own_excess[j] = dm[j]
        if table is busy:
            busier = np.flatnonzero(steady)
            for j in busier[np.argsort(-dm[busier], kind="stable")][:BUSY_KEPT].tolist():
                kept[j] = d[:, j].copy()
    return paired, steady, own_excess, kept


def _shape(table) -> tuple:
    """The shape of a steps x ranks table, or of (busy, loading)'s difference."""
    return table[0].shape if isinstance(table, tuple) else table.shape


def _tested(roles: Roles, w, ranks, slowest, min_share, max_wait, busy=None, own=None) -> Roles:
    """find_roles' tests: each rank consistently late or early, or neither; where neither, a
    rank that is probably late (Roles.leaning) whose lateness is material, or a minor straggler
    (consistently late by MINOR_SHARE of the step or more: its waits say so, or it is steadily
    busier than its peers, in all its busy time or in its own work less its loading, `own`, and
    late on average by that much; or steadily busier in its own work by that much, whatever its
    loading made of its arrival in these steps)."""
    # x = w less its step's mean (> 0: waited more than the step's mean), per rank: its mean,
    # sd, trimmed mean and median, some ranks at a time (no steps x ranks table of x)
    n, n_ranks = w.shape
    mean, sd, (tmean, se, dof), x_median = centred_stats(w)
    alpha = rank_alpha(ranks.size)
    crit = t_critical(n - 1, alpha)
    crit_y = t_critical(dof, alpha)
    crit_z = Z[alpha]
    typical = 0.0
    if min_share > 0:  # the median over the steps of the slowest rank's step
        typical = float(np.median(slowest))
        roles.typical_ns = typical
    material = np.abs(mean) * n_ranks / (n_ranks - 1) >= min_share * typical
    z = rank_z(w)
    material_median = np.abs(x_median) * n_ranks / (n_ranks - 1) >= min_share * typical
    tiny = 1e-9 * (max_wait.max() + 1)
    paired, steady, own_excess, kept = _busier(w, busy, own, crit, tiny, min_share * typical)
    roles.busy_excess = {int(ranks[j]): e for j, e in kept.items()}
    counted = last_too_often(w <= 0.5 * max_wait, alpha)
    for j, rank in enumerate(ranks):
        t = _t(mean[j], sd[j] / math.sqrt(n), tiny)
        ty = _t(tmean[j], se[j], tiny)
        roles.t[int(rank)] = float(t)
        late = (material[j] and (t <= -crit or ty <= -crit_y)) or (
            material_median[j] and z[j] <= -crit_z) or (
            paired[j] and paired.sum() * 2 <= n_ranks) or (  # at most half busier than the rest
            counted[j] and material[j] and mean[j] < 0)
        # (as for stragglers: of two ranks, the busier)
        early = (material[j] and (t >= crit or ty >= crit_y)) or (
            material_median[j] and z[j] >= crit_z)
        if late:
            roles.late.add(int(rank))
        elif early:
            roles.early.add(int(rank))
        elif min_share > 0:
            lateness = 0.0
            if mean[j] < 0 and (t <= -crit or ty <= -crit_y or z[j] <= -crit_z or steady[j]):
                lateness = -float(mean[j]) * n_ranks / (n_ranks - 1)
            # or steadily busier in its own work, step after step, where its loader's jitter
            # (and its peers') left its arrival barely late, or early, in these steps: late by
            # that much in expectation (a backward 9% longer on one rank of a data-bound run
            # whose loading varied by 10 ms a batch: nobody named, "data-bound, high")
            lateness = max(lateness, float(own_excess[j]))
            if lateness >= MINOR_SHARE * typical:  # consistent, under the material share
                roles.minor[int(rank)] = lateness
    if len(roles.minor) > n_ranks / 2:  # not a minority: the others are the odd ones (as
        # for stragglers: of two ranks, the late one)
        roles.minor = {}
    lean = roles.leaning()
    if lean is not None:
        j = int(np.flatnonzero(ranks == lean[0])[0])
        if (material[j] or material_median[j]) and mean[j] < 0:
            roles.probable = lean
    if not roles.late and min_share > 0:
        roles.unruled = _unruled(mean, sd, n, ranks, min_share * typical)
    if min_share > 0 and n >= MIN_STEPS:
        k = n_ranks / (n_ranks - 1)
        upper = (-mean + t_critical(n - 1, RULE_OUT_ALPHA) * sd / math.sqrt(n)) * k
        free = np.array([int(r) not in roles.late for r in ranks]) & np.isfinite(upper)
        if free.any():
            roles.floor_ns = max(float(upper[free].max()), 0.0)
    return roles


def last_too_often(slow: np.ndarray, alpha: float) -> np.ndarray:
    """Per rank: whether it arrived last (`slow`, steps x ranks) in more steps than chance
    allows at `alpha` (the per-rank level): a binomial count against the share of ranks last in
    a step on average, its tail bounded by Chernoff's exp(-n KL(k/n || p)), which errs on the
    side of not naming. Among many ranks a rank late only every other step (a data stall) has
    waits too spread for the t-tests (of 32 ranks, last in 9 of 19 steps, t = -3.9), yet by
    chance one of 32 would be last in 9 of 19 with odds under 1e-8."""
    slow = slow[~slow.all(axis=1)]  # a step where nobody waited tells nothing of who is last
    n = slow.shape[0]
    p = float(slow.mean()) if slow.size else 0.0
    if n < 2 or not 0.0 < p < 1.0:
        return np.zeros(slow.shape[1], dtype=bool)
    q = slow.sum(axis=0) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(q > 0, q * np.log(q / p), 0.0) + \
            np.where(q < 1, (1 - q) * np.log((1 - q) / (1 - p)), 0.0)
    return (q > p) & (n * kl >= -math.log(alpha))


def others_median(b: np.ndarray) -> np.ndarray:
    """Per (step, rank) of a steps x ranks table: the median of the other ranks' values in that
    step. Without a rank's own value the k-th smallest of the others is the row's k-th smallest
    where the value lies above it, else the next one (equal values give the same either way):
    two or three order statistics per row, found by a partition (linear), not a sort."""
    steps, n = b.shape
    m = n - 1
    if m % 2:
        lo, hi = order_stats.pair(b, m // 2, axis=1)
        return np.where(b <= lo, hi, lo)
    a, c, d = order_stats.triple(b, m // 2, axis=1)
    return 0.5 * (np.where(b <= a, c, a) + np.where(b <= c, d, c))


def _unruled(mean, sd, n: int, ranks, bound: float) -> tuple[int, float, float, float] | None:
    """The rank whose lateness these steps leave most room for, where that room reaches a
    material straggler's (`bound`, ns of lateness against the other ranks' mean). A rank's
    lateness in a step is its wait's offset below the step's mean, times n / (n - 1); its upper
    bound adds the one-sided t quantile at RULE_OUT_ALPHA of its standard error."""
    k = ranks.size / (ranks.size - 1)
    late = -mean * k
    upper = (-mean + t_critical(n - 1, RULE_OUT_ALPHA) * sd / math.sqrt(n)) * k
    upper = np.where(np.isfinite(upper) & (late > 0), upper, -np.inf)
    j = int(np.argmax(upper))
    if late[j] <= 0 or upper[j] < bound:
        return None
    return int(ranks[j]), float(late[j]), float(upper[j]), float(bound)


def _t(mean: float, se: float, tiny: float) -> float:
    """mean / se; the same offset every step (se 0) is consistent if there is one at all."""
    if se > 0:
        return mean / se
    return math.copysign(math.inf, mean) if abs(mean) > tiny else 0.0


TRIM = 0.2  # Yuen's trimmed t: the share of steps set aside at each end


def yuen(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per column of `x` (steps x ranks): the 20% trimmed mean, its standard error from the
    winsorized variance, and the degrees of freedom (Yuen 1974: h - 1, h the steps kept). With
    under 5 steps nothing is trimmed: the plain one-sample t test. Some columns at a time."""
    n = x.shape[0]
    g = int(TRIM * n)
    h = n - 2 * g
    tmean, var_w = np.empty(x.shape[1]), np.zeros(x.shape[1])
    for cols in col_chunks(x):  # (centred_stats gives it one chunk at a time)
        s = np.sort(x[:, cols], axis=0)
        tmean[cols] = s[g:n - g].mean(axis=0)
        if n > 1:
            var_w[cols] = np.clip(x[:, cols], s[g], s[n - g - 1]).var(axis=0, ddof=1)
    se = np.sqrt((n - 1) * var_w / (h * max(h - 1, 1)))
    return tmean, se, max(h - 1, 1)


def centred_stats(w: np.ndarray) -> tuple:
    """Per column of x = w less each row's mean: (mean, sd, yuen(x), median), made some
    columns of x at a time."""
    row_mean = w.mean(axis=1, keepdims=True)
    n, k = w.shape
    mean, sd, median = np.empty(k), np.empty(k), np.empty(k)
    tmean, se = np.empty(k), np.empty(k)

    def stats(cols) -> int:
        x = w[:, cols] - row_mean
        mean[cols], sd[cols] = x.mean(axis=0), x.std(axis=0, ddof=1)
        tmean[cols], se[cols], dof = yuen(x)
        median[cols] = order_stats.median(x, axis=0)
        return dof

    dofs = each_chunk(stats, col_chunks(w), w.size)
    return mean, sd, (tmean, se, dofs[-1] if dofs else 1), median


def rank_z(w: np.ndarray) -> np.ndarray:
    """Per rank (column), the z score of its mean within-step rank of wait (steps x ranks):
    < 0 waits least (arrives last), > 0 waits most."""
    steps, n = w.shape
    sd = math.sqrt((n * n - 1) / 12 / steps)
    return (_mean_row_rank(w) - (n + 1) / 2) / sd


def _mean_row_rank(w: np.ndarray) -> np.ndarray:
    """Per column, row_ranks(w).mean(axis=0): each column's places summed from the sort's
    order (exact: integers and halves), no table of ranks; some rows at a time."""
    steps, n = w.shape

    def summed(rows):
        order = np.argsort(w[rows], axis=1)
        places = _places(np.take_along_axis(w[rows], order, axis=1)).ravel()
        return np.bincount(order.ravel(), places, n)

    total = np.zeros(n)
    for part in each_chunk(summed, row_chunks(w), w.size):
        total += part  # (integers and halves: exact in any order)
    return total / steps


def row_ranks(w: np.ndarray) -> np.ndarray:
    """Each value's rank within its row, 1-based, ties given their average rank (pandas'
    rank(axis=1, method="average") for values without NaN), on one sort of the rows."""
    if not w.size:
        return np.zeros(w.shape)
    order = np.argsort(w, axis=1)  # equal values share their average rank: any order of them
    out = np.empty(w.shape)
    np.put_along_axis(out, order, _places(np.take_along_axis(w, order, axis=1)), axis=1)
    return out


def _places(s: np.ndarray) -> np.ndarray:
    """The 1-based rank of each value of rows sorted (`s`), ties given their average: each
    value its place, then the few runs of equal values set to their mean place (no row-long
    arrays beyond the result)."""
    steps, n = s.shape
    # flat positions of the values equal to the one before them in their row
    cont = np.flatnonzero((s[:, 1:] == s[:, :-1]).ravel())
    if not cont.size:  # no ties (waits in ns rarely tie): a value's rank is its place
        return np.broadcast_to(np.arange(1.0, n + 1), s.shape)
    row, j = np.divmod(cont, n - 1)
    cont = row * n + j + 1
    first = np.r_[True, cont[1:] != cont[:-1] + 1]  # a run's first continuing value
    starts = cont[first] - 1  # the run's first value
    ends = np.r_[cont[np.flatnonzero(first)[1:] - 1], cont[-1]]  # and its last
    avg = (starts % n + ends % n + 2) / 2  # the mean of its 1-based places
    out = np.empty(s.shape)
    out[:] = np.arange(1.0, n + 1)
    flat = out.reshape(-1)
    flat[starts] = avg
    flat[cont] = avg[np.cumsum(first) - 1]
    return out


def persistent_steps(roles: Roles, steps: np.ndarray) -> np.ndarray:
    """Bool per step: a consistently (or probably) late rank arrived last, or a consistently
    early one waited."""
    out = np.zeros(len(steps), dtype=bool)
    if roles.slow is None or not (roles.persistent or roles.probable):
        return out
    have, slow, there = ((roles.all_steps, roles.all_slow, roles.all_present)
                         if roles.all_steps is not None
                         else (roles.steps, roles.slow, np.ones_like(roles.slow)))
    pos = np.searchsorted(have, steps).clip(max=have.size - 1)
    known = have[pos] == steps
    rows, present = slow[pos], there[pos]
    col = {int(r): j for j, r in enumerate(roles.ranks)}
    busiest = None
    if roles.busiest is not None and roles.late:  # a straggler's steps: it arrived last, or
        # it was the busiest rank while noise reordered the arrivals
        bs, br = roles.busiest
        bpos = np.searchsorted(bs, steps).clip(max=max(bs.size - 1, 0))
        busiest = np.where(bs[bpos] == steps, br[bpos], -1) if bs.size else None
    for rank in roles.late_ranks:
        out |= known & rows[:, col[rank]]
        if busiest is not None and rank in roles.late:
            out |= busiest == rank
    for rank in roles.early:
        out |= known & present[:, col[rank]] & ~rows[:, col[rank]]
    return out


#: a rank the others waited for in at least this share of the steps whose waiting stands out,
#: in at least INTERMITTENT_MIN of them, while those steps are at most INTERMITTENT_MOST of all
#: steps: its lateness is intermittent (a periodic checkpoint, GC or logging on one rank)
INTERMITTENT_SHARE = 0.8
INTERMITTENT_MIN = 3
INTERMITTENT_MOST = 0.6


def intermittent(roles: Roles, steps: pd.DataFrame, wait_share: float,
                 named: set[int]) -> dict | None:
    """The one rank the others waited for in nearly all of the steps whose longest wait stands
    out (beyond the run's median longest wait by `wait_share` of the median step), when those
    steps are a minority: a rank late in 10 of 48 steps, every 5th. {"rank", "late_steps",
    "of_steps" (the steps that stand out), "steps" (all analysed), "every" (the late steps'
    common spacing, else None), "excess_ms" (the median other rank's wait in its late steps,
    the mean of those: how late it was)}. None where no rank is, or it is
    already named (`named`: stragglers and probable ones)."""
    out = _standing_out(roles, steps, wait_share)
    if out is None:
        return None
    w = roles.waits
    m = int(out.sum())
    if m < INTERMITTENT_MIN or m > INTERMITTENT_MOST * roles.steps.size:
        return None
    last = np.argmin(w[out], axis=1)  # in each, the rank that arrived last: it waited least
    counts = np.bincount(last, minlength=w.shape[1])
    j = int(np.argmax(counts))
    rank = int(roles.ranks[j])
    if counts[j] < max(INTERMITTENT_MIN, INTERMITTENT_SHARE * m) or rank in named:
        return None
    late = last == j
    at = roles.steps[out][late].astype(np.int64)
    every = _spacing(at)
    # chance alone: among n ranks equally likely to be last, the likeliest to be last so often
    # (a binomial tail, times n for picking the most frequent); and where its late steps are
    # evenly spaced, the chance that c of the S steps are (arithmetic progressions of c steps,
    # spacing 2 or more, over all sets of c): at the family-wise level
    n, c, S = w.shape[1], int(counts[j]), int(roles.steps.size)
    chance = n * sum(math.comb(m, k) * (n - 1) ** (m - k) for k in range(c, m + 1)) / n ** m
    if every is not None:
        chance *= sum(max(S - (c - 1) * d, 0) for d in range(2, S)) / math.comb(S, c)
    if chance > FAMILY_ALPHA:
        return None
    excess = _late_by(w[out][late], j)
    return {"rank": rank, "late_steps": [int(s) for s in at], "of_steps": m,
            "steps": int(roles.steps.size), "every": every,
            "excess_ms": round(excess / 1e6, 2)}


#: a named straggler whose steps that stand out hold more than this share of the waiting it
#: caused, while they are a minority of the steps: its lateness comes in bursts (Roles.bursts)
BURST_SHARE = 0.5
BURST_MIN = 2


def bursts(roles: Roles, steps: pd.DataFrame, wait_share: float, rank: int) -> dict | None:
    """Where a named straggler's lateness sits: in a few steps that stand out (the others'
    longest wait beyond the run's median longest wait by `wait_share` of the median step, the
    rule of `intermittent`), when it arrived last in them, they are at most INTERMITTENT_MOST
    of the steps and at least BURST_MIN, and they hold more than BURST_SHARE of the waiting it
    caused: a rank last in all 8 profiled steps, 19 ms late in 2 of them and 3 ms in the rest
    (a checkpoint or a slow batch every few steps; on a busy machine, small delays elsewhere).
    Where its busy time was compared with its peers' (Roles.busy_excess), those steps must also
    hold more than BURST_SHARE of its own excess: a rank 30 ms busier in every step of a loaded
    machine, whose load piled the others' waiting into a third of the steps, is constant. {"steps" (the late ones), "of_steps" (all), "share" (of the
    waiting it caused), "every" (their common spacing, else None), "excess_ms" (the median
    other rank's wait in them, their mean)}; None otherwise."""
    stand = _standing_out(roles, steps, wait_share)
    if stand is None:
        return None
    at = np.flatnonzero(roles.ranks == rank)
    if not at.size:
        return None
    j = int(at[0])
    w = roles.waits
    out = stand & roles.slow[:, j]
    m, n = int(out.sum()), int(roles.steps.size)
    if m < BURST_MIN or m > INTERMITTENT_MOST * n:
        return None
    # the waiting it caused: each step's waits where it arrived last, shared among the last
    last = roles.slow[:, j] / np.maximum(roles.slow.sum(axis=1), 1)
    caused = w.sum(axis=1) * last
    total = float(caused.sum())
    share = float(caused[out].sum()) / total if total > 0 else 0.0
    if share <= BURST_SHARE:
        return None
    own = roles.busy_excess.get(rank)
    if own is not None:  # and its own excess: a load's waiting is not the rank's bursts
        own = np.maximum(own, 0.0)
        if float(own[out].sum()) <= BURST_SHARE * float(own.sum()):
            return None
    late = roles.steps[out].astype(np.int64)
    return {"steps": [int(x) for x in late], "of_steps": n, "share": round(share, 3),
            "every": _spacing(late), "excess_ms": round(_late_by(w[out], j) / 1e6, 2)}


def _standing_out(roles: Roles, steps: pd.DataFrame, wait_share: float) -> np.ndarray | None:
    """Per step every rank recorded: its longest wait stands out, beyond the run's median
    longest wait by `wait_share` of the median step. None where roles or step times lack."""
    if roles.slow is None or roles.waits is None or not roles.decided or roles.ranks is None \
            or "step_ns" not in steps:
        return None
    step_ns = steps.set_index("step")["step_ns"].reindex(roles.steps).to_numpy(np.float64)
    if not np.isfinite(step_ns).any():
        return None
    top = roles.waits.max(axis=1)
    return top - np.median(top) >= wait_share * np.nanmedian(step_ns)


def _spacing(at: np.ndarray) -> int | None:
    """The common spacing of these steps (2 or more), else None."""
    gaps = np.unique(np.diff(at))
    return int(gaps[0]) if gaps.size == 1 and gaps[0] > 1 else None


def _late_by(w: np.ndarray, j: int) -> float:
    """How late rank column j was in these steps (rows of waits): the median other rank's wait
    for it, their mean (ns)."""
    return float(np.median(np.delete(w, j, axis=1), axis=1).mean())
