"""Atlas's speedup in a short `testbed run` of scenarios/atlas-2dc.yaml (root): atlas's
iteration is shorter than baseline's, and its WAN goodput more than twice baseline's
(8 striped streams against one window-limited stream over 50 ms RTT). Timing on a
shared machine: asserted under `make floors` (TESTBED_FLOOR_TESTS=1, on a quiet
machine) and printed; the default suite checks the same run for correctness
(tests/root/test_run_2dc.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.constants import SCENARIOS_DIR

pytestmark = [pytest.mark.root, pytest.mark.floor, pytest.mark.slow]


@pytest.mark.timeout(400)
def test_atlas_is_faster_than_baseline_across_the_2dc_wan(tmp_path: Path) -> None:
    scenario, resolved = load_scenario(SCENARIOS_DIR / "atlas-2dc.yaml", {
        "workload.warmup": 1, "workload.iterations": 1, "variants": ["baseline", "atlas"],
        "runner.calibration_transfers": 2, "runner.base_port": 39000,
    })
    summary = run_scenario(scenario, resolved, tmp_path / "out", Progress(label="t", stream=io.StringIO(), tty=False))
    assert not summary.failed(), summary.variants
    base, atlas = summary.result("baseline"), summary.result("atlas")
    b_rate, a_rate = base.wan_links["dc1-dc2"].goodput_mbps, atlas.wan_links["dc1-dc2"].goodput_mbps
    print(f"\nbaseline {base.iteration_time_s:.3f} s/it, {b_rate:.0f} Mbit/s; atlas {atlas.iteration_time_s:.3f} s/it, "
          f"{a_rate:.0f} Mbit/s; speedup {base.iteration_time_s / atlas.iteration_time_s:.2f}x")
    assert b_rate > 50 and a_rate > 50
    assert atlas.iteration_time_s < base.iteration_time_s
    assert a_rate > 2 * b_rate
