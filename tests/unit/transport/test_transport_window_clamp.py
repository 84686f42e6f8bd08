"""TransportConfig.window_clamp: each stream's advertised receive window bounded
(TCP_WINDOW_CLAMP) on both ends of a channel, accepted streams included; a clamp too
small to move anything is refused with the bound."""

from __future__ import annotations

import socket

import pytest
import torch

from atlas_transport import TransportConfig
from atlas_transport.config import MIN_WINDOW_CLAMP
from atlas_transport.errors import ConfigError
from atlas_transport.loopback import loopback_pair
from atlas_transport.sockets import TCP_WINDOW_CLAMP


def _clamp(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, TCP_WINDOW_CLAMP)


def test_every_stream_of_both_ends_advertises_at_most_the_clamp_and_a_tensor_still_crosses() -> None:
    with loopback_pair(TransportConfig(streams=3, secret=b"s", window_clamp=150_000)) as (a, b):
        assert [_clamp(s.sock) for s in a._streams] == [150_000] * 3
        assert [_clamp(s.sock) for s in b._streams] == [150_000] * 3
        x = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: many windows of 3 x 150 KB
        h = a.isend(x, tag=1)
        assert torch.equal(b.recv(1, timeout=20), x)
        h.wait(10)
    with loopback_pair(TransportConfig(streams=1, secret=b"s")) as (a, _):
        assert _clamp(a._streams[0].sock) != 150_000  # no clamp asked: the kernel's own


@pytest.mark.parametrize("bad", [0, MIN_WINDOW_CLAMP - 1, 1.5e5, True])
def test_a_clamp_too_small_or_not_bytes_is_refused_with_the_bound(bad) -> None:
    with pytest.raises(ConfigError, match=rf"window_clamp={bad!r}: use at least {MIN_WINDOW_CLAMP} bytes"):
        TransportConfig(window_clamp=bad)
