"""Atlas's sharing choice weighs plain multi-TCP's own way (testbed/run/variants.py
`_consider_configured_shared`): at 100 ms RTT a window-limited 8-stream channel
carries under half of the 1 Gbit/s link, so two pipelines' channels side by side
carry nearly twice what one carries alone, while the fill-the-link count (16 streams)
collides badly. Choosing the streams by one channel's rate and then the sharing at that
count picked the temporal plan there (sweep-rtt: atlas 32% slower than multi-tcp);
the choice now also predicts the configured streams on shared links and keeps the
fastest."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.run.calibration import Calibration
from testbed.run.scenario import load_scenario
from testbed.run.variants import plan_variant

ROOT = Path(__file__).resolve().parents[3]


def _scenario(tmp_path: Path, **sets: object):
    wl = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    wl["scale"] = 1.0
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "sharing", "topology": str(ROOT / "topologies/2dc.yaml"), "workload": wl,
                                    "variants": ["multi-tcp", "atlas"], "runner": {"dp_allreduce": False}}))
    scenario, _ = load_scenario(path, {"topology.wan.0.delay": "50ms", **sets})
    return scenario


def _cal(colliding_8: float) -> Calibration:
    """What the probe measured at 100 ms RTT (sweep-rtt, 2-core machine): one stream
    55 Mbit/s, 8 streams 472, 16 streams about as fast alone but colliding badly."""
    return Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.05,
                       rates_bps={1: 5.5e7, 8: 4.72e8, 16: 4.7e8}, colliding_bps={8: colliding_8, 16: 4.0e8})


def test_atlas_takes_multi_tcp_s_way_when_it_is_predicted_faster(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    cal = _cal(colliding_8=8.8e8)
    atlas = plan_variant("atlas", scenario, scenario.workload, None, cal, None)
    multi = plan_variant("multi-tcp", scenario, scenario.workload, None, cal, None)
    alts = atlas.sharing_alternatives
    assert set(alts) == {"temporal", "shared", "shared, 8 streams"}
    assert alts["temporal"] < alts["shared"]  # at its own 16 streams the plan beats sharing ...
    assert alts["shared, 8 streams"] < 0.97 * alts["temporal"]  # ... but 8 streams side by side beat both
    assert atlas.streams == 8 and atlas.sharing == "shared" and atlas.prediction.plan is None
    assert atlas.variant.streams == 8 and atlas.variant.sharing == "shared"
    assert atlas.prediction.iteration_time_s == pytest.approx(alts["shared, 8 streams"])
    assert atlas.prediction.iteration_time_s == pytest.approx(multi.prediction.iteration_time_s, rel=1e-6)
    assert atlas.colliding_bps == pytest.approx(8.8e8) and atlas.rate_bps == pytest.approx(4.72e8)


def test_atlas_keeps_its_plan_when_sharing_is_not_faster(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    atlas = plan_variant("atlas", scenario, scenario.workload, None, _cal(colliding_8=4.0e8), None)
    assert atlas.streams == 16 and atlas.sharing == "temporal" and atlas.prediction.plan is not None
    assert atlas.sharing_alternatives["shared, 8 streams"] > atlas.sharing_alternatives["temporal"]


def test_only_auto_weighs_it_and_only_with_a_measured_collision(tmp_path: Path) -> None:
    cal = _cal(colliding_8=8.8e8)
    forced = _scenario(tmp_path, **{"runner.atlas_sharing": "temporal"})
    setup = plan_variant("atlas", forced, forced.workload, None, cal, None)
    assert setup.streams == 16 and setup.sharing == "temporal" and setup.sharing_alternatives is None
    scenario = _scenario(tmp_path)
    unmeasured = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.05,
                             rates_bps={1: 5.5e7, 8: 4.72e8, 16: 4.7e8}, colliding_bps={16: 4.0e8})
    setup = plan_variant("atlas", scenario, scenario.workload, None, unmeasured, None)
    assert setup.streams == 16 and "shared, 8 streams" not in setup.sharing_alternatives
