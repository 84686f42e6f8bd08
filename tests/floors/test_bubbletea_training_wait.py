"""BubbleTea's promise to training, as a duration (root): in a short quickstart run with
prefill requests, training waits on prefill work for less than 0.2 s in all (a few late
wake-ups). How long a wake-up is late depends on the machine's load: asserted under
`make floors` (TESTBED_FLOOR_TESTS=1, on a quiet machine) and printed; the default suite
checks the same run for correctness (tests/root/test_bubbletea_run.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.constants import SCENARIOS_DIR

pytestmark = [pytest.mark.root, pytest.mark.floor, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_training_barely_waits_on_prefill(tmp_path: Path) -> None:
    scenario, resolved = load_scenario(SCENARIOS_DIR / "quickstart.yaml", {
        "variants": ["atlas"], "workload.warmup": 1, "workload.iterations": 2, "runner.calibrate": False,
        "runner.base_port": 39500, "bubbletea.requests.rate": 40, "runner.bubbletea_idle_twin": False,
    })
    run_scenario(scenario, resolved, tmp_path / "out", Progress(label="t", stream=io.StringIO(), tty=False))
    bt = json.loads((tmp_path / "out" / "summary.json").read_text())["variants"]["atlas+bubbletea"]
    assert "error" not in bt, bt.get("error")
    print(f"\ntraining waited {bt['training_wait_on_prefill_s']:.3f} s on prefill, slowdown "
          f"{bt['training_slowdown']:+.1%}")
    assert bt["training_wait_on_prefill_s"] < 0.2
