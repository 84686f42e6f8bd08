"""Whole KV caches on the wire, checked at the decode host: the xxh64 digest of every byte
(a corrupted cache is refused, not served), the size the host accepts, and with the real
engine one decode step from the received cache against the same model run in one process;
and the error paths (corruption, a cache too large, a decode host that is gone or was never
there), each with the message a user reads."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from click.testing import CliRunner

from bubbletea_agent.decode_check import DecodeChecker
from bubbletea_agent.engine import KVCache, ModelledEngine, TransformersEngine, synthetic_prompt
from bubbletea_agent.kv_ship import (
    TAG_PAYLOAD,
    AsyncShipper,
    DecodeServer,
    KVShipper,
    MemoryChannel,
    ShipError,
    connect_shipper,
    receive_one,
)
from bubbletea_agent.sim import FakeClock, SimDevice
from testbed_core.contracts.bubbletea import PrefillModelSpec

SPEC = PrefillModelSpec(preset="tiny", dtype="float32", seed=5)
SECRET = b"kv-checks"


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    return TransformersEngine(SPEC, device="cpu")


@pytest.fixture(scope="module")
def checker() -> DecodeChecker:
    return DecodeChecker(SPEC, "cpu")


def prefill(engine: TransformersEngine, rid: str, chunks: list[int]) -> KVCache:
    """The request's cache as an agent makes it: chunk after chunk on the device."""
    dev = SimDevice(FakeClock(), [], mode="real")
    partial, done = None, 0
    for k, n in enumerate(chunks):
        res = engine.run_chunk(dev, "bt", f"{rid}:{k}:{n}", n, done, partial, final=k == len(chunks) - 1)
        partial, done = res.partial, done + n
    return partial


def test_chunks_of_a_request_see_one_synthetic_prompt(engine):
    """The chunked cache equals the one-pass prefill of the request's synthetic prompt."""
    kv = prefill(engine, "p-1", [20, 17])
    ids = synthetic_prompt(SPEC.seed, "p-1", 37, 256)
    cache, logits = engine.step(ids, None)
    ref = torch.stack([layer.keys for layer in cache.layers])
    assert kv.keys.shape == ref.shape == (2, 1, 2, 37, 16)
    assert torch.allclose(kv.keys, ref, atol=1e-5)
    assert kv.first_token == int(logits.argmax())
    assert not torch.equal(synthetic_prompt(SPEC.seed, "p-2", 37, 256), ids)  # another request, another prompt


def test_decode_check_passes_for_the_right_cache_and_fails_for_another_prompt(engine, checker):
    kv = prefill(engine, "r-1", [30, 30, 4])
    ok = checker.check("r-1", kv.keys, kv.values, kv.first_token)
    assert ok.ok and ok.next_token == ok.next_token_ref and ok.first_token == ok.first_token_ref
    assert ok.max_logit_diff < 1e-4  # chunked vs one pass: float rounding only
    wrong = checker.check("r-2", kv.keys, kv.values, kv.first_token)  # r-1's cache sent as r-2's
    assert not wrong.ok and "request r-2: first token" in wrong.detail
    assert wrong.max_logit_diff > 1e-3


def test_real_cache_over_atlas_transport_passes_digest_and_decode_checks(engine, checker, tmp_path):
    import json

    kv = prefill(engine, "a-1", [48, 16])
    log = tmp_path / "decode.jsonl"
    server = DecodeServer.start("127.0.0.1", 0, streams=1, secret=SECRET, checker=checker, log_path=str(log))
    try:
        shipper = connect_shipper("127.0.0.1", server.port, streams=1, secret=SECRET)
        res = shipper.ship("a-1", kv)
        shipper.close()
        server.wait_for(1, timeout=10)
    finally:
        server.stop()
    assert res.error is None and res.digest_ok is True and res.decode_ok is True
    assert res.next_token == res.next_token_ref
    assert res.wire_bytes == kv.logical_bytes == SPEC.kv_bytes(64)  # the whole cache crossed
    line = json.loads(log.read_text().splitlines()[0])
    assert line["digest_ok"] is True and line["decode_check"]["ok"] is True and line["refused"] is None


