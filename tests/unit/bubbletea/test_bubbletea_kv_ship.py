"""KV shipping: wire format and acks over an in-process channel, with a real tiny
model's cache; the same over atlas_transport on loopback; scaled-down caches (the rest
charged at the link rate on a modelled queue) and pacing at a rate cap. A shipper says
hello when it connects: `receive_one` answers it with None (`caches` drops those)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from bubbletea_agent.engine import KVCache, ModelledEngine, TransformersEngine
from bubbletea_agent.kv_ship import (
    TAG_HEADER,
    AsyncShipper,
    KVShipper,
    MemoryChannel,
    ShipError,
    pack,
    receive_one,
)
from bubbletea_agent.sim import FakeClock, SimDevice
from testbed_core.contracts.bubbletea import PrefillModelSpec


@pytest.fixture(scope="module")
def real_kv() -> KVCache:
    eng = TransformersEngine(PrefillModelSpec(preset="tiny", dtype="bfloat16", seed=3), device="cpu")
    res = eng.run_chunk(SimDevice(FakeClock(), [], mode="real"), "bt", "r", 37, 0, None)
    return eng.finish(res.partial)


def serve(ch, n, out, clock_ns=time.time_ns):
    def loop():
        try:
            while len([r for r in out if r is not None]) < n:
                out.append(receive_one(ch, clock_ns))
        except Exception as exc:  # surfaced by the test
            out.append(exc)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def caches(got):
    return [r for r in got if r is not None]


def test_real_cache_roundtrip(real_kv):
    a, b = MemoryChannel.pair()
    got: list = []
    t = serve(b, 1, got)
    shipper = KVShipper(a)
    res = shipper.ship("req-7", real_kv)
    t.join(5)
    rx = caches(got)[0]
    assert rx.request_id == "req-7" and rx.seq == 0 and rx.mode == "real"
    assert rx.keys.dtype == torch.bfloat16 and rx.keys.shape == (2, 1, 2, 37, 16)
    assert torch.equal(rx.keys, real_kv.keys) and torch.equal(rx.values, real_kv.values)
    assert res.wire_bytes == real_kv.materialised_bytes == rx.wire_bytes
    assert res.arrival == pytest.approx(rx.arrival_ns / 1e9)
    assert res.sent_at <= res.arrival + 1e-3


def test_scaled_cache_pads_the_wire_to_the_true_size():
    spec = PrefillModelSpec(preset="llama-3-8b")
    kv = ModelledEngine(spec, lambda n, p: 0.0, materialise_limit_bytes=1 << 20).finish(100)
    assert kv.scale < 1
    msgs = pack(0, "r", kv, pad_to_logical=True)
    assert sum(t.numel() for _, t in msgs[2:]) == kv.logical_bytes
    a, b = MemoryChannel.pair()
    got: list = []
    t = serve(b, 1, got)
    res = KVShipper(a, pad_to_logical=True).ship("r", kv)
    t.join(5)
    assert res.wire_bytes == kv.logical_bytes == spec.kv_bytes(100)
    assert caches(got)[0].logical_shape == (32, 1, 8, 100, 128)
    assert caches(got)[0].mode == "modelled"


def test_unshared_clock_uses_the_probed_delay(real_kv):
    a, b = MemoryChannel.pair()
    got: list = []
    t = serve(b, 1, got, clock_ns=lambda: 123)  # a decode host with an unrelated clock
    shipper = KVShipper(a, shared_clock=False)
    res = shipper.ship("x", real_kv)
    t.join(5)
    assert got[0] is None  # the hello (clock probe) was answered
    assert res.arrival > 1.0 and res.arrival <= time.time()


def test_bad_header_is_refused():
    a, b = MemoryChannel.pair()
    a.send(torch.tensor([1, 2, 3], dtype=torch.int64), TAG_HEADER)
    with pytest.raises(ShipError, match="bad header .*not a BubbleTea KV sender"):
        receive_one(b, peer="dc1-h1")


def test_wrong_ack_is_refused(real_kv):
    a, b = MemoryChannel.pair()
    from bubbletea_agent.kv_ship import MAGIC_ACK, TAG_ACK, VERSION

    b.send(torch.tensor([MAGIC_ACK, -1, 0, 0, VERSION, 0, 0, 0], dtype=torch.int64), TAG_ACK)  # the hello's
    b.send(torch.tensor([MAGIC_ACK, 99, 0, 0, 0, -1, 0, 0], dtype=torch.int64), TAG_ACK)
    with pytest.raises(ShipError, match="answered .* to KV message 0"):
        KVShipper(a).ship("x", real_kv)


def test_async_shipper_reports_every_request(real_kv):
    a, b = MemoryChannel.pair()
    got: list = []
    t = serve(b, 3, got)
    ship = AsyncShipper(lambda: KVShipper(a))
    for i in range(3):
        ship.submit(f"r{i}", real_kv)
    ship.close()
    t.join(5)
    res = ship.poll()
    assert [r.request_id for r in res] == ["r0", "r1", "r2"] and all(r.error is None for r in res)


def test_async_shipper_turns_connect_failure_into_errors(real_kv):
    def boom():
        raise ConnectionRefusedError("decode host dc2-h1:7000 refused")

    ship = AsyncShipper(boom)
    ship.submit("r0", real_kv)
    ship.submit("r1", real_kv)
    ship.close()
    res = ship.poll()
    assert [r.request_id for r in res] == ["r0", "r1"]
    assert all("cannot reach decode host: decode host dc2-h1:7000 refused" in r.error for r in res)


def test_real_cache_over_atlas_transport_loopback(real_kv):
    from bubbletea_agent.kv_ship import DecodeServer, connect_shipper

    server = DecodeServer.start("127.0.0.1", 0, streams=2, secret=b"bt-test")
    try:
        shipper = connect_shipper("127.0.0.1", server.port, streams=2, secret=b"bt-test")
        res = shipper.ship("atlas-1", real_kv)
        shipper.close()
        rx = server.wait_for(1, timeout=10)[0]
    finally:
        server.stop()
    assert rx.request_id == "atlas-1"
    assert torch.equal(rx.keys, real_kv.keys) and torch.equal(rx.values, real_kv.values)
    assert res.wire_bytes == real_kv.materialised_bytes
    assert res.arrival >= res.sent_at


def test_wire_scale_ships_a_fraction_of_the_true_size():
    spec = PrefillModelSpec(preset="llama-3-8b")
    eng = ModelledEngine(spec, lambda n, p: 0.0, wire_scale=0.1)
    kv = eng.finish(1000)
    assert kv.materialised_bytes <= 0.1 * kv.logical_bytes
    msgs = pack(0, "r", kv, pad_to_logical=True, wire_scale=0.1)
    assert sum(t.numel() for _, t in msgs[2:]) == round(0.1 * kv.logical_bytes)


def test_async_shipper_backlog_full_is_an_error_not_a_stall(real_kv):
    gate, shipping = threading.Event(), threading.Event()

    class Slow:
        def ship(self, rid, kv):
            shipping.set()
            gate.wait(10)
            raise ShipError("decode host gone")

        def close(self):
            pass

    ship = AsyncShipper(lambda: Slow(), max_queue=2)
    ship.submit("a", real_kv)
    assert shipping.wait(10)  # "a" is being shipped (out of the queue); two more fill the queue
    ship.submit("b", real_kv)
    ship.submit("c", real_kv)
    with pytest.raises(ShipError, match="2 KV caches already wait .* d dropped"):
        ship.submit("d", real_kv)
    gate.set()
    ship.close()
    assert [r.request_id for r in ship.poll()] == ["a", "b", "c"]


def test_the_rest_of_a_scaled_cache_is_charged_at_the_link_rate_and_queues() -> None:
    import threading

    spec = PrefillModelSpec(preset="llama-3-8b")
    eng = ModelledEngine(spec, lambda n, p: 0.0, wire_scale=0.001)
    kv = eng.finish(512)  # 64 MiB true size
    a, b = MemoryChannel.pair()
    got: list = []

    def serve() -> None:
        for _ in range(3):  # the hello, then two caches
            got.append(receive_one(b))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    shipper = KVShipper(a, pad_to_logical=True, wire_scale=0.001, rest_rate_bps=10e9)
    r1 = shipper.ship("r1", kv)
    r2 = shipper.ship("r2", kv)
    t.join(5)
    wire = round(kv.logical_bytes * 0.001)
    assert r1.wire_bytes == wire == caches(got)[0].wire_bytes
    rest = (kv.logical_bytes - wire) * 8 / 10e9  # ~54 ms at 10 Gbit/s
    assert r1.modelled_s == pytest.approx(rest)
    assert r2.arrival >= r1.arrival + rest - 1e-6  # the second waits for the first on the modelled link


def test_pacing_spaces_caches_at_the_rate_cap() -> None:
    a, b = MemoryChannel.pair()
    import threading

    kv = ModelledEngine(PrefillModelSpec(preset="tiny"), lambda n, p: 0.0).finish(100)
    threading.Thread(target=lambda: [receive_one(b) for _ in range(2)], daemon=True).start()
    now = {"t": 100.0}
    slept: list[float] = []
    shipper = KVShipper(a, max_rate_bps=8e3, clock=lambda: now["t"], sleep=slept.append)  # 1 kB/s
    res = shipper.ship("r", kv)
    assert slept == [pytest.approx(res.wire_bytes / 1e3)]
    with pytest.raises(ShipError, match="max_rate_bps must be > 0"):
        KVShipper(a, max_rate_bps=0)
