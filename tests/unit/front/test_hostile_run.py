"""`testbed run` refuses, before anything is built and without creating a result
folder, what `testbed plan` would refuse and what the runner would only find out once
the emulation is up: infeasible placements, variants the runner cannot play, a
workload it cannot run, a machine that cannot build the emulation, and bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from testbed.cli import main
from testbed_core.constants import TOPOLOGIES_DIR, WORKLOADS_DIR


@pytest.fixture
def scenario_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the default result folder is results/ under the working directory
    wl = yaml.safe_load((WORKLOADS_DIR / "tiny.yaml").read_text())
    doc = {"name": "refused", "topology": str(TOPOLOGIES_DIR / "2dc.yaml"), "workload": wl,
           "variants": ["baseline", "atlas"], "runner": {"local": True}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def refused(path: Path, *args: str) -> str:
    res = CliRunner().invoke(main, ["run", str(path), *args])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    assert not (path.parent / "results").exists() and not (path.parent / "out").exists()
    return res.output


def test_infeasible_placement(scenario_file: Path) -> None:
    out = refused(scenario_file, "--set", "workload.parallelism.dp=9", "--out", "out")
    assert "this run cannot start (nothing was built)" in out
    assert "variant baseline: " in out and ": workload.parallelism (pp=2, dp=9, tp=1) cannot be placed" in out
    assert "infeasible: the even placement puts more GPUs in a DC than it has" in out
    assert "infeasible: each stage needs dp x tp = 9 x 1 = 9 GPUs in one DC" in out
    assert "what would fit: workload.parallelism.dp: 2 (with pp=2)" in out
    assert "drop these from the scenario's variants, or choose others with --variants" in out


def test_one_infeasible_variant_is_enough(scenario_file: Path, tmp_path: Path) -> None:
    # dc1 holds both stages of both pipelines (atlas fits); even placement wants 2 GPUs in dc2, which has 1
    doc = yaml.safe_load(scenario_file.read_text())
    doc["topology"] = {"name": "lopsided", "dcs": [{"name": "dc1", "hosts": 4}, {"name": "dc2", "hosts": 1}],
                       "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "5ms"}]}
    scenario_file.write_text(yaml.safe_dump(doc))
    out = refused(scenario_file)
    assert "variant baseline: " in out and "infeasible: the even placement puts more GPUs in a DC than it has" in out
    assert "variant atlas" not in out


def test_pipeline_needed(scenario_file: Path) -> None:
    out = refused(scenario_file, "--set", "workload.parallelism.pp=1")
    assert "parallelism.pp is 1; pipeline training across DCs needs pp >= 2" in out


def test_emulation_needs_root_before_anything_is_built(scenario_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.emulation.network as network

    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    out = refused(scenario_file, "--set", "runner.local=false")
    assert "building an emulation needs root: run as root (sudo)" in out
    assert "--local" in out


def test_gpu_count_dcs_cannot_be_emulated(scenario_file: Path) -> None:
    doc = yaml.safe_load(scenario_file.read_text())
    doc["topology"] = {"name": "sized", "dcs": [{"name": "dc1", "gpus": 8}, {"name": "dc2", "gpus": 8}],
                       "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "5ms"}]}
    doc["runner"]["local"] = False
    scenario_file.write_text(yaml.safe_dump(doc))
    assert "given as GPU counts" in refused(scenario_file)


@pytest.mark.parametrize(("text", "needle"), [
    ("name: a\nname: b\n", "duplicate key 'name'"),
    ("name: " + "[" * 1000, "nesting deeper than 32 levels"),
])
def test_bad_scenario_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert needle in refused(path)


def test_a_missing_profile_is_found_first(scenario_file: Path) -> None:
    out = refused(scenario_file, "--set", "workload.gpu.profile=nope.yaml")
    assert "no such profile file" in out


def test_a_sweep_point_that_cannot_run_is_refused_when_loaded(scenario_file: Path, tmp_path: Path) -> None:
    from testbed.sweep import SweepError, load_sweep

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: dps\nbase: {scenario_file}\nparameters:\n  workload.parallelism.dp: [1, 2, 9]\n")
    with pytest.raises(SweepError) as info:
        load_sweep(sweep)
    msg = str(info.value)
    assert "sweep.yaml: point p003-dp=9 (workload.parallelism.dp=9) cannot run (nothing was built)" in msg
    assert "variant atlas: " in msg and "infeasible" in msg
    sweep.write_text(f"name: dps\nbase: {scenario_file}\nparameters:\n  workload.parallelism.dp: [1, 2]\n")
    assert len(load_sweep(sweep).points) == 2
