"""BubbleTea's real engine on CUDA with the model the BubbleTea scenario configures
(Llama-3-8B, random weights): prefill through a real-mode Device, the KV cache's true
shape, the latency curve profiled at agent start, and a CUDA-resident cache shipped
over atlas_transport on loopback to a decode server, bit-exact. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
import yaml

from bubbletea_agent.engine import KVCache, TransformersEngine
from bubbletea_agent.latency import DEFAULT_PROFILE_LENGTHS, QuadraticLatency
from testbed_core.constants import SCENARIOS_DIR
from testbed_core.contracts.bubbletea import PrefillModelSpec
from testbed_runtime.device import Device

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)

SCENARIO = SCENARIOS_DIR / "atlas-2dc-bubbletea.yaml"


@pytest.fixture(scope="module")
def spec() -> PrefillModelSpec:
    model = yaml.safe_load(SCENARIO.read_text())["bubbletea"]["model"]
    return PrefillModelSpec(**model)


@pytest.fixture(scope="module")
def engine(spec: PrefillModelSpec) -> TransformersEngine:
    eng = TransformersEngine(spec, device="auto")
    yield eng
    del eng.model
    torch.cuda.empty_cache()


def test_engine_builds_on_the_gpu(spec: PrefillModelSpec, engine: TransformersEngine) -> None:
    assert spec.num_hidden_layers == 32 and spec.hidden_size == 4096  # llama-3-8b
    assert engine.torch_device == "cuda"
    params = list(engine.model.parameters())
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in params)
    assert sum(p.numel() for p in params) == spec.params()


def test_prefill_on_a_real_device_gives_the_models_kv_shape(spec, engine, tmp_path) -> None:
    dev = Device("gpu0", tmp_path, mode="real")
    res = engine.run_chunk(dev, "bt", "r0", 512, 0, None, final=True)
    kv = res.partial
    assert isinstance(kv, KVCache) and kv.mode == "real" and kv.scale == 1.0
    assert kv.keys.is_cuda and kv.keys.dtype == torch.bfloat16
    assert tuple(kv.keys.shape) == spec.kv_shape(512) == (32, 1, 8, 512, 128)
    assert kv.values.shape == kv.keys.shape
    assert kv.logical_bytes == spec.kv_bytes(512) == 64 << 20  # bubbletea_agent/README.md: 512 tokens of Llama-3-8B = 64 MiB
    assert torch.isfinite(kv.keys.float()).all() and kv.keys.abs().sum() > 0
    rec = res.record
    assert rec.kind == "prefill" and rec.mode == "real" and 0 < rec.duration < 10
    # chunked: 300 then 212 tokens continue the same cache
    first = engine.run_chunk(dev, "bt", "r1:0", 300, 0, None)
    second = engine.run_chunk(dev, "bt", "r1:1", 212, 300, first.partial, final=True)
    assert tuple(second.partial.keys.shape) == spec.kv_shape(512)
    assert len(dev.timeline()) == 3


def test_latency_profile_at_agent_start_fits_a_monotone_curve(engine, tmp_path) -> None:
    from bubbletea_agent.runtime import profile_on_device

    dev = Device("gpu0", tmp_path, mode="real")
    model = profile_on_device(dev, engine, "bt", list(DEFAULT_PROFILE_LENGTHS), repeats=3)
    assert isinstance(model, QuadraticLatency)
    print("\nprofiled:", model.describe())
    assert model.source.endswith(":cuda")
    assert min(model.a, model.b, model.c) >= 0
    grid = [1, 16, 64, 256, 1024, 2048, 4096, 8192]
    preds = [model.predict(n) for n in grid]
    assert all(x < y for x, y in zip(preds, preds[1:], strict=False)), preds
    assert model.rel_rmse < 0.25, model.describe()
    assert 1e-4 < model.predict(512) < 1.0  # an 8B prefill of 512 tokens: milliseconds on a GPU
    profiles = [r for r in dev.timeline() if r.label.startswith("profile:")]
    assert len(profiles) == 1 + 3 * len(DEFAULT_PROFILE_LENGTHS)


def test_agent_profile_reaches_the_longest_chunk_and_predicts_it(engine, tmp_path) -> None:
    """The agent's GPU profile doubles on to the longest chunk admission may run, so a
    4096-token chunk is predicted from measured long prefills, not extrapolated from
    short ones, whose times are dominated by the kernel-launch floor."""
    import time

    from bubbletea_agent.config import parse_config
    from bubbletea_agent.runtime import profile_lengths, profile_on_device

    cfg = parse_config({
        "owner": "bt", "device": {"name": "gpu0", "run_dir": str(tmp_path), "mode": "real"},
        "slots": str(tmp_path / "slots.jsonl"), "out_dir": str(tmp_path / "out"),
        "model": {"preset": "tiny"}, "admission": {"max_chunk_tokens": 4096},
        "requests": {"kind": "poisson", "rate_per_s": 1, "duration_s": 1, "lengths": {"kind": "fixed", "tokens": 64}},
    })
    lengths = profile_lengths(cfg, engine.torch_device)
    assert lengths[-1] == 4096
    dev = Device("gpu0", tmp_path, mode="real")
    model = profile_on_device(dev, engine, "bt", lengths, repeats=3)
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        engine.forward(4096, None)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    measured = sorted(runs)[1]
    print(f"\n4096 tokens: predicted {model.predict(4096) * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms "
          f"({model.describe()})")
    assert model.predict(4096) == pytest.approx(measured, rel=0.25)


def test_cuda_kv_cache_ships_over_atlas_loopback_bit_exact(spec, engine, tmp_path) -> None:
    from bubbletea_agent.kv_ship import DecodeServer, connect_shipper

    dev = Device("gpu0", tmp_path, mode="real")
    kv = engine.run_chunk(dev, "bt", "ship", 512, 0, None, final=True).partial
    assert kv.keys.is_cuda
    server = DecodeServer.start("127.0.0.1", 0, streams=4, secret="gpu-kv", keep_tensors=True)
    try:
        shipper = connect_shipper("127.0.0.1", server.port, streams=4, secret="gpu-kv")
        try:
            res = shipper.ship("req-cuda", kv)
        finally:
            shipper.close()
        rx = server.wait_for(1, timeout=30)[0]
    finally:
        server.stop()
    assert rx.request_id == "req-cuda" and rx.mode == "real"
    assert rx.logical_shape == spec.kv_shape(512)
    assert rx.wire_bytes == res.wire_bytes == 64 << 20
    want_k, want_v = kv.keys.cpu(), kv.values.cpu()
    assert torch.equal(rx.keys.view(torch.int16), want_k.view(torch.int16))
    assert torch.equal(rx.values.view(torch.int16), want_v.view(torch.int16))
    # and onto the decode host's GPU
    assert torch.equal(rx.keys.to("cuda"), kv.keys)
