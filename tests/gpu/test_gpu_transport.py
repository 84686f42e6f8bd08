"""atlas_transport with CUDA tensors on loopback: a large bf16 tensor striped over 4
streams lands bit-exact on the GPU, by `recv(device="cuda")` and by `recv_into` a CUDA
tensor. Skipped where there is no GPU (CI)."""

from __future__ import annotations

import pytest
import torch

from atlas_transport import TransportConfig
from atlas_transport.loopback import loopback_pair

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)

MIB = 1 << 20


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)  # bit patterns: NaN payloads and -0.0 compared too


def test_64mib_bf16_cuda_to_cuda_over_4_streams_is_bit_exact() -> None:
    n = 64 * MIB // 2
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(n // 4096, 4096, device="cuda", generator=g).to(torch.bfloat16)
    x.view(-1)[:4] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")], dtype=torch.bfloat16)
    cfg = TransportConfig(streams=4, secret="gpu-test", connect_timeout_s=10, idle_timeout_s=30)
    with loopback_pair(cfg) as (a, b):
        assert a.streams == 4
        h = a.isend(x, 1)
        y = b.recv(1, device="cuda", timeout=60)
        h.wait(60)
        assert y.is_cuda and y.dtype == torch.bfloat16 and y.shape == x.shape
        assert torch.equal(_bits(y), _bits(x))

        dest = torch.zeros_like(x)  # straight into a CUDA tensor, posted before the data
        h2 = b.irecv(2, into=dest)
        a.send(x.t(), 2)  # non-contiguous on the GPU
        assert h2.wait(60) is dest
        assert torch.equal(_bits(dest), _bits(x.t().contiguous()).view(dest.shape))
        assert b.bytes_received >= 2 * x.numel() * 2  # both tensors crossed the sockets


def test_cuda_sender_cpu_receiver_and_back() -> None:
    x = torch.arange(3 * MIB, device="cuda", dtype=torch.int32).view(3, -1)
    cfg = TransportConfig(streams=4, secret="gpu-test")
    with loopback_pair(cfg) as (a, b):
        a.send(x, 3)
        y = b.recv(3, timeout=30)  # no device: lands on the CPU
        assert not y.is_cuda and torch.equal(y, x.cpu())
        b.send(y, 4)
        z = a.recv(4, device="cuda:0", timeout=30)
        assert z.device == torch.device("cuda", 0) and torch.equal(z, x)
