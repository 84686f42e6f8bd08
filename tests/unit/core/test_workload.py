"""Workload files: the shipped ones load, derived numbers follow the compute model,
and every user error names the file, the field and what is allowed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from testbed_core.compute_model import activation_bytes, stage_flops
from testbed_core.constants import WORKLOADS_DIR as WORKLOADS
from testbed_core.workload import WorkloadError, load_workload, parse_workload


def base() -> dict:
    return {
        "name": "w",
        "model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256},
        "parallelism": {"dp": 2, "pp": 2, "num_micro_batches": 4},
        "gpu": {"type": "A100"},
    }


@pytest.mark.parametrize("name", ["tiny", "gpt-1.3b"])
def test_shipped_workloads_load(name: str) -> None:
    wl = load_workload(WORKLOADS / f"{name}.yaml")
    eff = wl.effective(WORKLOADS)
    assert eff.stages == wl.parallelism.pp
    assert all(t > 0 for t in eff.stage_forward_s + eff.stage_backward_s)


def test_gpt_example_numbers_and_scale_note() -> None:
    wl = load_workload(WORKLOADS / "gpt-1.3b.yaml")
    eff = wl.effective()
    spec = wl.model_spec()
    assert eff.activation_bytes == 1 * 2048 * 2048 * 2 == activation_bytes(spec, 1)
    assert eff.wire_activation_bytes == round(eff.activation_bytes * 0.1)
    fl = stage_flops(spec, 2, 1)
    # compute time = FLOPs / (312 TFLOP/s x 0.5)
    assert eff.stage_forward_s[0] == pytest.approx(fl[0].forward / 156e12)
    assert eff.stage_backward_s[1] == pytest.approx(fl[1].backward / 156e12)
    assert eff.represented_rate(1e9) == pytest.approx(10e9)
    note = eff.scale_note(1e9)
    assert "scale 0.1" in note and "1Gbit/s" in note and "10Gbit/s" in note


def test_scale_one_says_so_and_custom_gpu() -> None:
    data = base()
    data["gpu"] = {"type": "custom", "peak_tflops": 10, "efficiency": 1.0}
    data["model"]["dtype"] = "fp32"
    wl = parse_workload(data)
    eff = wl.effective()
    assert eff.scale_note() == "scale 1: tensors are sent at their real size"
    assert eff.effective_tflops == pytest.approx(10)


def test_profile_path_is_relative_to_the_workload_file(tmp_path: Path) -> None:
    (tmp_path / "prof.yaml").write_text("forward: 0.25\nbackward: 0.5\n")
    data = base()
    data["gpu"]["profile"] = "prof.yaml"
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    eff = load_workload(path).effective(tmp_path)
    assert eff.stage_forward_s == [0.25, 0.25] and eff.stage_backward_s == [0.5, 0.5]
    with pytest.raises(WorkloadError, match="gpu.profile: .*no such profile file"):
        load_workload(path).effective(tmp_path / "elsewhere")


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (("parallelism", "schedule", "zb-v"), "parallelism.schedule", "'gpipe', '1f1b' or 'interleaved-1f1b'"),
        (("gpu", "type", "V100"), "gpu.type", "allowed: A100, H100, H200, custom"),
        (("model", "dtype", "int8"), "model.dtype", "'bf16', 'fp16' or 'fp32'"),
        (("parallelism", "dp", 0), "parallelism.dp", "greater than or equal to 1"),
        (("gpu", "efficiency", 1.5), "gpu.efficiency", "less than or equal to 1"),
        (("model", "heads", 5), "model", "must be a multiple of heads (5)"),
        (("parallelism", "pp", 8), "(top level)", "model.layers (4) must be at least pp x chunks (8)"),
        (("parallelism", "tp", 3), "(top level)", "parallelism.tp (3) must divide model.heads (4)"),
        (("parallelism", "chunks", 2), "parallelism", "needs schedule interleaved-1f1b"),
        (("gpu", "type", "custom"), "gpu", "type custom needs peak_tflops"),
        (("model", "layerz", 3), "model.layerz", "unknown field"),
        (("", "scale", 0), "scale", "greater than 0"),
    ],
)
def test_errors_name_file_field_and_allowed_values(tmp_path: Path, change, field: str, message: str) -> None:
    data = copy.deepcopy(base())
    section, key, value = change
    (data[section] if section else data)[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    text = str(info.value)
    assert str(path) in text
    assert f"{field}: " in text
    assert message in text


def test_missing_section_and_file_errors(tmp_path: Path) -> None:
    data = base()
    del data["parallelism"]
    with pytest.raises(WorkloadError, match="parallelism: required field is missing"):
        parse_workload(data, "x.yaml")
    with pytest.raises(WorkloadError, match=r"no such workload file \(shipped workloads .*tiny.yaml"):
        load_workload(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(WorkloadError, match="must be a YAML mapping"):
        load_workload(tmp_path / "list.yaml")


def test_interleaved_needs_microbatches_multiple_of_pp() -> None:
    data = base()
    data["parallelism"].update(schedule="interleaved-1f1b", chunks=2, num_micro_batches=3)
    with pytest.raises(WorkloadError, match=r"num_micro_batches \(3\) to be a multiple of pp \(2\)"):
        parse_workload(data)
    data["parallelism"]["num_micro_batches"] = 4
    eff = parse_workload(data).effective()
    assert eff.stages == 4 and eff.stage_layers == [1, 1, 1, 1]
