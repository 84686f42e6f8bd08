"""Compute model: parameter and FLOP counts against known models and torch's own
counter, tensor sizes, GPU figures, roofline times and measured profiles."""

from __future__ import annotations

import json

import pytest

from testbed_core.compute_model import (
    GPUS,
    ComputeModel,
    ComputeModelError,
    ModelSpec,
    activation_bytes,
    gpu_spec,
    layer_forward_flops,
    layer_params,
    load_profile,
    logits_forward_flops,
    param_count,
    prefill_flops,
    stage_flops,
    stage_layers,
)

GPT2_SMALL = ModelSpec(layers=12, hidden=768, heads=12, seq_len=1024, vocab=50257)
LLAMA2_7B = ModelSpec(
    layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn_hidden=11008, gated_mlp=True,
    bias=False, positional="rotary", tied_embeddings=False, dtype="fp16",
)


def test_gpt2_small_parameter_count() -> None:
    # The published GPT-2 small checkpoint has 124,439,808 parameters.
    assert param_count(GPT2_SMALL) == 124_439_808


def test_llama2_7b_parameter_count_is_about_6_7b() -> None:
    # Llama-2-7B: 6.74e9 parameters (norms counted with biases here: +0.3M).
    assert param_count(LLAMA2_7B) == pytest.approx(6.738e9, rel=0.001)


def test_narayanan_formulas() -> None:
    m, b = GPT2_SMALL, 4
    s, h, V, L = m.seq_len, m.hidden, m.vocab, m.layers
    assert layer_forward_flops(m, b) == 24 * b * s * h**2 + 4 * b * s**2 * h
    assert logits_forward_flops(m, b) == 2 * b * s * h * V

    def iteration(recompute: bool) -> float:  # forward + backward of every stage, one batch
        return sum(st.forward + st.backward for st in stage_flops(m, 3, b, recompute=recompute))

    # Narayanan et al. 2021, eq. (3) without recomputation: 72 B s l h^2 (1 + s/6h + V/12lh)
    expected = 72 * b * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert iteration(False) == pytest.approx(expected, rel=1e-12)
    # with recomputation: 96 B s l h^2 (1 + s/6h + V/16lh)
    expected_rc = 96 * b * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert iteration(True) == pytest.approx(expected_rc, rel=1e-12)


def test_flops_and_params_match_torch_counter_on_real_gpt2() -> None:
    """Build a small GPT-2 with transformers and count its FLOPs with torch."""
    import torch  # pinned dependencies: never skipped
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    spec = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=100)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=100,
                                  attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(spec)
    x = torch.randint(0, 100, (3, 32))
    with FlopCounterMode(display=False) as fwd:
        logits = model(x).logits
    expected_fwd = spec.layers * layer_forward_flops(spec, 3) + logits_forward_flops(spec, 3)
    assert fwd.get_total_flops() == expected_fwd
    with FlopCounterMode(display=False) as bwd:
        logits.sum().backward()
    assert bwd.get_total_flops() == 2 * expected_fwd  # backward = 2 x forward


def test_gqa_and_gated_mlp_counts() -> None:
    m = ModelSpec(layers=1, hidden=64, heads=8, kv_heads=2, seq_len=16, vocab=10, ffn_hidden=100,
                  gated_mlp=True, bias=False)
    tokens = 16
    proj = 2 * tokens * (64 * 64 + 2 * 64 * 16 + 64 * 64)  # kv_dim = 2 heads x 8
    mlp = 2 * tokens * 3 * 64 * 100
    attn = 4 * 16 * 16 * 64
    assert layer_forward_flops(m, 1) == proj + mlp + attn
    assert layer_params(m) == 64 * (64 + 32) + 64 * 64 + 3 * 64 * 100 + 4 * 64


def test_prefill_is_about_two_flops_per_parameter_per_token() -> None:
    # Kaplan et al. 2020: forward ~ 2 N per token (N non-embedding params) for short contexts.
    tokens = 128
    non_embedding = LLAMA2_7B.layers * layer_params(LLAMA2_7B)
    per_token = prefill_flops(LLAMA2_7B, tokens) / tokens
    assert per_token == pytest.approx(2 * non_embedding, rel=0.02)
    with pytest.raises(ComputeModelError, match="at least one token"):
        prefill_flops(LLAMA2_7B, 0)


def test_tensor_sizes() -> None:
    assert activation_bytes(GPT2_SMALL, micro_batch=2) == 2 * 1024 * 768 * 2
    assert activation_bytes(LLAMA2_7B, micro_batch=1, seq_len=100) == 100 * 4096 * 2  # fp16


