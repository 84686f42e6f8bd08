"""`testbed run` refuses an infeasible placement (pp over the GPUs, dp x pp over the
GPUs) before anything is built, naming the scenario file, as `testbed plan` names the
workload file (issue 32 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from testbed.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("pp", "dp"), [(8, 1), (2, 3)])
def test_run_refusal_names_the_scenario_file(tmp_path: Path, pp: int, dp: int) -> None:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["topology"] = str(ROOT / "topologies" / "2dc.yaml")
    data["workload"]["parallelism"].update(pp=pp, dp=dp)
    scenario = tmp_path / "too-big.yaml"
    scenario.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["run", str(scenario), "--local", "--variants", "baseline,atlas",
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code != 0, res.output
    assert f"{scenario}: this run cannot start (nothing was built)" in res.output
    for variant in ("baseline", "atlas"):
        assert (f"variant {variant}: {scenario}: workload.parallelism (pp={pp}, dp={dp}, tp=1) cannot be placed"
                in res.output)