class Corrupting:
    """A channel end that flips one byte of every KV payload it sends (a broken path)."""

    def __init__(self, inner: MemoryChannel) -> None:
        self.inner = inner

    def send(self, tensor: torch.Tensor, tag: int) -> None:
        if tag == TAG_PAYLOAD:
            tensor = tensor.clone()
            tensor[len(tensor) // 2] ^= 0x5A
        self.inner.send(tensor, tag)

    def recv(self, tag: int, timeout: float | None = 30.0) -> torch.Tensor:
        return self.inner.recv(tag, timeout)


def serve(ch, n: int, **kw) -> list:
    got: list = []

    def loop() -> None:
        try:
            while len([r for r in got if r is not None]) < n:
                got.append(receive_one(ch, **kw))
        except Exception as exc:  # noqa: BLE001 - surfaced by the test
            got.append(exc)

    threading.Thread(target=loop, daemon=True).start()
    return got


def first_cache(got: list) -> object:
    """The first cache the serving thread returned (it appends just after acknowledging)."""
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        caches = [r for r in got if r is not None]
        if caches:
            return caches[0]
        time.sleep(0.01)
    raise AssertionError(f"no cache received: {got}")


def test_a_corrupted_cache_is_refused_and_the_request_not_served(engine):
    kv = prefill(engine, "c-1", [40])
    a, b = MemoryChannel.pair()
    got = serve(b, 2)
    shipper = KVShipper(Corrupting(a))
    bad = shipper.ship("c-1", kv)
    assert bad.digest_ok is False
    assert "refused the KV cache of request c-1: its xxh64 digest over" in bad.error
    assert "corrupted on the way" in bad.error
    rx = first_cache(got)
    assert rx.refused.startswith("KV cache of request c-1 arrived corrupted: xxh64 0x") and rx.keys.numel() == 0
    shipper.ch = a  # the path healed: the same channel carries the next cache, checked fine
    good = shipper.ship("c-2", kv)
    assert good.error is None and good.digest_ok is True


def test_agent_rejects_a_corrupted_cache_with_the_reason():
    """Through AsyncShipper: the ledger's record ends ship_failed, digest flagged."""
    kv = ModelledEngine(SPEC, lambda n, p: 0.0).finish(30)
    a, b = MemoryChannel.pair()
    serve(b, 1)
    ship = AsyncShipper(lambda: KVShipper(Corrupting(a)))
    ship.submit("m-1", kv)
    ship.close()
    (res,) = ship.poll()
    assert res.digest_ok is False and "digest" in res.error


def test_a_cache_larger_than_the_host_accepts_is_refused_before_it_crosses(engine):
    kv = prefill(engine, "big", [64])
    a, b = MemoryChannel.pair()
    got = serve(b, 1, max_cache_bytes=kv.logical_bytes - 1)
    shipper = KVShipper(a, peer="decode host dc1-h2:7070")
    assert shipper.max_cache_bytes == kv.logical_bytes - 1  # learned from the hello
    with pytest.raises(ShipError, match=(
            f"KV cache of request big is {kv.logical_bytes} bytes; decode host dc1-h2:7070 accepts at most "
            f"{kv.logical_bytes - 1} \\(its decode-server --max-cache-bytes\\): not sent")):
        shipper.ship("big", kv)
    # a sender that ignores the limit: the host drains the bytes, refuses, and the channel stays in step
    shipper.max_cache_bytes = 0
    res = shipper.ship("big", kv)
    assert res.error == (f"decode host dc1-h2:7070 refused the KV cache of request big: {kv.logical_bytes} bytes "
                         "is more than it accepts (decode-server --max-cache-bytes)")
    rx = first_cache(got)
    assert "accepts at most" in rx.refused


def test_a_dead_decode_host_fails_every_request_with_a_clear_message(engine):
    kv = prefill(engine, "d-1", [16])
    server = DecodeServer.start("127.0.0.1", 0, streams=1, secret=SECRET)
    port = server.port
    ship = AsyncShipper(lambda: connect_shipper("127.0.0.1", port, streams=1, secret=SECRET,
                                                idle_timeout_s=5.0))
    ship.submit("d-1", kv)
    done = []
    t0 = time.monotonic()
    while not done and time.monotonic() - t0 < 20:
        done += ship.poll()
        time.sleep(0.05)
    server.stop()  # the decode server dies
    ship.submit("d-2", kv)
    ship.submit("d-3", kv)
    ship.close(timeout=30)
    res = {r.request_id: r for r in done + ship.poll()}
    assert res["d-1"].error is None
    for rid in ("d-2", "d-3"):
        assert res[rid].error is not None and f"decode host 127.0.0.1:{port}" in res[rid].error, res[rid].error
        assert "did its decode server die? see its log" in res[rid].error


def test_an_unreachable_decode_host_says_so():
    ship = AsyncShipper(lambda: connect_shipper("127.0.0.1", 9, streams=1, secret=SECRET,
                                                connect_timeout_s=2.0))
    ship.submit("u-1", KVCache(torch.zeros(1), torch.zeros(1), (1,), "modelled"))
    ship.close()
    (res,) = ship.poll()
    assert res.error.startswith("cannot reach decode host: ") and "127.0.0.1" in res.error


def test_decode_server_cli_refuses_a_bad_check_model():
    from bubbletea_agent.__main__ import main

    out = CliRunner().invoke(main, ["decode-server", "--port", "0", "--check-model", '{"preset": "huge"}'])
    assert out.exit_code == 2
    assert "--check-model" in out.output and "unknown model preset 'huge'" in out.output


def test_the_request_of_a_chunk_label() -> None:
    from bubbletea_agent.engine import request_of

    assert request_of("r17:0:40") == "r17" and request_of("trace:a:3:2:128") == "trace:a:3"
