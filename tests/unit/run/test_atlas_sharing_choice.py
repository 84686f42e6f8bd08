"""Atlas's sharing choice at long RTTs (testbed/run/variants.py): at 100 ms RTT a
window-limited 8-stream channel carries under half of the 1 Gbit/s link, so two
pipelines' channels side by side carry twice what one carries alone (their windows
fill no queue), and the temporal plan, one at a time, wastes half the link. Two causes
made atlas pick the plan there (sweep-rtt: 15-32% slower than multi-tcp): the shared
prediction took the probe's lockstep collision (372 Mbit/s in all for two channels of
452) as what side-by-side channels carry (`calibrated_rates`), and the streams were
chosen by one channel's rate and the sharing only at that count
(`_consider_configured_shared` weighs multi-tcp's own count on shared links too)."""

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


def _cal(rate_8: float = 4.72e8, colliding_8: float = 3.72e8) -> Calibration:
    """What the probe measured at 100 ms RTT (sweep-rtt, 2-core machine): one stream
    55 Mbit/s, 8 streams 452-472 alone, 372 in all when two collide in lockstep;
    16 streams 600 alone (more than half the link) and colliding badly."""
    return Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.05,
                       rates_bps={1: 5.5e7, 8: rate_8, 16: 6.0e8}, colliding_bps={8: colliding_8, 16: 4.0e8})


def test_channels_that_fit_side_by_side_are_not_crowded(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, **{"transport.streams": 8})
    wl = scenario.workload
    multi = plan_variant("multi-tcp", scenario, wl, None, _cal(), None)
    # 2 x 472 Mbit/s fit in the 1 Gbit/s link's goodput: each keeps its own rate
    alone = plan_variant("multi-tcp", scenario, wl, None, _cal(colliding_8=9.44e8), None)
    assert multi.prediction.iteration_time_s == pytest.approx(alone.prediction.iteration_time_s)
    # 2 x 520 do not: the measured collision is what they carry together
    over = plan_variant("multi-tcp", scenario, wl, None, _cal(rate_8=5.2e8), None)
    assert over.prediction.iteration_time_s > 1.2 * multi.prediction.iteration_time_s


def test_atlas_shares_where_the_channels_fit_side_by_side(tmp_path: Path) -> None:
    """sweep-rtt's 100 ms point: atlas with 8 streams (16 measured slower) predicted
    the plan faster on the lockstep collision and ran 15% slower than multi-tcp."""
    scenario = _scenario(tmp_path)
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.05,
                      rates_bps={1: 5.35e7, 8: 4.52e8, 16: 3.63e8}, colliding_bps={8: 3.72e8})
    atlas = plan_variant("atlas", scenario, scenario.workload, None, cal, None)
    multi = plan_variant("multi-tcp", scenario, scenario.workload, None, cal, None)
    assert atlas.streams == 8 and atlas.sharing == "shared"
    assert atlas.sharing_alternatives["shared"] < 0.97 * atlas.sharing_alternatives["temporal"]
    assert atlas.prediction.iteration_time_s == pytest.approx(multi.prediction.iteration_time_s, rel=1e-6)


def test_atlas_takes_multi_tcp_s_way_when_it_is_predicted_faster(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    cal = _cal()
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
    assert atlas.colliding_bps == pytest.approx(3.72e8) and atlas.rate_bps == pytest.approx(4.72e8)


def test_atlas_keeps_its_plan_when_sharing_is_not_faster(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    atlas = plan_variant("atlas", scenario, scenario.workload, None, _cal(rate_8=5.2e8, colliding_8=3.0e8), None)
    assert atlas.streams == 16 and atlas.sharing == "temporal" and atlas.prediction.plan is not None
    assert atlas.sharing_alternatives["shared, 8 streams"] > atlas.sharing_alternatives["temporal"]


def test_only_auto_weighs_it_and_only_with_a_measured_collision(tmp_path: Path) -> None:
    cal = _cal()
    forced = _scenario(tmp_path, **{"runner.atlas_sharing": "temporal"})
    setup = plan_variant("atlas", forced, forced.workload, None, cal, None)
    assert setup.streams == 16 and setup.sharing == "temporal" and setup.sharing_alternatives is None
    scenario = _scenario(tmp_path)
    unmeasured = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.05,
                             rates_bps={1: 5.5e7, 8: 4.72e8, 16: 6.0e8}, colliding_bps={16: 4.0e8})
    setup = plan_variant("atlas", scenario, scenario.workload, None, unmeasured, None)
    assert setup.streams == 16 and "shared, 8 streams" not in setup.sharing_alternatives


def test_multi_tcp_s_way_keeps_its_window_caps_when_atlas_takes_it(tmp_path: Path) -> None:
    """The collision that predicts multi-TCP's way was timed with multi-TCP's window caps
    (calibration `variant_caps`): Atlas taking that way runs with them too, as its
    prediction assumed (before, it dropped them and ran uncapped: 4dc-regions GPipe ran
    8-11% faster than its prediction, multi-TCP within 1.4%)."""
    scenario = _scenario(tmp_path, **{"topology.tcp.rmem_max": "16MB", "topology.tcp.wmem_max": "16MB",
                                        "workload.parallelism.schedule": "gpipe"})
    cal = _cal()
    atlas = plan_variant("atlas", scenario, scenario.workload, None, cal, None)
    multi = plan_variant("multi-tcp", scenario, scenario.workload, None, cal, None)
    assert multi.window_caps  # GPipe hands 16 MB windows of 8 streams x 2 channels more than the route holds
    assert atlas.streams == 8 and atlas.sharing == "shared"
    assert atlas.window_caps == multi.window_caps
    assert atlas.prediction.iteration_time_s == pytest.approx(multi.prediction.iteration_time_s, rel=1e-6)
