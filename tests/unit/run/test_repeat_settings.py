"""`runner.repeat`, `runner.bubbletea_idle_twin`, `runner.bubbletea_cpu_weight` and `_idle`:
defaults, `testbed run --repeat N`, and the messages of bad values."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.commands.run import run as run_command
from testbed.run.scenario import ScenarioError, load_scenario

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "atlas-2dc-bubbletea.yaml"


def test_defaults_one_repeat_idle_twin_and_a_small_agent_weight() -> None:
    scenario, _ = load_scenario(SCENARIO)
    r = scenario.runner
    assert r.repeat == 1 and r.bubbletea_idle_twin is True and r.bubbletea_cpu_weight == pytest.approx(0.1)
    assert r.bubbletea_cpu_idle is True  # agents yield every core training wants (testbed/run/cpu.py)


def test_overrides_set_them() -> None:
    scenario, resolved = load_scenario(SCENARIO, {"runner.repeat": 3, "runner.bubbletea_cpu_weight": None,
                                                  "runner.bubbletea_idle_twin": False,
                                                  "runner.bubbletea_cpu_idle": False})
    assert scenario.runner.repeat == 3 and scenario.runner.bubbletea_cpu_weight is None
    assert scenario.runner.bubbletea_cpu_idle is False
    assert resolved["runner"]["repeat"] == 3


@pytest.mark.parametrize(("key", "value", "message"), [
    ("runner.repeat", 0, r"runner.repeat: .*greater than or equal to 1"),
    ("runner.repeat", 21, r"runner.repeat: .*less than or equal to 20"),
    ("runner.bubbletea_cpu_weight", 0, r"runner.bubbletea_cpu_weight: .*greater than 0"),
    ("runner.bubbletea_cpu_weight", 2, r"runner.bubbletea_cpu_weight: .*less than or equal to 1"),
    ("runner.bubbletea_cpu_idle", "sometimes", r"runner.bubbletea_cpu_idle: .*valid boolean"),
])
def test_bad_values_name_the_field_and_the_bound(key: str, value: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as info:
        load_scenario(SCENARIO, {key: value})
    assert "atlas-2dc-bubbletea.yaml" in str(info.value)


def test_cli_repeat_zero_is_refused_before_anything_runs(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(SCENARIO), "--repeat", "0", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "--repeat" in res.output and "0 is not in the range x>=1" in res.output
    assert not (tmp_path / "out").exists()


def test_cli_repeat_above_the_bound_names_the_setting(tmp_path: Path) -> None:
    res = CliRunner().invoke(run_command, [str(SCENARIO), "--repeat", "50", "--out", str(tmp_path / "out")])
    assert res.exit_code == 1 and "runner.repeat" in res.output and "less than or equal to 20" in res.output
    assert not (tmp_path / "out").exists()
