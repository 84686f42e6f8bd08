"""streams="auto": the stopping rule, and a real probe against a listener."""

from __future__ import annotations

import threading

import pytest
import torch

from atlas_transport import (
    TransportConfig,
    cached_streams,
    connect,
    forget_streams,
    listen,
    probe_streams,
)
from atlas_transport.auto import choose


def test_choose_raises_n_while_goodput_grows_by_the_margin() -> None:
    assert choose({1: 100, 2: 195, 4: 380, 8: 700, 16: 720}, 0.10) == 8
    assert choose({1: 100, 2: 105}, 0.10) == 1
    assert choose({1: 100, 2: 300, 4: 320, 8: 2000}, 0.10) == 2  # stops at the first flat step
    assert choose({1: 100, 2: 105}, 0.0) == 2
    with pytest.raises(ValueError):
        choose({}, 0.1)


def test_probe_then_auto_connect_uses_the_cached_count() -> None:
    forget_streams()
    cfg = TransportConfig(streams="auto", secret="auto-test", auto_candidates=(1, 2, 4), auto_probe_bytes=1 << 20,
                          auto_probe_s=0.1, connect_timeout_s=5, idle_timeout_s=10)
    with listen("127.0.0.1", 0, cfg) as lst:
        result = probe_streams("127.0.0.1", lst.port, cfg)
        assert result.streams in (1, 2, 4)
        assert list(result.goodput_mbps)[0] == 1 and all(v > 0 for v in result.goodput_mbps.values())
        assert cached_streams("127.0.0.1", lst.port) is None  # probe_streams alone does not cache
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("ch", lst.accept(timeout=20)))
        t.start()
        with connect("127.0.0.1", lst.port, cfg) as ch:  # probes (once), then opens the real channel
            t.join()
            probed = cached_streams("127.0.0.1", lst.port)
            assert probed is not None and ch.streams == probed.streams
            with box["ch"] as other:  # the probe channel never showed up in accept()
                assert other.streams == ch.streams and not other.probe
                ch.send(torch.arange(100), 5)
                assert torch.equal(other.recv(5, timeout=5), torch.arange(100))
        forget_streams("127.0.0.1", lst.port)
        assert cached_streams("127.0.0.1", lst.port) is None


def test_auto_config_validation() -> None:
    with pytest.raises(Exception, match="auto_candidates=\\(4, 2\\): use increasing stream counts"):
        TransportConfig(secret="x", auto_candidates=(4, 2))
