"""`gpuscope doctor`: is this machine ready for a long distributed run?

Checks, each PASS / WARN / FAIL / SKIP with one line of detail:
  1. versions: Python, torch, its CUDA and NCCL builds;
  2. GPUs: visible to torch and to NVML, all of one model, the driver new enough for torch's CUDA;
  3. peer-to-peer access / NVLink between every pair of GPUs;
  4. free memory on each GPU;
  5. smoke test: a few tiny DDP training steps and an all-reduce on every device (NCCL on GPUs,
     gloo on CPU), in real processes, with the result checked.
Exit code 0 when nothing failed, 1 otherwise. The probes go through `Probe`, the seam tests
replace to stand in for GPUs this machine does not have.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

PASS, WARN, FAIL, SKIP, INFO = "PASS", "WARN", "FAIL", "SKIP", "INFO"


@dataclass
class Check:
    name: str
    status: str
    detail: str


class Probe:
    """Reads the machine: torch, CUDA and NVML (read-only)."""

    def __init__(self):
        import torch

        self.torch = torch

    def versions(self) -> dict:
        t = self.torch
        nccl = None
        try:
            if t.cuda.is_available():
                v = t.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        return {"python": sys.version.split()[0], "torch": t.__version__,
                "torch_cuda": t.version.cuda, "nccl": nccl,
                "gloo": bool(t.distributed.is_available() and t.distributed.is_gloo_available()),
                "nccl_backend": bool(t.distributed.is_available()
                                     and t.distributed.is_nccl_available())}

    def cuda_devices(self) -> list[dict]:
        t = self.torch
        if not t.cuda.is_available():
            return []
        out = []
        for i in range(t.cuda.device_count()):
            p = t.cuda.get_device_properties(i)
            free, total = t.cuda.mem_get_info(i)
            out.append({"index": i, "name": p.name, "total": int(total), "free": int(free),
                        "capability": f"{p.major}.{p.minor}"})
        return out

    def peer_access(self, i: int, j: int) -> bool:
        return bool(self.torch.cuda.can_device_access_peer(i, j))

    def nvml(self) -> dict:
        """Driver facts from NVML, or {"error": why}."""
        from .record.nvml import NvmlApi, NvmlUnavailable

        try:
            api = NvmlApi()
        except NvmlUnavailable as exc:
            return {"error": str(exc)}
        try:
            nv = api.nv
            out = {"driver": api.driver_version(), "cuda_driver": api.cuda_driver_version(),
                   "count": api.device_count(), "nvlink": {}}
            for i in range(out["count"]):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                links = 0
                for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                    try:
                        links += int(nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED)
                    except Exception:
                        break
                out["nvlink"][i] = links
            return out
        finally:
            api.shutdown()


def _fmt_gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _cuda_int(version: str | None) -> int | None:
    """"12.4" -> 12040, as NVML reports the driver's CUDA version."""
    if not version:
        return None
    major, _, minor = version.partition(".")
    try:
        return int(major) * 1000 + int(minor or 0) * 10
    except ValueError:
        return None


def check_environment(probe: Probe) -> list[Check]:
    checks: list[Check] = []
    v = probe.versions()
    checks.append(Check("versions", INFO, f"Python {v['python']}, torch {v['torch']}, CUDA build "
                        f"{v['torch_cuda'] or 'none (CPU build)'}, NCCL {v['nccl'] or '-'}"))
    devices = probe.cuda_devices()
    nv = probe.nvml()
    if not devices:
        why = nv.get("error") if "error" in nv else f"NVML sees {nv.get('count')} GPU(s)"
        checks.append(Check("GPUs visible", SKIP if "error" in nv or not nv.get("count") else FAIL,
                            f"no CUDA device visible to torch ({why})"
                            + ("; CPU / gloo path checked below" if "error" in nv or
                               not nv.get("count") else
                               ": the driver sees GPUs that torch does not (CPU build of torch? "
                               "CUDA_VISIBLE_DEVICES?)")))
        checks.append(Check("gloo backend", PASS if v["gloo"] else FAIL,
                            "available" if v["gloo"] else "torch.distributed lacks gloo"))
        return checks
    names = sorted({d["name"] for d in devices})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if "error" not in nv and nv["count"] > len(devices) and not visible:
        checks.append(Check("GPUs visible", WARN, f"torch sees {len(devices)} of the "
                            f"{nv['count']} GPUs the driver reports"))
    else:
        checks.append(Check("GPUs visible", PASS, f"{len(devices)} x {', '.join(names)}"))
    checks.append(Check("one GPU model", PASS if len(names) == 1 else WARN,
                        names[0] if len(names) == 1 else
                        f"mixed models {names}: the slowest card sets the pace (stragglers)"))
    if "error" in nv:
        checks.append(Check("driver", WARN, f"cannot read the driver through NVML: {nv['error']}"))
    else:
        need = _cuda_int(v["torch_cuda"])
        ok = need is None or nv["cuda_driver"] >= need
        checks.append(Check("driver / CUDA", PASS if ok else FAIL,
                            f"driver {nv['driver']} supports CUDA {nv['cuda_driver'] // 1000}."
                            f"{nv['cuda_driver'] % 1000 // 10}; torch needs {v['torch_cuda']}"
                            + ("" if ok else ": update the driver or install a torch built for "
                               "an older CUDA")))
    checks.append(Check("NCCL", PASS if v["nccl_backend"] else FAIL,
                        f"NCCL {v['nccl']}" if v["nccl_backend"] else "torch has no NCCL backend"))
    if len(devices) > 1:
        missing = [(i, j) for i in range(len(devices)) for j in range(len(devices))
                   if i != j and not probe.peer_access(i, j)]
        links = nv.get("nvlink", {}) if "error" not in nv else {}
        nvl = f"; NVLink links per GPU: {links}" if links else ""
        checks.append(Check("peer-to-peer", PASS if not missing else WARN,
                            ("all pairs" if not missing else
                             f"no P2P between {missing[:6]}: collectives go through host memory")
                            + nvl))
    low = [d for d in devices if d["free"] < 0.5 * d["total"]]
    checks.append(Check("free memory", PASS if not low else WARN,
                        ", ".join(f"GPU{d['index']} {_fmt_gib(d['free'])} of {_fmt_gib(d['total'])}"
                                  for d in devices)
                        + ("" if not low else ": other processes hold GPU memory")))
    return checks


