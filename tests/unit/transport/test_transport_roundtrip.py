"""Tensors of every common dtype and shape survive a channel on loopback."""

from __future__ import annotations

import time

import pytest
import torch

from atlas_transport import ConfigError, ShapeMismatch, TransportConfig, connect, listen
from atlas_transport.loopback import loopback_pair

CFG = TransportConfig(streams=3, secret="unit-test", chunk_bytes=64 << 10, connect_timeout_s=5, idle_timeout_s=10)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128, torch.uint16]


def sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape, generator=g,
                         dtype=torch.int64).to(dtype)


@pytest.fixture(scope="module")
def pair():
    with loopback_pair(CFG) as p:
        yield p


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_dtype_round_trip(pair, dtype) -> None:
    a, b = pair
    x = sample(dtype, (33, 17, 5))
    a.send(x, 1)
    y = b.recv(1, timeout=10)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y.view(torch.uint8) if dtype == torch.bool else y, x.view(torch.uint8) if dtype == torch.bool else x)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (70001,)], ids=str)
def test_odd_shapes_both_directions(pair, shape) -> None:
    a, b = pair
    x = sample(torch.float32, shape)
    b.send(x, 2)
    y = a.recv(2, timeout=10)
    assert y.shape == x.shape and torch.equal(y, x)


def test_non_contiguous_and_views(pair) -> None:
    a, b = pair
    base = sample(torch.float32, (64, 48))
    for x in (base.t(), base[::3, 1::2], base.expand(2, 64, 48)[1], sample(torch.complex64, (5,)).conj()):
        a.send(x, 3)
        y = b.recv(3, timeout=10)
        assert y.is_contiguous() and torch.equal(y, x.resolve_conj())


def test_recv_into_contiguous_and_strided_destinations(pair) -> None:
    a, b = pair
    x = sample(torch.int32, (40, 30))
    dest = torch.zeros(40, 30, dtype=torch.int32)
    h = b.irecv(4, into=dest)  # posted before the data
    a.send(x, 4)
    assert h.wait(10) is dest and torch.equal(dest, x)
    strided = torch.zeros(30, 40, dtype=torch.int32).t()
    a.send(x, 4)
    deadline = time.monotonic() + 10  # let it arrive before the receive is posted (the late path)
    while b.held_bytes() < x.numel() * x.element_size() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert b.held_bytes() == x.numel() * x.element_size()
    assert torch.equal(b.recv_into(strided, 4, timeout=10), x)


def test_recv_into_wrong_destination_is_refused_with_reason(pair) -> None:
    a, b = pair
    a.send(sample(torch.float32, (10,)), 5)
    with pytest.raises(ShapeMismatch, match=r"carries float32\[10\], the destination is float64\[10\] \(dtype differs\)"):
        b.recv_into(torch.zeros(10, dtype=torch.float64), 5, timeout=10)
    h = b.irecv(5, into=torch.zeros(11))
    a.send(sample(torch.float32, (10,)), 5)
    with pytest.raises(ShapeMismatch, match="element count differs"):
        h.wait(10)
    a.send(torch.ones(2), 5)  # the channel is fine afterwards
    assert torch.equal(b.recv(5, timeout=10), torch.ones(2))


def test_large_tensor_256mib() -> None:
    x = torch.arange(64 << 20, dtype=torch.int32)  # 256 MiB
    dest = torch.empty_like(x)
    with loopback_pair(CFG, streams=4, chunk_bytes=4 << 20) as (a, b):
        h = b.irecv(9, into=dest)
        t0 = time.perf_counter()
        s = a.isend(x, 9)
        h.wait(120)
        s.wait(120)
        dt = time.perf_counter() - t0
    assert torch.equal(dest[:: 1 << 16], x[:: 1 << 16]) and torch.equal(dest, x)
    assert s.completed_at >= h.completed_at - 1.0
    print(f"256 MiB in-process over 4 streams: {x.nbytes * 8 / dt / 1e9:.1f} Gbit/s")


def test_checksums_round_trip() -> None:
    for ck in ("xxh3", "xxh64", "crc32"):
        with loopback_pair(CFG, checksum=ck, streams=2) as (a, b):
            x = sample(torch.float64, (100, 300))
            a.send(x, 1)
            assert torch.equal(b.recv(1, timeout=10), x)


def test_handles_report_completion_times(pair) -> None:
    a, b = pair
    r = b.irecv(6)
    assert not r.done() and r.completed_at is None
    t0 = time.monotonic()
    s = a.isend(torch.ones(1000), 6)
    assert torch.equal(r.wait(10), torch.ones(1000)) and s.wait(10) is None
    assert r.done() and s.done() and t0 <= r.completed_at <= time.monotonic()
    with pytest.raises(TimeoutError, match=r"recv of transfer \(none matched yet\) \(tag 6 #1\)"):
        b.irecv(6).wait(0.05)


