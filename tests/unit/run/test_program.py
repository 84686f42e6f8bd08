"""Program scenarios (testbed/run/scenario.py's program part, testbed/run/program.py):
validation and its messages, the seconds per step taken from the launch's report, a
whole run with a fake network and launcher, and the sweep's points, table and plot."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.launch import LaunchError, LaunchReport, LinkBytes, RankReport
from testbed.run.common import RunnerError
from testbed.run.program import (
    launch_spec,
    result_line,
    run_program_scenario,
    seconds_per_step,
    select_variants,
    variant_result,
)
from testbed.run.scenario import (
    ProgramScenario,
    Scenario,
    ScenarioError,
    apply_override,
    load_any,
    resolve_scenario,
    validate_any,
    validate_scenario,
)
from testbed_core.constants import REPO_ROOT, TOPOLOGIES_DIR
from testbed_core.contracts.summary import ProgramSummary, ProgramVariantResult, VariantFailure

SCENARIOS = REPO_ROOT / "scenarios"


def program_file(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "name": "prog",
        "topology": str(TOPOLOGIES_DIR / "2dc.yaml"),
        "program": {"command": [".venv/bin/python", "examples/pipeline.py"], "hosts": ["dc1-h1", "dc2-h1"]},
        "variants": {"gloo": {"BACKEND": "gloo"}, "atlas": {"BACKEND": "atlas"}},
    }
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "prog.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(path: Path, overrides: dict[str, Any] | None = None) -> str:
    with pytest.raises(ScenarioError) as info:
        load_any(path, overrides)
    return str(info.value)


# ---------------------------------------------------------------------------- the scenario


def test_shipped_program_scenario_loads() -> None:
    scenario, resolved = load_any(SCENARIOS / "program-2dc.yaml")
    assert isinstance(scenario, ProgramScenario)
    assert list(scenario.variants) == ["gloo", "atlas"]
    assert scenario.variants["atlas"] == {"BACKEND": "atlas"}
    assert scenario.program.hosts == ["dc1-h1", "dc2-h1"]
    assert "workload" not in resolved


def test_workload_scenarios_still_load_as_before() -> None:
    scenario, _ = load_any(SCENARIOS / "quickstart.yaml")
    assert isinstance(scenario, Scenario)


def test_overrides_reach_the_program_and_the_topology(tmp_path: Path) -> None:
    data = resolve_scenario(program_file(tmp_path))
    apply_override(data, "topology.wan.0.delay", "5ms")
    apply_override(data, "program.nproc_per_host", 2)
    apply_override(data, "variants.atlas.BACKEND", "gloo")
    scenario = validate_any(data)
    assert isinstance(scenario, ProgramScenario)
    assert scenario.topology.wan[0].delay == pytest.approx(0.005)
    assert scenario.program.nproc_per_host == 2 and scenario.variants["atlas"]["BACKEND"] == "gloo"


def test_both_workload_and_program_are_refused(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, workload="workloads/tiny.yaml"))
    assert "names both a workload and a program; a scenario runs one of them" in text


def test_neither_workload_nor_program_is_refused(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, program=None))
    assert "workload: required field is missing" in text and "or give a program instead" in text


def test_empty_command_is_refused(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, program={"command": []}))
    assert "program.command" in text and "at least 1 item" in text


def test_blank_program_is_refused(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, program={"command": ["  ", "x.py"]}))
    assert "the command's first item (the program) is empty" in text


def test_non_string_variant_value_says_quote_it(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, variants={"atlas": {"BACKEND": "atlas", "ATLAS_STREAMS": 8}}))
    assert "variant 'atlas': ATLAS_STREAMS: 8 is not a string; quote it (ATLAS_STREAMS: '8')" in text


def test_non_string_program_env_says_quote_it(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, program={"command": ["x"], "env": {"STEPS": 4}}))
    assert "program.env" in text and "STEPS: 4 is not a string; quote it (STEPS: '4')" in text


def test_bad_env_name_is_refused(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, variants={"gloo": {"9LIVES": "x"}}))
    assert "variants.gloo: '9LIVES' is not an environment variable name" in text


def test_variants_must_be_env_sets(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, variants=["gloo", "atlas"]))
    assert "variants of a program are a mapping of environment sets" in text
    text = error_of(program_file(tmp_path, variants={"gloo": "BACKEND=gloo"}))
    assert "variant 'gloo': an environment set (a mapping NAME: value)" in text


def test_bad_variant_name_is_refused(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, variants={"a b": {"BACKEND": "gloo"}}))
    assert "variant name 'a b': letters, digits, . _ + - only" in text


def test_unknown_host_names_the_hosts(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path, program={"command": ["x"], "hosts": ["dc1-0"]}))
    assert "program.hosts: 'dc1-0' is not a host of the topology (hosts: dc1-h1, dc1-h2, dc2-h1, dc2-h2)" in text


def test_workload_knobs_are_not_program_fields(tmp_path: Path) -> None:
    text = error_of(program_file(tmp_path), {"runner.repeat": 3})
    assert "runner: unknown parameter 'runner'" in text


def test_validate_scenario_points_to_validate_any(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="names a program, not a workload"):
        validate_scenario(resolve_scenario(program_file(tmp_path)))


def test_unknown_variant_selection() -> None:
    scenario, _ = load_any(SCENARIOS / "program-2dc.yaml")
    assert select_variants(scenario, ["atlas"]) == ["atlas"]
    with pytest.raises(RunnerError, match=r"--variants: nccl not among the scenario's variants \(gloo, atlas\)"):
        select_variants(scenario, ["nccl"])


def test_launch_spec_layers_the_variant_env_on_the_program_env() -> None:
    scenario, _ = load_any(SCENARIOS / "program-2dc.yaml")
    spec = launch_spec(scenario, "atlas")
    assert spec.env == {"ATLAS_STREAMS": "8", "BACKEND": "atlas"}
    assert spec.hosts == ["dc1-h1", "dc2-h1"] and spec.command[1] == "examples/pipeline.py"


# ---------------------------------------------------------------------------- the figures


def rank(k: int, metrics: list[dict[str, Any]], code: int | None = 0) -> RankReport:
    return RankReport(rank=k, local_rank=0, host=f"dc{k + 1}-h1", dc=f"dc{k + 1}", ip=f"10.0.{k}.1",
                      exit_code=code, wall_s=9.0, stdout=f"rank-{k}.stdout", stderr=f"rank-{k}.stderr",
                      metrics=metrics)


def report(ranks: list[RankReport], ok: bool = True, failure: str | None = None, wall: float = 12.5) -> LaunchReport:
    return LaunchReport(command=["x"], topology="2dc", topology_file="", started=0.0, finished=wall, wall_s=wall,
                        ok=ok, failure=failure, world_size=len(ranks), nproc_per_host=1, master_addr="10.0.0.1",
                        master_port=29500, ranks=ranks,
                        wan_bytes=[LinkBytes(link="dc1-dc2", a="dc1", b="dc2", a_to_b_bytes=1000, b_to_a_bytes=500)])


def test_seconds_per_step_is_the_median_after_warmup() -> None:
    assert seconds_per_step([9.0, 1.0, 3.0, 2.0], 1) == 2.0
    assert seconds_per_step([9.0, 1.0], 5) == 5.0  # no more steps than the warm-up: all of them
    assert seconds_per_step([], 1) is None


def test_variant_result_from_rank0_step_times(tmp_path: Path) -> None:
    r0 = [{"step": i, "step_s": s} for i, s in enumerate([5.0, 1.0, 1.2, 0.8])] + [{"final": True}]
    r1 = [{"step": i, "step_s": 0.1, "loss": 2.0 - i} for i in range(4)]
    entry = variant_result({"BACKEND": "gloo"}, report([rank(0, r0), rank(1, r1)]), 1, tmp_path)
    assert entry.source == "step_s" and entry.seconds_per_step == 1.0 and entry.step_s_median == 1.0
    assert entry.steps == 4 and entry.warmup_steps == 1 and entry.step_times_s == [5.0, 1.0, 1.2, 0.8]
    assert entry.losses == [2.0, 1.0, 0.0, -1.0]
    assert entry.exit_status == 0 and entry.ok
    assert entry.wan_bytes == 1500 and entry.wan_bytes_by_link == {"dc1-dc2": 1500}
    assert "1.000 s per step (median of 3 steps after 1 warm-up), WAN 0.0 MB" in result_line(entry)


def test_variant_result_falls_back_to_wall_time(tmp_path: Path) -> None:
    entry = variant_result({}, report([rank(0, [{"hello": 1}]), rank(1, [], code=3)], ok=False,
                                      failure="rank 1 exited 3"), 1, tmp_path)
    assert entry.source == "wall" and entry.seconds_per_step == 12.5 and entry.step_s_median is None
    assert entry.exit_status == 3 and not entry.ok and entry.losses is None
    assert "12.500 s wall (rank 0 printed no step_s), WAN 0.0 MB; FAILED: rank 1 exited 3" in result_line(entry)


# ---------------------------------------------------------------------------- a whole run, faked


class FakeEmu:
    delay_backend = "fake"


@contextlib.contextmanager
def fake_network(scenario: ProgramScenario, progress: Any):
    yield FakeEmu()


def fake_launcher(times: dict[str, list[float]]):
    def launch(emu: Any, spec: Any, folder: Path) -> LaunchReport:
        assert isinstance(emu, FakeEmu)
        name = folder.name
        if name not in times:
            raise LaunchError("command not found: nothing")
        folder.mkdir(parents=True, exist_ok=True)
        metrics = [{"step": i, "step_s": s, "loss": 1.0} for i, s in enumerate(times[name])]
        return report([rank(0, metrics), rank(1, [])])
    return launch


def test_run_writes_a_program_summary(tmp_path: Path) -> None:
    scenario, resolved = load_any(SCENARIOS / "program-2dc.yaml")
    assert isinstance(scenario, ProgramScenario)
    summary = run_program_scenario(scenario, resolved, tmp_path, network=fake_network,
                                   launcher=fake_launcher({"gloo": [3.0, 2.0, 2.0], "atlas": [1.0, 0.5, 0.5]}))
    assert summary.delay_backend == "fake"
    back = ProgramSummary.model_validate_json((tmp_path / "summary.json").read_text())
    assert back.kind == "program" and list(back.variants) == ["gloo", "atlas"]
    gloo, atlas = back.result("gloo"), back.result("atlas")
    assert isinstance(gloo, ProgramVariantResult) and isinstance(atlas, ProgramVariantResult)
    assert gloo.seconds_per_step == 2.0 and atlas.seconds_per_step == 0.5
    assert gloo.env == {"ATLAS_STREAMS": "8", "BACKEND": "gloo"}
    assert (tmp_path / "scenario.resolved.yaml").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["definitions"]["seconds_per_step"].startswith("median")


def test_a_launch_error_is_the_variants_failure(tmp_path: Path) -> None:
    scenario, resolved = load_any(SCENARIOS / "program-2dc.yaml")
    summary = run_program_scenario(scenario, resolved, tmp_path, network=fake_network,
                                   launcher=fake_launcher({"gloo": [1.0, 1.0]}))
    assert isinstance(summary.variants["atlas"], VariantFailure)
    assert summary.variants["atlas"].error == "command not found: nothing"
    assert summary.failed() == ["atlas"]


def test_without_root_the_run_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    scenario, resolved = load_any(SCENARIOS / "program-2dc.yaml")
    with pytest.raises(RunnerError, match="a program scenario runs its program in the emulated hosts"):
        run_program_scenario(scenario, resolved, tmp_path, launcher=fake_launcher({}))


# ---------------------------------------------------------------------------- sweeps and reports


def program_runner(scenario: Any, resolved: dict[str, Any], out: Path, progress: Any) -> ProgramSummary:
    """A sweep runner with the fake network and launcher: gloo slows with the delay."""
    delay = scenario.topology.wan[0].delay
    times = {"gloo": [9.0] + [1.0 + 40 * delay] * 3, "atlas": [9.0] + [0.5 + 4 * delay] * 3}
    return run_program_scenario(scenario, resolved, out, progress, network=fake_network,
                                launcher=fake_launcher(times))


def test_sweep_of_a_program_reports_seconds_per_step(tmp_path: Path) -> None:
    from testbed.report import build_report
    from testbed.sweep import load_sweep, run_sweep

    plan = load_sweep(SCENARIOS / "sweep-rtt-program.yaml")
    assert [p.id for p in plan.points] == ["p001-delay=5ms", "p002-delay=25ms", "p003-delay=50ms",
                                           "p004-delay=100ms"]
    outcomes = run_sweep(plan, tmp_path / "sweep", runner=program_runner)
    assert [o.status for o in outcomes] == ["ok"] * 4
    rep = build_report(tmp_path / "sweep")
    rows = list(__import__("csv").DictReader((tmp_path / "sweep" / "results.csv").open()))
    assert len(rows) == 8 and {r["variant"] for r in rows} == {"gloo", "atlas"}
    by = {(r["topology.wan.0.delay"], r["variant"]): r for r in rows}
    assert float(by[("100ms", "gloo")]["seconds_per_step"]) == pytest.approx(5.0)
    assert float(by[("100ms", "atlas")]["seconds_per_step"]) == pytest.approx(0.9)
    assert float(by[("100ms", "gloo")]["atlas_speedup"]) == pytest.approx(5.0 / 0.9)
    names = {p.name for p in rep.plots}
    assert "step_time.png" in names and "atlas_speedup.png" in names
    assert "gloo s/step" in rep.table and "atlas s/step" in rep.table and "gloo/atlas" in rep.table
    assert "5.000" in rep.table


def test_report_of_one_program_run(tmp_path: Path) -> None:
    from testbed.report import build_report

    scenario, resolved = load_any(SCENARIOS / "program-2dc.yaml")
    run_program_scenario(scenario, resolved, tmp_path, network=fake_network,
                         launcher=fake_launcher({"gloo": [3.0, 2.0], "atlas": [1.0, 0.5]}))
    rep = build_report(tmp_path)
    assert rep.results.points[0].program is not None
    assert "gloo s/step" in rep.table and "2.000" in rep.table and "0.500" in rep.table


def test_cli_refuses_workload_options_for_a_program() -> None:
    from click.testing import CliRunner

    from testbed.commands.run import run

    res = CliRunner().invoke(run, [str(SCENARIOS / "program-2dc.yaml"), "--local"])
    assert res.exit_code != 0
    assert "names a program; --local: only for a workload scenario" in res.output
    res = CliRunner().invoke(run, [str(SCENARIOS / "program-2dc.yaml"), "--variants", "nccl"])
    assert "--variants: nccl not among the scenario's variants (gloo, atlas)" in res.output