def test_stage_split_puts_logits_on_the_last_stage() -> None:
    assert stage_layers(10, 4) == [3, 3, 2, 2]
    st = stage_flops(GPT2_SMALL, 3, micro_batch=1)
    assert [s.layers for s in st] == [4, 4, 4]
    assert st[0].forward == st[1].forward < st[2].forward
    assert st[2].forward - st[1].forward == logits_forward_flops(GPT2_SMALL, 1)
    assert all(s.backward == 2 * s.forward for s in st)
    rc = stage_flops(GPT2_SMALL, 3, micro_batch=1, recompute=True)
    assert rc[0].backward == 3 * rc[0].forward  # recomputation: one more forward
    assert rc[2].backward == 3 * st[1].forward + 2 * logits_forward_flops(GPT2_SMALL, 1)
    assert sum(s.params for s in st) == param_count(GPT2_SMALL)
    with pytest.raises(ComputeModelError, match="cannot split 2 layers into 3"):
        stage_layers(2, 3)


def test_gpu_table_and_lookup() -> None:
    assert set(GPUS) == {"A100", "H100", "H200"}
    assert gpu_spec("a100").peak("bf16") == 312e12
    assert gpu_spec("H100").peak("fp16") == pytest.approx(989.5e12)
    assert gpu_spec("H200").memory_bandwidth > gpu_spec("H100").memory_bandwidth
    with pytest.raises(ComputeModelError, match=r"unknown GPU 'V100' \(known: A100, H100, H200"):
        gpu_spec("V100")
    with pytest.raises(ComputeModelError, match="no peak figure for dtype 'int4'"):
        gpu_spec("A100").peak("int4")


def test_roofline_seconds_and_tp() -> None:
    cm = ComputeModel(gpu_spec("A100"), "bf16", efficiency=0.5)
    assert cm.seconds(156e12) == pytest.approx(1.0)
    assert ComputeModel(gpu_spec("A100"), "bf16", 0.5, tp=4).seconds(156e12) == pytest.approx(0.25)
    # Memory-bound: 1 GB of weights at 2039 GB/s x 0.5.
    assert cm.seconds(1.0, bytes_moved=1e9) == pytest.approx(1e9 / (2039e9 * 0.5))
    # A 16-token prefill of a 7B model is bound by reading the weights, a long one by compute.
    short, long = cm.prefill_seconds(LLAMA2_7B, 16), cm.prefill_seconds(LLAMA2_7B, 4096)
    weights = LLAMA2_7B.layers * layer_params(LLAMA2_7B) * 2
    assert short == pytest.approx(weights / (2039e9 * 0.5))
    assert long == pytest.approx(prefill_flops(LLAMA2_7B, 4096) / 156e12)
    with pytest.raises(ComputeModelError, match="efficiency must be in"):
        ComputeModel(gpu_spec("A100"), efficiency=1.5)


def test_profile_overrides_and_interpolates(tmp_path) -> None:
    path = tmp_path / "prof.yaml"
    path.write_text("gpu: A100\nops:\n  forward: 0.01\n  forward/stage1: 0.02\n  prefill/100: 0.1\n  prefill/300: 0.2\n")
    prof = load_profile(path)
    cm = ComputeModel(gpu_spec("A100"), profile=prof)
    assert cm.seconds(1e15, op="forward") == 0.01
    assert cm.seconds(1e15, op="forward", stage=1) == 0.02
    assert cm.seconds(156e12, op="backward") == pytest.approx(1.0)  # not measured: the model
    assert prof.lookup("prefill", tokens=200) == pytest.approx(0.15)
    assert prof.lookup("prefill", tokens=500) == pytest.approx(0.3)  # extrapolated
    assert prof.lookup("prefill", tokens=50) == pytest.approx(0.075)
    assert cm.prefill_seconds(LLAMA2_7B, 300) == 0.2
    jpath = tmp_path / "p.json"
    jpath.write_text(json.dumps({"forward": 0.5}))
    assert load_profile(jpath).lookup("forward") == 0.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("forward: fast\n", "ops.forward: expected seconds"),
        ("forward: -1\n", "ops.forward: expected seconds"),
        ("[1, 2]\n", "a profile is a mapping of op name to seconds"),
        ("forward: [\n", "not valid YAML"),
    ],
)
def test_profile_errors_name_the_file_and_op(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ComputeModelError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)
    with pytest.raises(ComputeModelError, match="no such profile file"):
        load_profile(tmp_path / "missing.yaml")


def test_model_spec_validation() -> None:
    with pytest.raises(ComputeModelError, match="hidden .* multiple of model.heads"):
        ModelSpec(layers=1, hidden=10, heads=3, seq_len=1, vocab=1)
    with pytest.raises(ComputeModelError, match="model.dtype 'int8'"):
        ModelSpec(layers=1, hidden=8, heads=2, seq_len=1, vocab=1, dtype="int8")
