"""`testbed plan`: text and JSON output, and every user error with its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed_core.variants import REGISTRY

ROOT = Path(__file__).resolve().parents[3]
TOPO = str(ROOT / "topologies" / "2dc.yaml")
WL = str(ROOT / "scenarios" / "workloads" / "gpt-1.3b.yaml")


def run(*args: str):
    return CliRunner().invoke(main, ["plan", *args])


def test_text_output_lists_placement_crossings_and_variants() -> None:
    res = run("--topology", TOPO, "--workload", WL)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "scale 0.1: tensors are sent at 0.1x their real size" in out
    assert "dc1: stages 0  hosts dc1-h1 dc1-h2" in out
    assert "WAN crossing: boundary 0|1 dc1 -> dc2, 25.0 ms one way" in out
    for name in ("baseline", "multi-tcp", "atlas"):
        assert f"\n  {name} " in out
    assert "temporal plan:" in out
    assert "dp-across-dc" not in out


def test_json_output_has_each_variant() -> None:
    res = run("--topology", TOPO, "--workload", WL, "--json", "--variants", "baseline,atlas,dp-across-dc")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["scale"] == 0.1 and "10Gbit/s" in doc["scale_note"]
    assert set(doc["variants"]) == {"baseline", "atlas", "dp-across-dc"}
    atlas, base = doc["variants"]["atlas"], doc["variants"]["baseline"]
    assert atlas["predicted_iteration_time_s"] < base["predicted_iteration_time_s"]
    assert atlas["placement"]["wan_crossings"] == [
        {"boundary": 0, "src": "dc1", "dst": "dc2", "path": ["dc1", "dc2"], "pipelines": [0, 1]}
    ]
    assert base["wan_paths"][0]["streams"] == 1
    assert doc["variants"]["dp-across-dc"]["placement"]["wan_crossings"] == []


def test_gpus_override_changes_placement() -> None:
    topo3 = str(ROOT / "topologies" / "3dc-triangle.yaml")
    res = run("--topology", topo3, "--workload", WL, "--gpus", "dc1=2,dc2=6", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["free_gpus"] == {"dc1": 2, "dc2": 6, "dc3": 4}
    assert doc["variants"]["atlas"]["placement"]["stage_dc"][0] == ["dc2", "dc2"]


def test_infeasible_placement_is_an_error_with_the_shortfall() -> None:
    res = run("--topology", TOPO, "--workload", WL, "--gpus", "dc1=1,dc2=1")
    assert res.exit_code == 1
    where = f"{WL}: workload.parallelism (pp=2, dp=2, tp=1) on topology {TOPO}: "
    assert f"no variant can be placed:\n  baseline: {where}infeasible" in res.output
    assert f"atlas: {where}infeasible: each stage needs dp x tp = 2 x 1 = 2 GPUs in one DC" in res.output
    assert "short by 2 stages of 2 GPUs" in res.output


@pytest.mark.parametrize(("pp", "dp"), [(8, 1), (2, 3)])
def test_infeasible_placement_names_the_workload_file(tmp_path: Path, pp: int, dp: int) -> None:
    """pp over the GPUs, and dp x pp over the GPUs: the refusal names the workload file."""
    text = Path(WL).read_text()
    wl = tmp_path / "big.yaml"
    import yaml

    data = yaml.safe_load(text)
    data["parallelism"].update(pp=pp, dp=dp)
    wl.write_text(yaml.safe_dump(data))
    res = run("--topology", TOPO, "--workload", str(wl))
    assert res.exit_code == 1, res.output
    assert f"{wl}: workload.parallelism (pp={pp}, dp={dp}, tp=1) on topology {TOPO}: infeasible" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "dc1:4"), "expected dc=count"),
        (("--gpus", "dc1=four"), "'four' is not a whole number of GPUs"),
        (("--gpus", "dc1=-1"), "GPU count must be >= 0"),
        (("--gpus", "dc9=4"), "unknown DC 'dc9' (DCs in topology 2dc: dc1, dc2)"),
        (("--variants", "atlas,fast"), "unknown variant(s) fast (allowed: baseline, multi-tcp, atlas, dp-across-dc, torch-gloo)"),
        (("--streams", "many"), "a number of streams (1-64) or 'auto'"),
        (("--streams", "100"), "streams must be between 1 and 64"),
        (("--flow-rate", "10MBps"), "'Bps' (bytes per second) is ambiguous"),
    ],
)
def test_bad_options_are_explained(args: tuple[str, ...], message: str) -> None:
    res = run("--topology", TOPO, "--workload", WL, *args)
    assert res.exit_code != 0
    assert message in " ".join(res.output.split())


def test_bad_files_are_explained(tmp_path: Path) -> None:
    res = run("--topology", str(tmp_path / "none.yaml"), "--workload", WL)
    assert res.exit_code == 1 and "no such topology file" in res.output
    res = run("--topology", TOPO, "--workload", str(tmp_path / "none.yaml"))
    assert res.exit_code == 1 and "no such workload file" in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {layers: 2}\nparallelism: {num_micro_batches: 1}\ngpu: {type: A100}\n")
    res = run("--topology", TOPO, "--workload", str(bad))
    assert res.exit_code == 1 and "model.hidden: required field is missing" in res.output


def test_measured_flow_rate_and_no_allreduce() -> None:
    res = run("--topology", TOPO, "--workload", WL, "--json", "--flow-rate", "107Mbit", "--no-allreduce",
              "--variants", "baseline")
    doc = json.loads(res.output)
    base = doc["variants"]["baseline"]
    assert base["wan_paths"][0]["per_flow_rate_bps"] == 107e6
    assert base["predicted_iteration_time_s"] == base["pipeline_time_s"]
    assert doc["net"]["allreduce_included"] is False


def test_help_lists_the_registry() -> None:
    res = run("--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "from: baseline, multi-tcp, atlas, dp-across-dc, torch-gloo." in text
    for v in REGISTRY.values():
        assert f"{v.name}: {v.description}" in text
    res = run("--topology", TOPO, "--workload", WL, "--variants", ",")
    assert res.exit_code != 0 and "give at least one variant (allowed: baseline, multi-tcp" in res.output
