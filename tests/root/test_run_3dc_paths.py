"""`testbed run` of scenarios/atlas-3dc.yaml, reduced (root): Atlas's placement differs
from the even one, and every WAN path the two placements cross is calibrated on its own
(summary.json `calibration.paths`), each variant predicted from its own paths' figures.
Eight workers and eight probe agents: about 6 minutes at load average 25 on 2 cores
(most of it processes importing torch), far less on an idle machine."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.contracts.summary import read_summary

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long  # 71 s quiet: make test-long
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atlas_3dc_reduced_calibrates_every_path(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/atlas-3dc.yaml", {
        "variants": ["baseline", "atlas"], "workload.warmup": 1, "workload.iterations": 1,
        "workload.parallelism.num_micro_batches": 2, "runner.dp_allreduce": False,
        "runner.calibration_transfers": 1, "runner.base_port": 39700,
    })
    out = tmp_path / "out"
    log = io.StringIO()
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    print(log.getvalue())
    assert read_summary(out / "summary.json") == summary
    assert not summary.failed(), summary.variants
    base, atlas = summary.result("baseline"), summary.result("atlas")
    assert [list(r) for r in atlas.placement.stage_dc] == [["big", "big", "big", "mid"]] * 2
    assert [list(r) for r in base.placement.stage_dc] == [["mid", "mid", "big", "small"]] * 2
    paths = {tuple(p.dcs): p for p in summary.calibration.paths}
    assert set(paths) == {("big", "mid"), ("mid", "big"), ("big", "small")} & set(paths) and len(paths) == 2
    mid_big = paths.get(("big", "mid")) or paths[("mid", "big")]
    assert list(paths)[0] == tuple(mid_big.dcs)  # Atlas's crossing first: the primary path
    assert set(mid_big.variants) == {"atlas", "baseline"} and paths["big", "small"].variants == ["baseline"]
    for p in paths.values():
        assert p.channel_rate_mbps["1"] > 0 and p.one_way_delay_s == pytest.approx(
            scenario.topology.path_delay(*p.dcs))
    assert summary.calibration.wall_s > 0
    assert namespaces() <= before  # nothing of the run is left behind
