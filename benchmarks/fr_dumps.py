"""Flight Recorder dumps of a Megatron-style job, in the shape torch writes them (format 2.10: a
pickle of version, pg_config, pg_status and the ring of entries with shared stack frames), for a
job of any size that hangs in a known way: for tests/test_flight_recorder.py and
benchmarks/bench_fr.py.

The job: world = TP x CP x EP-within-DP x PP ranks, each a member of one tensor-, context-,
expert-, pipeline- and data-parallel group besides the default one; every group of one kind
carries one description, and the groups are named by one counter over every new_group call, as
torch does (the pg_id in pg_status counts the groups each process built: its own numbering).
Each step issues, per layer, a TP all-reduce, a CP all-gather, an EP all-to-all pair and a TP
all-reduce, then a send / recv to the next pipeline stage and a DP reduce-scatter and all-gather.

What happened is simulated, not written in: every rank issues its step's collectives without
waiting (as NCCL does) and syncs at the step's end; each rank's device runs them in order; a
collective completes when every member's device reached it, a send / recv when its partner's did.
A fault stops one rank issuing at a given collective of a step:
- "behind": the rank stops issuing (stuck in Python);
- "empty": the same, and its dump holds no entries (dumped with only the active ones);
- "missing": the same, and it writes no dump;
- "mismatch": the rank issues an all-reduce of [1] where the others issue that collective;
- "transfer": every member of the rank's group issues that collective and it never completes
  (a link down): no rank stopped the job.
`rank` may be a list: each of them stops.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

KINDS = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "cp": "CONTEXT_PARALLEL_GROUP",
         "ep": "EXPERT_MODEL_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
         "dp": "DATA_PARALLEL_GROUP"}
T0 = 1_796_500_000_000_000_000
STEP_NS = 400_000_000


@dataclass
class Layout:
    tp: int = 8
    cp: int = 2
    ep: int = 8
    pp: int = 4
    world: int = 1024

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.cp * self.pp)

    def coords(self, r: int) -> dict:
        return {"tp": r % self.tp, "cp": r // self.tp % self.cp,
                "dp": r // (self.tp * self.cp) % self.dp, "pp": r // (self.tp * self.cp * self.dp)}

    def rank(self, c: dict) -> int:
        return ((c["pp"] * self.dp + c["dp"]) * self.cp + c["cp"]) * self.tp + c["tp"]

    def groups(self) -> list[tuple[str, list[int]]]:
        """(kind, ranks) of every group, in the order the job builds them."""
        out = []
        for kind in ("tp", "cp", "ep", "pp", "dp"):
            seen = set()
            for r in range(self.world):
                c = self.coords(r)
                if kind == "ep":  # EP groups: `ep` consecutive data-parallel ranks
                    members = [self.rank({**c, "dp": d}) for d in range(self.dp)
                               if d // self.ep == c["dp"] // self.ep]
                else:
                    size = getattr(self, kind)
                    members = [self.rank({**c, kind: i}) for i in range(size)]
                key = tuple(members)
                if key not in seen:
                    seen.add(key)
                    out.append((kind, members))
        return out


def _program(lay: Layout, layers: int = 2) -> list[tuple[str, str, list]]:
    """One step's collectives: (group kind, kind of call, input sizes)."""
    ops = []
    for _ in range(layers):
        ops += [("tp", "all_reduce", [[4096, 1024]]), ("cp", "_all_gather_base", [[2048, 1024]]),
                ("ep", "all_to_all", [[8192, 1024]]), ("ep", "all_to_all", [[8192, 1024]]),
                ("tp", "all_reduce", [[4096, 1024]])]
    ops += [("pp", "recv", [[4096, 1024]]), ("pp", "send", [[4096, 1024]]),
            ("dp", "_reduce_scatter_base", [[65536]]), ("dp", "_all_gather_base", [[8192]])]
    return ops


_FRAMES = {}


def _frames(kind: str, call: str) -> list[dict]:
    """Shared frame lists (torch's dump shares one frame object between entries)."""
    key = (kind, call)
    if key not in _FRAMES:
        user = {"tp": ("megatron/core/tensor_parallel/mappings.py", 41, "_reduce"),
                "cp": ("megatron/core/transformer/attention.py", 512, "forward"),
                "ep": ("megatron/core/transformer/moe/token_dispatcher.py", 233, "dispatch"),
                "pp": ("megatron/core/pipeline_parallel/p2p_communication.py", 300, "_p2p_ops"),
                "dp": ("megatron/core/distributed/param_and_grad_buffer.py", 188,
                       "start_grad_sync")}[kind]
        _FRAMES[key] = [
            {"name": call, "filename": "/usr/local/lib/python3.12/dist-packages/torch/distributed/"
             "distributed_c10d.py", "line": 2800},
            {"name": "wrapper", "filename": "/usr/local/lib/python3.12/dist-packages/torch/"
             "distributed/c10d_logger.py", "line": 81},
            {"name": user[2], "filename": "/workspace/Megatron-LM/" + user[0], "line": user[1]},
            {"name": "forward_step", "filename": "/workspace/Megatron-LM/megatron/core/"
             "pipeline_parallel/schedules.py", "line": 275},
            {"name": "train_step", "filename": "/workspace/Megatron-LM/megatron/training/"
             "training.py", "line": 1450},
            {"name": "pretrain", "filename": "/workspace/Megatron-LM/megatron/training/"
             "training.py", "line": 720},
            {"name": "<module>", "filename": "/workspace/Megatron-LM/pretrain_gpt.py",
             "line": 300}]
    return _FRAMES[key]


