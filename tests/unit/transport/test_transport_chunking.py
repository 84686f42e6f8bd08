"""Chunk sizing: chunk_bytes until the channel has measured its streams, then chunks
that take about chunk_target_s on a stream (fewer frames on fast paths), bounded by
chunk_max_bytes, and small tensors still spread over every stream."""

from __future__ import annotations

import pytest
import torch

from atlas_transport import ConfigError, TransportConfig
from atlas_transport.loopback import loopback_pair

MiB = 1 << 20


def test_chunk_for_grows_with_the_measured_rate_within_bounds() -> None:
    cfg = TransportConfig(secret="x")  # 1 MiB chunks, 10 ms target, 16 MiB at most
    assert cfg.chunk_for(256 * MiB, 1) == MiB  # nothing measured yet
    assert cfg.chunk_for(256 * MiB, 1, 12.5e6) == MiB  # 100 Mbit/s: 10 ms is 125 kB, keep the floor
    assert cfg.chunk_for(256 * MiB, 1, 800e6) == 8_000_000 // 4096 * 4096  # 10 ms at 800 MB/s
    assert cfg.chunk_for(256 * MiB, 1, 10e9) == 16 * MiB  # capped
    assert cfg.chunk_for(8 * MiB, 4, 10e9) == MiB  # a small tensor still gives every stream two chunks
    fixed = TransportConfig(secret="x", chunk_target_s=None, chunk_bytes=2 * MiB)
    assert fixed.chunk_for(256 * MiB, 1, 10e9) == 2 * MiB
    big = TransportConfig(secret="x", chunk_bytes=32 * MiB)  # chunk_bytes above chunk_max_bytes: kept
    assert big.chunk_for(256 * MiB, 1, 10e9) == 32 * MiB
    strict = TransportConfig(secret="x", max_chunk_bytes=4 * MiB)  # never above what this end accepts
    assert strict.chunk_for(256 * MiB, 1, 10e9) == 4 * MiB


@pytest.mark.parametrize("kw, message", [
    ({"chunk_target_s": 0}, "chunk_target_s=0: use seconds in (0, 10], or None for fixed chunks of chunk_bytes"),
    ({"chunk_target_s": True}, "chunk_target_s=True: use seconds"),
    ({"chunk_max_bytes": 100}, "chunk_max_bytes=100: use at least 4096 bytes (default 16777216; "
                               "chunks never exceed max_chunk_bytes either)"),
    ({"chunk_max_bytes": 2.5}, "chunk_max_bytes=2.5: use at least 4096 bytes"),
])
def test_chunk_settings_are_checked(kw, message) -> None:
    with pytest.raises(ConfigError) as info:
        TransportConfig(secret="x", **kw)
    assert message in str(info.value)


def test_a_channel_learns_its_stream_rate_and_sends_larger_chunks() -> None:
    cfg = TransportConfig(streams=1, secret="x", idle_timeout_s=10)
    x = torch.arange(16 * MiB // 4, dtype=torch.int32)  # 16 MiB

    def chunk_of(b, tag: int) -> int:  # a complete, unclaimed transfer keeps its description
        return b._arrived[(tag, 0)].meta.chunk_bytes

    with loopback_pair(cfg) as (a, b):
        assert a.stream_rate_mbps is None
        a.send(torch.ones(4), 1)  # too small to measure a rate
        assert a.stream_rate_mbps is None and torch.equal(b.recv(1, timeout=10), torch.ones(4))
        a.send(x, 2, timeout=30)
        assert chunk_of(b, 2) == MiB  # before any measurement
        assert torch.equal(b.recv(2, timeout=10), x)
        rate = a.stream_rate_mbps
        assert rate is not None and rate > 0
        a.send(x, 3, timeout=30)
        assert chunk_of(b, 3) == cfg.chunk_for(x.nbytes, 1, rate * 1e6 / 8)
        assert torch.equal(b.recv(3, timeout=10), x)  # whatever the chunk, the tensor arrives whole


def test_a_transfer_of_up_to_two_smallest_chunks_per_stream_is_spread_evenly(monkeypatch) -> None:
    """A transfer of at most SPREAD_CHUNKS smallest chunks (128 KiB) per stream: each
    stream carries its even share of them while the spread lasts (made long here, so
    that it binds however the writers wake): one each for 4 chunks over 4 streams, two
    each for 8; a transfer of larger chunks keeps plain work stealing (no quota)."""
    import atlas_transport.channel as channel_mod

    monkeypatch.setattr(channel_mod, "SPREAD_RTT_FRACTION", 1e6)
    monkeypatch.setattr(channel_mod, "SPREAD_MAX_S", 2.0)
    carried: list[tuple[int | None, dict[int, list[int]]]] = []
    complete = channel_mod.SendQueue.complete

    def record(self, tid):
        t = complete(self, tid)
        if t is not None:
            carried.append((t.quota, {s: list(offs) for s, offs in t.sent_on.items()}))
        return t

    monkeypatch.setattr(channel_mod.SendQueue, "complete", record)
    x = torch.arange(MiB // 8, dtype=torch.int32)  # 512 KiB: 4 chunks of 128 KiB over 4 streams
    with loopback_pair(TransportConfig(streams=4, secret="x", idle_timeout_s=10)) as (a, b):
        a.send(x, 1, timeout=10)  # the first send measures the RTT the spread is sized by
        assert torch.equal(b.recv(1, timeout=10), x)
        for tag in range(2, 6):
            a.send(x, tag, timeout=10)
            assert torch.equal(b.recv(tag, timeout=10), x)
        two = torch.arange(MiB // 4, dtype=torch.int32)  # 1 MiB: 8 chunks of 128 KiB over 4 streams
        a.send(two, 6, timeout=10)
        assert torch.equal(b.recv(6, timeout=10), two)
        big = torch.arange(MiB // 2, dtype=torch.int32)  # 2 MiB: 8 chunks of 256 KiB over 4 streams
        a.send(big, 7, timeout=10)
        assert torch.equal(b.recv(7, timeout=10), big)
    assert len(carried) == 7
    for quota, sent_on in carried[1:5]:
        assert quota == 1 and sorted(len(offs) for offs in sent_on.values()) == [1, 1, 1, 1], sent_on
    assert carried[5][0] == 2 and sorted(len(offs) for offs in carried[5][1].values()) == [2, 2, 2, 2]
    assert carried[6][0] is None
