"""`testbed run --local` end to end (workers as local processes on 127.0.0.1, no
emulated network, no root), and the command's error messages."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from testbed.cli import main
from testbed.progress import Progress
from testbed.run.runner import RunnerError, run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.contracts.summary import read_summary

ROOT = Path(__file__).resolve().parents[3]


def write_scenario(tmp_path: Path, **extra) -> Path:
    wl = yaml.safe_load((ROOT / "scenarios/workloads/tiny.yaml").read_text())
    wl.update(iterations=1, warmup=1)
    wl["parallelism"]["num_micro_batches"] = 2
    doc = {"name": "local-e2e", "topology": str(ROOT / "topologies/2dc.yaml"), "workload": wl,
           "variants": ["baseline", "atlas"],
           "runner": {"local": True, "calibration_transfers": 1, "atlas_sharing": "temporal"}}
    doc.update(extra)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(240)
def test_local_run_writes_summary_timelines_and_gantt(tmp_path: Path) -> None:
    scenario, resolved = load_scenario(write_scenario(tmp_path))
    out = tmp_path / "out"
    stream = io.StringIO()
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=stream, tty=False))
    on_disk = read_summary(out / "summary.json")
    assert on_disk == summary
    assert summary.variants.keys() == {"baseline", "atlas"} and not summary.failed()
    assert summary.delay_backend.startswith("none (local mode")
    assert summary.scale == 1.0 and summary.seed == 1
    assert summary.calibration.channel_rate_mbps.keys() >= {"1"}
    assert (out / "scenario.resolved.yaml").exists()
    for name in summary.variants:
        v = summary.result(name)
        assert v.iteration_time_s > 0 and 0 < v.device_utilization <= 1
        assert v.predicted_iteration_time_s > 0 and 0 < v.bubble_fraction < 1
        assert len(v.iteration_times_s) == 1 and len(v.warmup_iteration_times_s) == 1
        link = v.wan_links["dc1-dc2"]
        # 2 pipelines x 2 micro-batches, activations and gradients, over the one WAN crossing
        assert link.transfers == 8
        assert link.bytes == 8 * summary.wire_activation_bytes
        assert (out / v.gantt_png).stat().st_size > 10_000
        mc = v.machine_cpu  # everything of a local run is on this machine: its CPU is accounted (in
        # clock ticks: over one short iteration the run's share can round to 0)
        assert mc is not None and mc.cores == os.cpu_count() and mc.busy_cores >= 0 and mc.run_cores >= 0
        assert mc.outside_cores == pytest.approx(max(0.0, mc.busy_cores - mc.run_cores), abs=1e-2)
        rows = (out / v.timeline_csv).read_text().splitlines()
        assert rows[0].startswith("device,kind,owner") and len(rows) == 1 + 4 * 2 * 2 * 2  # 4 devices, F+B
    assert summary.result("atlas").temporal_plan is not None
    assert summary.result("baseline").streams == 1
    assert "calibration:" in stream.getvalue()


def test_cli_errors_speak_to_the_user(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["run", str(tmp_path / "nope.yaml")])
    assert res.exit_code != 0 and "nope.yaml" in res.output
    path = write_scenario(tmp_path)
    res = runner.invoke(main, ["run", str(path), "--set", "workload.parallelism.pp=1", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "parallelism.pp is 1; pipeline training across DCs needs pp >= 2" in res.output
    res = runner.invoke(main, ["run", str(path), "--variants", "atlas,turbo", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "unknown variant(s) turbo" in res.output
    res = runner.invoke(main, ["run", str(path), "--variants", ",", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "give at least one variant" in res.output
    res = runner.invoke(main, ["run", str(path), "--set", "runner.colour=blue"])
    assert res.exit_code != 0 and "unknown parameter 'colour'" in res.output


def test_emulation_needs_root(tmp_path: Path, monkeypatch) -> None:
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    scenario, resolved = load_scenario(write_scenario(tmp_path), {"runner.local": False})
    with pytest.raises(RunnerError, match=r"needs root: run as root \(sudo\), or set runner.local: true"):
        run_scenario(scenario, resolved, tmp_path / "o", Progress(stream=io.StringIO(), tty=False))
