"""`gpuscope doctor`: the real CPU / gloo path here, and GPU situations through a fake probe."""

import json
import subprocess
import sys

import pytest

from gpuscope import doctor
from gpuscope.doctor import FAIL, PASS, SKIP, WARN, check_environment, run_doctor, smoke_test

GiB = 1 << 30


@pytest.mark.slow
def test_cpu_machine_says_so_and_checks_gloo_for_real():
    checks, code = run_doctor()
    by = {c.name: c for c in checks}
    assert by["GPUs visible"].status == SKIP and "no CUDA device" in by["GPUs visible"].detail
    assert by["gloo backend"].status == PASS
    smoke = by["smoke test (gloo, 2 processes)"]
    assert smoke.status == PASS and "all-reduce" in smoke.detail
    assert code == 0


@pytest.mark.slow
def test_cli_table_json_and_exit_code(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpuscope", "doctor", "--no-smoke", "--json",
                          str(tmp_path / "d.json")], capture_output=True, text=True)
    assert out.returncode == 0 and "gpuscope doctor" in out.stdout and "ready" in out.stdout
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["ok"] is True and any(c["name"] == "versions" for c in d["checks"])
    # issue 71, 11.: "-" is stdout, as for analyze, compare and scaling (it wrote a file "-")
    out = subprocess.run([sys.executable, "-m", "gpuscope", "doctor", "--no-smoke", "--json",
                          "-"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and not (tmp_path / "-").exists()
    assert [c["name"] for c in json.loads(out.stdout)["checks"]] == [c["name"] for c in d["checks"]]


@pytest.mark.slow
def test_a_crash_in_teardown_after_the_checks_passed_is_reported_not_failed():
    from doctor_workers import crash_after_result

    check = smoke_test(2, "gloo", timeout=60, worker=crash_after_result)
    assert check.status == PASS
    assert "crashed while shutting down" in check.detail and "signal SIGABRT" in check.detail


@pytest.mark.slow
def test_a_rank_that_dies_before_its_checks_fails_the_smoke_test():
    from doctor_workers import crash_before_result

    check = smoke_test(2, "gloo", timeout=60, worker=crash_before_result)
    assert check.status == FAIL and "SIGABRT" in check.detail


@pytest.mark.slow
@pytest.mark.parametrize("worker", ["wrong_sum", "replicas_apart"])
def test_a_wrong_result_fails_the_smoke_test(worker):
    """Real gloo processes whose all-reduce sum, or whose replicas, come out wrong: the check
    must fail (a worker that always reported success would pass this test)."""
    import doctor_workers

    check = smoke_test(2, "gloo", timeout=60, worker=getattr(doctor_workers, worker))
    assert check.status == FAIL and "wrong results on rank(s)" in check.detail


@pytest.mark.slow
def test_a_collective_that_cannot_run_fails_clearly():
    check = smoke_test(2, "nccl", timeout=60)  # this CPU build of torch has no NCCL
    assert check.status == FAIL and check.detail


class FakeProbe:
    """Fake machine (no GPU here): scripted devices, driver and peer access."""

    def __init__(self, names=("NVIDIA H100 80GB HBM3",) * 4, cuda_driver=12040, torch_cuda="12.4",
                 free=70, nvml_count=None, p2p=True):
        self.names, self.cuda_driver, self.torch_cuda = names, cuda_driver, torch_cuda
        self.free, self.nvml_count, self.p2p = free, nvml_count, p2p

    def versions(self):
        return {"python": "3.11", "torch": "2.5.1", "torch_cuda": self.torch_cuda,
                "nccl": "2.21.5", "gloo": True, "nccl_backend": True}

    def cuda_devices(self):
        return [{"index": i, "name": n, "total": 80 * GiB, "free": self.free * GiB,
                 "capability": "9.0"} for i, n in enumerate(self.names)]

    def peer_access(self, i, j):
        return self.p2p

    def nvml(self):
        return {"driver": "550.54", "cuda_driver": self.cuda_driver,
                "count": self.nvml_count or len(self.names), "nvlink": {0: 18}}


def _status(probe, name):
    return {c.name: c for c in check_environment(probe)}[name]


def test_healthy_gpus_pass():
    checks = check_environment(FakeProbe())
    assert all(c.status in (PASS, "INFO") for c in checks), checks


def test_mixed_models_warn():
    c = _status(FakeProbe(names=("NVIDIA H100", "NVIDIA A100")), "one GPU model")
    assert c.status == WARN and "stragglers" in c.detail


def test_old_driver_fails():
    c = _status(FakeProbe(cuda_driver=11080), "driver / CUDA")
    assert c.status == FAIL and "update the driver" in c.detail


def test_missing_peer_access_and_low_memory_warn():
    assert _status(FakeProbe(p2p=False), "peer-to-peer").status == WARN
    assert _status(FakeProbe(free=10), "free memory").status == WARN


def test_gpus_hidden_from_torch_are_reported(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _status(FakeProbe(nvml_count=8), "GPUs visible").status == WARN
    probe = FakeProbe()
    probe.cuda_devices = lambda: []
    assert _status(probe, "GPUs visible").status == FAIL


def test_failures_give_exit_code_1():
    _, code = run_doctor(FakeProbe(cuda_driver=11080), smoke=False)
    assert code == 1
    _, code = run_doctor(FakeProbe(), smoke=False)
    assert code == 0
    assert doctor.PASS == "PASS"
