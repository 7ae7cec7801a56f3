"""gpuscope never changes the training maths: 2-process DDP runs give bit-identical parameters
with and without record(), with DDP's default reduction, a user hook registered after record(),
and the fp16 / bf16 compression hooks. (Without the averaging in gpuscope's default-reduction
path, parameters differ by ~8: this is the test that notices.)"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)


@pytest.mark.slow
def test_parameters_are_bit_identical_with_and_without_gpuscope(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         os.path.join(HERE, "workloads", "same_maths.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"maths-rank{rank}.json").read_text())
        assert set(result) == {"none", "user_allreduce", "fp16_compress", "bf16_compress"}
        for hook, r in result.items():
            if hook == "bf16_compress" and "unsupported" in r:
                continue  # torch refuses the bf16 hook without CUDA/NCCL: checked on a GPU only
            assert r["identical"], (rank, hook, r)
    # and gpuscope did time the communication in those runs (the dispatcher was in the path)
    import gpuscope

    for hook in ("none", "fp16_compress"):
        rep = gpuscope.analyze(tmp_path / f"run-{hook}", skip=0)
        assert rep.to_dict()["ranks"][0]["comm_ms"] > 0
