"""testbed_runtime.device in mode "real" on CUDA: work given to the Device runs on the GPU and
the timeline records a duration that covers the kernels (the device synchronises
before its clock stops). Skipped where there is no GPU (CI)."""

from __future__ import annotations

import pytest
import torch

from testbed_runtime.device import Device, torch_device

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)


def test_torch_device_picks_cuda() -> None:
    assert torch_device().type == "cuda"


def test_real_work_runs_on_the_gpu_and_its_record_covers_the_kernels(tmp_path) -> None:
    dev = Device("gpu-real", tmp_path, mode="real")
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    (a @ b).sum().item()  # warm up cuBLAS outside the record
    torch.cuda.synchronize()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def work() -> torch.Tensor:
        ev0.record()
        out = a
        for _ in range(20):  # ~20 x 1.1 TFLOP: tens of ms, far above launch overhead
            out = out @ b
            out = out / out.abs().amax()
        ev1.record()
        return out  # no synchronisation here: the Device must do it

    rec = dev.run("forward", "gpu-test", fn=work, label="matmul")
    kernel_s = ev0.elapsed_time(ev1) / 1e3  # needs ev1 done; the device synchronised already
    assert ev1.query(), "the device returned before the GPU work ended"
    assert rec.result.is_cuda and torch.isfinite(rec.result.float()).all()
    assert rec.mode == "real" and rec.modelled_s is None and rec.kind == "forward"
    assert kernel_s > 0.005, f"work too small to judge ({kernel_s * 1e3:.2f} ms)"
    assert rec.duration >= kernel_s, f"recorded {rec.duration * 1e3:.2f} ms < kernels {kernel_s * 1e3:.2f} ms"
    assert rec.duration < kernel_s + 1.0, f"recorded {rec.duration:.3f} s for {kernel_s:.3f} s of kernels"
    line = dev.timeline()
    assert len(line) == 1 and line[0].duration == pytest.approx(rec.duration)
    assert dev.utilization(rec.start, rec.end) == pytest.approx(1.0)


def test_try_run_refuses_while_gpu_work_holds_the_device(tmp_path) -> None:
    import threading

    dev = Device("gpu-busy", tmp_path, mode="real")
    other = Device("gpu-busy", tmp_path, mode="real")  # a second opener (another process in practice)
    started, release = threading.Event(), threading.Event()
    x = torch.randn(4096, 4096, device="cuda")

    def long_work() -> torch.Tensor:
        started.set()
        release.wait(10)
        return x @ x

    th = threading.Thread(target=lambda: dev.run("forward", "train", fn=long_work))
    th.start()
    assert started.wait(10)
    assert other.busy() and other.try_run("prefill", "agent", fn=lambda: x @ x) is None
    release.set()
    th.join(30)
    rec = other.run("prefill", "agent", fn=lambda: x @ x)
    first = other.timeline()[0]
    assert first.owner == "train" and rec.start >= first.end