# ----------------------------------------------------------------------------- smoke test
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _smoke_worker(rank: int, world: int, port: int, backend: str, result_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=60))
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    t0 = time.perf_counter()
    x = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(x)
    expected = world * (world + 1) / 2
    ok = bool(torch.allclose(x, torch.full_like(x, expected)))
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(device),
        device_ids=[rank] if backend == "nccl" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(32, 64, device=device)).pow(2).mean().backward()
        opt.step()
    p = next(model.parameters()).detach().flatten()[:4].clone()
    gathered = [torch.zeros_like(p) for _ in range(world)]
    dist.all_gather(gathered, p)
    ok = ok and all(torch.allclose(g, gathered[0]) for g in gathered)  # replicas in sync
    if backend == "nccl":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    with open(os.path.join(result_dir, f"rank{rank}"), "w") as fh:
        fh.write(f"{int(ok)} {ms:.1f}")
    dist.barrier()  # rank 0 hosts the store: no rank tears down while another still uses it
    dist.destroy_process_group()


def smoke_test(world: int, backend: str, timeout: float = 120, worker=_smoke_worker) -> Check:
    """Start `world` processes running `worker`; each writes "ok ms" when its checks are done.

    A worker that dies after writing its result (a crash in torch's own teardown) does not fail
    the check, but is reported; one that dies before, or a wrong result, fails it."""
    import torch.multiprocessing as tmp

    name = f"smoke test ({backend}, {world} process{'es' if world > 1 else ''})"
    crash = ""
    with tempfile.TemporaryDirectory() as out:
        try:
            ctx = tmp.start_processes(worker, args=(world, free_port(), backend, out),
                                      nprocs=world, join=False, start_method="spawn")
            deadline = time.time() + timeout
            while not ctx.join(timeout=1):
                if time.time() > deadline:
                    for p in ctx.processes:
                        p.kill()
                    return Check(name, FAIL, f"hung for {timeout:.0f} s (collective never "
                                 "completed: check the network / NCCL_SOCKET_IFNAME / firewall)")
        except Exception as exc:
            crash = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
        results = {}
        for r in range(world):
            try:
                ok, ms = open(os.path.join(out, f"rank{r}")).read().split()
                results[r] = (ok == "1", float(ms))
            except (OSError, ValueError):
                results[r] = None
    missing = [r for r, res in results.items() if res is None]
    if missing:
        return Check(name, FAIL, crash or f"rank(s) {missing} gave no result")
    bad = [r for r, (ok, _) in results.items() if not ok]
    if bad:
        return Check(name, FAIL, f"wrong results on rank(s) {bad}")
    slowest = max(ms for _, ms in results.values())
    detail = (f"all-reduce, 5 DDP steps and a replica check on every rank in {slowest:.0f} ms")
    if crash:
        detail += f"; a worker then crashed while shutting down ({crash})"
    return Check(name, PASS, detail)


def run_doctor(probe: Probe | None = None, smoke: bool = True,
               cpu_world: int = 2) -> tuple[list[Check], int]:
    if probe is None:
        try:
            probe = Probe()
        except ImportError:  # an analysis-only install: nothing to train or record with here
            return [Check("torch", FAIL, "not installed: the training, gpuscope.record and the "
                          "smoke test need it (pip install torch); gpuscope analyze, its "
                          "dashboard and the TensorBoard tab do not")], 1
    checks = check_environment(probe)
    if smoke:
        devices = probe.cuda_devices()
        v = probe.versions()
        if devices and v["nccl_backend"]:
            checks.append(smoke_test(len(devices), "nccl"))
        elif v["gloo"]:
            checks.append(smoke_test(cpu_world, "gloo"))
    code = 1 if any(c.status == FAIL for c in checks) else 0
    return checks, code


def render(checks: list[Check], console) -> None:
    from rich.table import Table

    colors = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim", INFO: "cyan"}
    t = Table(title="gpuscope doctor", title_justify="left")
    t.add_column("check")
    t.add_column("status")
    t.add_column("detail")
    for c in checks:
        t.add_row(c.name, f"[{colors[c.status]}]{c.status}[/]", c.detail)
    console.print(t)
    fails = sum(c.status == FAIL for c in checks)
    console.print("[bold red]NOT READY[/]: fix the FAIL lines first" if fails else
                  "[green]ready[/]: no check failed")
