"""Prefill engines: a real tiny Llama (KV cache, chunked continuation, local weights)
and the modelled engine (compute-model charge, KV shape, scaled materialisation)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from bubbletea_agent.engine import (
    EngineError,
    ModelledEngine,
    TransformersEngine,
    build_engine,
    chunk_flops,
    compute_model_charge,
    compute_spec,
)
from bubbletea_agent.sim import FakeClock, SimDevice
from testbed_core.compute_model import ComputeModel, gpu_spec, param_count, prefill_flops
from testbed_core.contracts.bubbletea import PrefillModelSpec

TINY = PrefillModelSpec(preset="tiny", dtype="float32", seed=7)


@pytest.fixture(scope="module")
def tiny_engine():
    return TransformersEngine(TINY, device="cpu")


def test_spec_presets_overrides_and_errors():
    s = PrefillModelSpec(preset="llama-3-8b", num_hidden_layers=4)
    assert s.num_hidden_layers == 4 and s.hidden_size == 4096 and s.kv_head_dim == 128
    assert s.kv_shape(100) == (4, 1, 8, 100, 128)
    assert s.kv_bytes(100) == 2 * 4 * 8 * 100 * 128 * 2
    with pytest.raises(ValidationError, match="unknown model preset 'gpt9'"):
        PrefillModelSpec(preset="gpt9")
    with pytest.raises(ValidationError, match="multiple of num_key_value_heads"):
        PrefillModelSpec(preset="tiny", num_key_value_heads=3)
    with pytest.raises(ValidationError, match="hidden_size must be > 0"):
        PrefillModelSpec(preset=None, num_hidden_layers=2)
    with pytest.raises(ValidationError, match="dtype 'int8' unknown"):
        PrefillModelSpec(dtype="int8")


def test_params_match_the_real_model_and_the_compute_model(tiny_engine):
    real = sum(p.numel() for p in tiny_engine.model.parameters())
    assert TINY.params() == real
    big = PrefillModelSpec(preset="llama-3-8b")
    assert param_count(compute_spec(big)) == pytest.approx(big.params(), rel=1e-3)
    assert 7.9e9 < big.params() < 8.1e9  # Llama-3-8B has 8.03 B parameters


def test_real_prefill_kv_cache_shape(tiny_engine):
    dev = SimDevice(FakeClock(), [], mode="real")
    res = tiny_engine.run_chunk(dev, "bt", "r0:0:40", 40, 0, None)
    kv = tiny_engine.finish(res.partial)
    L, B, H, T, D = kv.keys.shape
    assert (L, B, H, T, D) == (2, 1, 2, 40, 16) == TINY.kv_shape(40)
    assert kv.values.shape == kv.keys.shape and kv.mode == "real" and kv.scale == 1.0
    assert kv.keys.abs().sum() > 0
    assert res.record.kind == "prefill" and res.record.label == "r0:0:40"
    assert res.record.end > res.record.start  # real mode: the device time it really took


def test_chunked_prefill_continues_the_cache(tiny_engine):
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (1, 48))
    eng = tiny_engine
    from transformers import DynamicCache

    with torch.inference_mode():
        whole = eng.model(input_ids=ids, cache=DynamicCache(config=eng.model.config), use_cache=True).cache
    # feed the same ids in two chunks through the engine's forward
    chunks = iter([ids[:, :20], ids[:, 20:]])
    orig = eng.prompt_ids
    eng.prompt_ids = lambda n, *rest: next(chunks)
    try:
        c = eng.forward(20, None)
        c = eng.forward(28, c)
    finally:
        eng.prompt_ids = orig
    kv = eng.finish(c)
    ref = torch.stack([layer.keys for layer in whole.layers])
    assert kv.keys.shape[3] == 48
    assert torch.allclose(kv.keys, ref, atol=1e-5)
    assert torch.allclose(kv.values, torch.stack([layer.values for layer in whole.layers]), atol=1e-5)


def test_engine_chunk_context_must_match(tiny_engine):
    dev = SimDevice(FakeClock(), [], mode="real")
    res = tiny_engine.run_chunk(dev, "bt", "x", 10, 0, None)
    with pytest.raises(EngineError, match="continues at token 5 but the cache holds 10"):
        tiny_engine.run_chunk(dev, "bt", "x", 10, 5, res.partial)


def test_busy_device_runs_nothing(tiny_engine):
    clock = FakeClock(0.0)
    from bubbletea_agent.sim import Piece

    dev = SimDevice(clock, [Piece(0.0, 1.0)], mode="real")
    assert tiny_engine.run_chunk(dev, "bt", "x", 10, 0, None) is None


def test_local_weights_load_and_bad_paths(tmp_path, tiny_engine):
    tiny_engine.model.save_pretrained(tmp_path / "w")
    spec = PrefillModelSpec(preset="tiny", dtype="float32", weights=tmp_path / "w")
    eng = TransformersEngine(spec, device="cpu")
    a = dict(tiny_engine.model.named_parameters())
    b = dict(eng.model.named_parameters())
    assert torch.equal(a["model.layers.0.mlp.up_proj.weight"], b["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(EngineError, match="not a directory"):
        TransformersEngine(PrefillModelSpec(weights=tmp_path / "missing"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match="cannot load"):
        TransformersEngine(PrefillModelSpec(weights=tmp_path / "empty"), device="cpu")


def test_random_weights_follow_the_seed():
    a = TransformersEngine(PrefillModelSpec(preset="tiny", seed=1), device="cpu")
    b = TransformersEngine(PrefillModelSpec(preset="tiny", seed=1), device="cpu")
    c = TransformersEngine(PrefillModelSpec(preset="tiny", seed=2), device="cpu")
    w = "model.layers.1.self_attn.q_proj.weight"
    pa, pb, pc = (dict(e.model.named_parameters())[w] for e in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_too_big_for_cpu():
    with pytest.raises(EngineError, match=r"8030M parameters is too large for CPU prefill.*modelled device"):
        TransformersEngine(PrefillModelSpec(preset="llama-3-8b"), device="cpu")


def test_compute_model_charge_and_chunk_flops():
    spec = PrefillModelSpec(preset="llama-3-8b")
    cm_spec = compute_spec(spec)
    assert chunk_flops(cm_spec, 512, 0) == pytest.approx(prefill_flops(cm_spec, 512))
    # a chunk after context attends to more keys
    assert chunk_flops(cm_spec, 256, 256) > chunk_flops(cm_spec, 256, 0)
    cm = ComputeModel(gpu_spec("H100"), efficiency=0.5)
    charge = compute_model_charge(spec, cm)
    assert charge(2048, 0) == pytest.approx(cm.prefill_seconds(cm_spec, 2048))
    assert charge(1, 0) == pytest.approx(cm.prefill_seconds(cm_spec, 1))  # weight-read bound
    assert 0.01 < charge(2048, 0) < 0.2  # ~2 * 8e9 * 2048 / 495e12 = 66 ms
    assert charge(0, 0) == 0.0


def test_modelled_engine_holds_the_device_for_the_charge():
    clock = FakeClock(0.0)
    dev = SimDevice(clock, [], time_scale=2.0)
    spec = PrefillModelSpec(preset="llama-3-8b")
    eng = ModelledEngine(spec, lambda n, p: 1e-4 * n + 1e-6 * p)
    r1 = eng.run_chunk(dev, "bt", "a:0", 100, 0, None)
    assert r1.record.end - r1.record.start == pytest.approx(2 * 0.01)  # time_scale applies
    r2 = eng.run_chunk(dev, "bt", "a:1", 50, 100, r1.partial)
    assert r2.partial == 150
    kv = eng.finish(r2.partial)
    assert kv.logical_shape == (32, 1, 8, 150, 128) and kv.mode == "modelled"
    assert kv.keys.dtype == torch.bfloat16 and kv.scale == 1.0
    assert kv.logical_bytes == spec.kv_bytes(150)
    with pytest.raises(EngineError, match="continues at token 10 but 150 tokens"):
        eng.run_chunk(dev, "bt", "a:2", 5, 10, r2.partial)


def test_modelled_kv_scaled_down_when_too_large():
    spec = PrefillModelSpec(preset="llama-3-70b")
    eng = ModelledEngine(spec, lambda n, p: 0.0, materialise_limit_bytes=8 << 20)
    kv = eng.finish(8192)
    assert kv.logical_shape == (80, 1, 8, 8192, 128)
    assert kv.materialised_bytes <= 8 << 20
    assert kv.keys.shape[0] == 1 and kv.keys.shape[3] < 8192  # one layer, fewer tokens
    assert kv.scale == pytest.approx(kv.materialised_bytes / (2 * 80 * 8 * 8192 * 128 * 2))
    small = eng.finish(16)
    assert small.keys.shape == (80, 1, 8, 16, 128) and small.scale == 1.0


def test_build_engine_errors():
    with pytest.raises(EngineError, match="needs the compute model's charge"):
        build_engine("modelled", TINY)
    with pytest.raises(EngineError, match="mode 'fake'"):
        build_engine("fake", TINY)
    assert build_engine("real", TINY, torch_device="cpu").mode == "real"