class _Job:
    def __init__(self, lay: Layout, step: int, fault: str, ranks: list[int], at: int):
        self.lay, self.step, self.fault, self.at = lay, step, fault, at
        self.culprits = set(ranks)
        self.ops = _program(lay)
        self.n = len(self.ops)
        self.groups = lay.groups()
        self.member: dict[tuple[int, str], int] = {}  # (rank, kind) -> index in groups
        for i, (kind, ranks) in enumerate(self.groups):
            for r in ranks:
                self.member[(r, kind)] = i
        self.counts = {k: sum(1 for o in self.ops if o[0] == k) for k in KINDS}

    def partner(self, r: int, i: int) -> int | None:
        """The rank a send / recv at op i pairs with; None where the stage has none."""
        c = self.lay.coords(r)
        kind = self.ops[i % self.n][1]
        p = c["pp"] + (1 if kind == "send" else -1)
        return self.lay.rank({**c, "pp": p}) if 0 <= p < self.lay.pp else None

    def run(self) -> tuple[list[int], list[int]]:
        """(ops issued, ops completed on the device) per rank, from the start of `step`."""
        w, n = self.lay.world, self.n
        start = self.step * n
        done = [start] * w
        issued = [start] * w
        changed = True
        while changed:
            changed = False
            for r in range(w):
                cap = (done[r] // n + 1) * n  # a step's ops, then the sync at its end
                if r in self.culprits and self.fault not in ("mismatch", "transfer"):
                    cap = min(cap, start + self.at)
                if issued[r] < cap:
                    issued[r], changed = cap, True
            for r in range(w):
                while done[r] < issued[r]:
                    together = self._ready(r, done, issued)
                    if not together:
                        break
                    for m in together:  # a collective completes on every member at once
                        done[m] += 1
                    changed = True
        return issued, done

    def _ready(self, r: int, done, issued) -> list[int]:
        """The ranks whose op completes with rank r's next one ([] where it cannot yet)."""
        i = done[r]
        kind, call, _ = self.ops[i % self.n]
        if self.fault in ("mismatch", "transfer") and i == self.step * self.n + self.at and \
                any(self.member[(r, kind)] == self.member.get((c, kind)) for c in self.culprits):
            return []  # the odd call never matches its peers', or the link is down
        if kind == "pp":
            p = self.partner(r, i)
            if p is None:
                return [r]
            j = i - 1 if call == "send" else i + 1  # the partner's matching op (recv, send)
            return [r, p] if done[p] == j and issued[p] > j else []
        ranks = self.groups[self.member[(r, kind)]][1]
        return ranks if all(done[m] == i and issued[m] > i for m in ranks) else []


def make_job(folder: str, lay: Layout | None = None, fault: str = "behind", rank=517,
             at: int = 2, step: int = 300, ring: int = 2000, prefix: str = "_dump_",
             fmt: str = "pickle") -> dict:
    """Write every rank's dump of a job that hung as `fault` says into `folder`; return what is
    true: {"culprit", "group", "seq", "waiting"}."""
    lay = lay or Layout()
    ranks = [rank] if isinstance(rank, int) else list(rank)
    rank = ranks[0]
    job = _Job(lay, step, fault, ranks, at)
    issued, done = job.run()
    os.makedirs(folder, exist_ok=True)
    names = {i: str(i + 1) for i in range(len(job.groups))}  # "0" is the default group
    for r in range(lay.world):
        if fault == "missing" and r in job.culprits:
            continue
        d = _dump(job, r, issued[r], done[r], names, ring,
                  empty=fault == "empty" and r in job.culprits)
        path = os.path.join(folder, f"{prefix}{r}")
        if fmt == "json":
            import json

            with open(path, "w") as fh:
                json.dump(_as_json(d), fh)
        else:
            with open(path, "wb") as fh:
                pickle.dump(d, fh, protocol=2)
    kind = job.ops[at][0]
    g = job.member[(rank, kind)]
    seq = step * job.counts[kind] + sum(1 for o in job.ops[:at] if o[0] == kind) + 1
    return {"culprit": rank, "culprits": ranks, "group": names[g], "desc": KINDS[kind], "seq": seq,
            "members": job.groups[g][1], "issued": issued, "done": done}


def _dump(job: _Job, r: int, issued: int, done: int, names, ring: int, empty: bool) -> dict:
    lay, n = job.lay, job.n
    mine = [(kind, job.member[(r, kind)]) for kind in ("tp", "cp", "ep", "pp", "dp")]
    uid = {g: i + 1 for i, (_, g) in enumerate(mine)}  # the process's own numbering
    pg_config = {"0": {"name": "0", "desc": "default_pg",
                       "ranks": str(list(range(lay.world)))}}
    for kind, g in mine:
        pg_config[names[g]] = {"name": names[g], "desc": KINDS[kind],
                               "ranks": str(job.groups[g][1])}
    seqs = {kind: 0 for kind in KINDS}
    p2p = 0
    entries, status = [], {}
    first = max(0, issued - ring)
    for i in range(issued):
        kind, call, sizes = job.ops[i % n]
        if kind == "pp":
            if job.partner(r, i) is None:
                continue
            p2p += 1
        else:
            seqs[kind] += 1
        g = job.member[(r, kind)]
        complete = i < done
        if job.fault == "mismatch" and r in job.culprits and i == job.step * n + job.at:
            call, sizes = "all_reduce", [[1]]
        st = status.setdefault(uid[g], [0, 0, 0]) if kind != "pp" else None
        if st is not None:
            st[0] = seqs[kind]
            st[1] = seqs[kind] if i <= done else st[1]
            st[2] = seqs[kind] if complete else st[2]
        if i < first or empty:
            continue
        created = T0 + (i // n) * STEP_NS + (i % n) * (STEP_NS // n)
        entries.append({
            "record_id": len(entries), "pg_id": uid[g], "process_group": (names[g], KINDS[kind]),
            "collective_seq_id": 0 if kind == "pp" else seqs[kind],
            "p2p_seq_id": p2p if kind == "pp" else 0, "op_id": i + 1,
            "profiling_name": f"nccl:{_p2p_name(job, r, i, call)}", "time_created_ns": created,
            "duration_ms": 1.5 if complete else None,
            "input_sizes": sizes, "input_dtypes": ["BFloat16"],
            "output_sizes": _out_sizes(call, sizes, len(job.groups[g][1])),
            "output_dtypes": ["BFloat16"],
            "state": "completed" if complete else "started" if i == done else "scheduled",
            "time_discovered_started_ns": created + 1000 if i <= done else None,
            "time_discovered_completed_ns": created + 2_000_000 if complete else None,
            "retired": complete, "timeout_ms": 600_000, "is_p2p": kind == "pp",
            "thread_id": "140000000000000", "thread_name": "pt_main_thread",
            "frames": _frames(kind, call)})
    return {"version": "2.10", "comm_lib_version": "2.27.3", "pg_config": pg_config,
            "pg_status": {str(u): {"last_enqueued_collective": s[0],
                                   "last_started_collective": s[1],
                                   "last_completed_collective": s[2]}
                          for u, s in sorted(status.items())},
            **({} if empty else {"entries": entries})}


def _out_sizes(call: str, sizes: list, n: int) -> list:
    """What a collective gives back: an all-gather n times its input, a reduce-scatter 1/n."""
    if call == "_all_gather_base":
        return [[sizes[0][0] * n, *sizes[0][1:]]]
    if call == "_reduce_scatter_base":
        return [[sizes[0][0] // n, *sizes[0][1:]]]
    return sizes


def _p2p_name(job: _Job, r: int, i: int, call: str) -> str:
    """NCCL's name of a send / recv: "send 0->1", "recv 1<-0", ranks in the group."""
    if call not in ("send", "recv"):
        return call
    me, peer = job.lay.coords(r)["pp"], job.lay.coords(job.partner(r, i))["pp"]
    return f"send {me}->{peer}" if call == "send" else f"recv {me}<-{peer}"


def _as_json(d: dict) -> dict:
    """The dump as `_dump_fr_trace_json` writes it: pg_status as strings, no entries key when
    there are none."""
    out = dict(d)
    out["pg_status"] = {u: {k: str(v) for k, v in s.items()} for u, s in d["pg_status"].items()}
    if "entries" in d:
        out["entries"] = [{**e, "process_group": list(e["process_group"])} for e in d["entries"]]
    return out


if __name__ == "__main__":
    import sys
    import time

    t = time.perf_counter()
    truth = make_job(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fr1024")
    print({k: v for k, v in truth.items() if k not in ("issued", "done")},
          f"{time.perf_counter() - t:.1f} s")