def test_unsent_bytes_while_a_send_is_on_this_host() -> None:
    """What a sender still holds (queued chunks, kernel send buffers): most of a big
    tensor just after isend (loopback moves ~2 GB/s), nothing once it is done."""
    with loopback_pair(streams=2) as (a, b):
        assert a.unsent_bytes() == 0
        t = torch.zeros(256 << 20, dtype=torch.uint8)
        h = a.isend(t, 1)
        held = a.unsent_bytes()
        assert 0 < held <= (256 + 2 * 4) << 20  # a chunk taken while we look may count twice
        b.irecv(1).wait(30)
        h.wait(10)
        assert a.unsent_bytes() == 0


def test_config_errors_speak_to_the_user(monkeypatch) -> None:
    monkeypatch.delenv("ATLAS_SECRET", raising=False)
    with pytest.raises(ConfigError, match="no shared secret: pass TransportConfig\\(secret=...\\) or set the environment variable ATLAS_SECRET"):
        listen("127.0.0.1", 0, TransportConfig())
    with pytest.raises(ConfigError, match="no shared secret"):
        connect("127.0.0.1", 1, TransportConfig())
    monkeypatch.setenv("ATLAS_SECRET", "from-env")
    assert TransportConfig().resolved_secret() == b"from-env"
    with pytest.raises(ConfigError, match="checksum='crc32c'.*no fast CRC32C"):
        TransportConfig(checksum="crc32c")
    with pytest.raises(ConfigError, match="streams=0: use an integer 1..256 or 'auto'"):
        TransportConfig(streams=0)
    with pytest.raises(ConfigError, match="chunk_bytes=10"):
        TransportConfig(chunk_bytes=10)
    with pytest.raises(ConfigError, match="congestion='nosuchcc' cannot be set.*this kernel offers"):
        listen("127.0.0.1", 0, TransportConfig(secret="x", congestion="nosuchcc"))


def test_bad_arguments(pair) -> None:
    a, _ = pair
    with pytest.raises(ValueError, match="tag must be an integer in 0..2\\*\\*63-1"):
        a.isend(torch.ones(1), -1)
    with pytest.raises(TypeError, match="only dense"):
        a.isend(torch.ones(2, 2).to_sparse(), 1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        a.isend([1, 2], 1)


def test_chunk_size_spreads_small_tensors_over_streams() -> None:
    cfg = TransportConfig(secret="x", chunk_bytes=4 << 20)
    assert cfg.chunk_for(256 << 20, 8) == 4 << 20
    assert cfg.chunk_for(16 << 20, 8) == 1 << 20  # 16 chunks for 8 streams
    assert cfg.chunk_for(1000, 8) == 256 << 10


def test_receive_device_checked_before_data_arrives(pair) -> None:
    a, b = pair
    if torch.cuda.is_available():
        pytest.skip("CUDA present: covered by test_cuda_tensors")
    with pytest.raises(ValueError, match="device=cuda: CUDA is not available in this process"):
        b.irecv(8, device="cuda")
    with pytest.raises(ValueError, match="device=meta: tensors can be received on cpu or cuda"):
        b.irecv(8, device="meta")
    a.send(torch.ones(3), 8)  # the refused receive consumed nothing
    assert torch.equal(b.recv(8, device="cpu", timeout=10), torch.ones(3))


@pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)
def test_cuda_tensors(pair) -> None:
    a, b = pair
    x = torch.randn(1000, 33, device="cuda")
    a.send(x[:, ::2], 10)  # non-contiguous on the GPU
    y = b.recv(10, device="cuda", timeout=10)
    assert y.is_cuda and torch.equal(y, x[:, ::2])
    dest = torch.zeros(1000, 17, device="cuda")
    a.send(x[:, ::2].cpu(), 10)
    assert b.recv_into(dest, 10, timeout=10) is dest and torch.equal(dest, x[:, ::2])


def test_a_receive_tells_when_its_tensor_landed_before_or_after_it_was_posted(pair) -> None:
    """`Handle.arrived_at` is when the tensor's last byte landed: for a receive posted
    after the tensor landed, before the handle's completion (the posting); for one posted
    first, the moment it completed. The sender's confirmation comes after the landing."""
    a, b = pair
    x = sample(torch.float32, (1 << 18,))  # 1 MiB
    send = a.isend(x, 7)
    send.wait(10)  # confirmed: the receiver has every byte, nobody asked for it yet
    time.sleep(0.2)
    late = b.irecv(7)
    assert torch.equal(late.wait(10), x)
    assert late.arrived_at is not None and late.completed_at is not None
    assert late.completed_at - late.arrived_at >= 0.19  # landed before the posting
    assert late.arrived_at <= send.completed_at
    early = b.irecv(8)
    time.sleep(0.05)
    a.send(x, 8)
    assert torch.equal(early.wait(10), x)
    assert early.arrived_at is not None and 0 <= early.completed_at - early.arrived_at < 0.05
    assert send.arrived_at is None  # a send's end is the peer's confirmation
