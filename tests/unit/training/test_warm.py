"""A real-device worker's WAN channels warmed as the calibration warms its probes
(testbed/training/worker/warm.py), over loopback channels."""

from __future__ import annotations

import threading

import pytest

from atlas_transport import TransportConfig, connect, listen
from testbed.run.calibration import PROBE_WARMUP_BYTES_PER_STREAM
from testbed.training.worker.job import WorkerError
from testbed.training.worker.warm import WARM_BYTES_PER_STREAM, warm_bytes, warm_wan_channels
from testbed_core.contracts.worker_job import ChannelJob


def _spec(boundary: int, streams: int, wan: bool, peer: str = "p0r1") -> ChannelJob:
    links = ["dc1->dc2"] if wan else []
    return ChannelJob(boundary=boundary, role="connect", peer=peer, peer_ip="127.0.0.1", port=29500,
                      streams=streams, links=links, recv_links=["dc2->dc1"] if wan else [], latency_s=0.025)


def test_the_warm_up_tensor_is_the_calibrations() -> None:
    assert WARM_BYTES_PER_STREAM == PROBE_WARMUP_BYTES_PER_STREAM
    assert warm_bytes(4) == 8 << 20 and warm_bytes(64) == 64 << 20  # the probes' cap (Prober.run)


def test_each_end_sends_and_receives_one_warm_up_tensor_per_wan_channel(monkeypatch) -> None:
    monkeypatch.setenv("ATLAS_SECRET", "warm-test")
    cfg = TransportConfig(streams=2)
    sent: dict[str, float] = {}
    with listen("127.0.0.1", 0, cfg) as lst:
        a = connect("127.0.0.1", lst.port, cfg)
        b = lst.accept(timeout=10)
        lan = object()  # a channel inside the DC is not touched (it has no methods)
        t = threading.Thread(target=lambda: sent.setdefault("b", warm_wan_channels(
            {0: b, 1: lan}, [_spec(0, 2, True), _spec(1, 2, False)], 20.0)))
        t.start()
        sent["a"] = warm_wan_channels({0: a, 1: lan}, [_spec(0, 2, True), _spec(1, 2, False)], 20.0)
        t.join(30)
        received = a.bytes_received
        a.close(timeout=5)
        b.close(timeout=5)
    assert sent == {"a": 4 << 20, "b": 4 << 20}
    assert received == 4 << 20  # the peer's warm-up tensor, nothing else


def test_a_wan_boundary_without_a_channel_is_named() -> None:
    with pytest.raises(WorkerError, match=r"boundary 3: no channel open to warm \(peer p1r1\)"):
        warm_wan_channels({}, [_spec(3, 4, True, peer="p1r1")], 1.0)
