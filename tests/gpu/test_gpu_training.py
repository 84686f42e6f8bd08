"""Real pipeline training of the tiny workload on CUDA against the same training on the
CPU: CUDA kernels are not bit-identical to the CPU's, so the parameters after 3 steps
must agree within RTOL/ATOL below (the observed maximum is printed). Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from testbed.training.real_work import OptimConfig, train_in_process
from testbed.training.reference import compare_params, tolerance_for

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)

RTOL, ATOL = 1e-4, 1e-6  # fp32, TF32 off (torch's default for matmuls)


def atol_for(optim: OptimConfig) -> float:
    """Adam turns the rounding of near-zero gradients into visible update differences
    (testbed/training/reference.py): there the project's own Adam tolerance (5% of lr)."""
    return max(ATOL, tolerance_for(optim)[1])


@pytest.mark.parametrize("optim", [OptimConfig(kind="sgd", lr=0.5), OptimConfig(kind="adam", lr=3e-3)],
                         ids=["sgd", "adam"])
def test_tiny_workload_on_cuda_matches_the_cpu(optim: OptimConfig, tiny_workload, tmp_path) -> None:
    assert not torch.backends.cuda.matmul.allow_tf32
    w = tiny_workload
    cpu = train_in_process(w, str(tmp_path / "cpu"), iterations=3, optim=optim, device="cpu")
    gpu = train_in_process(w, str(tmp_path / "gpu"), iterations=3, optim=optim, device="cuda")
    assert len(gpu.params) == w.parallelism.dp
    for d, params in enumerate(gpu.params):
        diff = compare_params(params, cpu.params[d], rtol=RTOL, atol=atol_for(optim))
        print(f"\n{optim.kind} replica {d}: cuda vs cpu (rtol {RTOL:g}, atol {atol_for(optim):g}): "
              f"{diff.describe()}")
        assert diff.ok, f"replica {d}: {diff.describe()}"
        assert not diff.missing and not diff.extra
    # the DP replicas average in a fixed order, so they stay bit-identical on the GPU too
    assert compare_params(gpu.params[1], gpu.params[0]).bitwise_equal
    assert gpu.mean_losses() == pytest.approx(cpu.mean_losses(), rel=1e-4)
    recs = [r for rs in gpu.records.values() for r in rs]
    assert recs and all(r.mode == "real" and r.end >= r.start for r in recs)
    assert {r.kind for r in recs} >= {"forward", "backward"}
