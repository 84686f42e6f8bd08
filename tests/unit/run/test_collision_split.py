"""The collision probe's rounds reach the prediction (testbed/run/variants.py
`_split_shares`, testbed_core/planning/wan_paths.py `PathRates.collision_shares`,
testbed_core/planning/collisions.py): two shared channels colliding on an uncapped
link without loss split it as the probe's rounds did; a capped way, a lossy link and a
variant that crosses no collision keep the even split."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run.scenario import load_scenario
from testbed.run.variants import plan_variant
from testbed_core.contracts.calibration import Calibration, PathCalibration

ROOT = Path(__file__).resolve().parents[3]
NBYTES = 8 << 20
LAT = 0.025


def _cal(dcs: tuple[str, str], src: str, dst: str, first_s: float, last_s: float) -> Calibration:
    """One path timed alone and colliding: 8 streams at 7.3e8 alone, two channels each
    way in 12 rounds, the first of each round at `first_s`, the other at `last_s`."""
    rounds = 12
    way = [first_s] * rounds + [last_s] * rounds  # channel 0's rounds, then channel 1's
    mean = (first_s + last_s) / 2
    crowded = 2 * NBYTES * 8 / (mean - LAT)
    pc = PathCalibration(dcs=dcs, src=src, dst=dst, nbytes=NBYTES, latency_s=LAT,
                         transfer_s={1: [0.64] * 12, 8: [0.117] * 12},
                         rates_bps={1: 1.09e8, 8: 7.3e8}, colliding_bps={8: crowded},
                         colliding_s={8: way + way}, concurrent=2)
    cal = Calibration(src=src, dst=dst, nbytes=NBYTES, latency_s=LAT, paths=[pc])
    cal.mirror_primary()
    return cal


def _plan(scenario_file: str, variant: str, cal: Calibration, **changes):
    scenario, _ = load_scenario(ROOT / "scenarios" / scenario_file, changes or None)
    return plan_variant(variant, scenario, scenario.workload, scenario.workload_dir, cal, None)


def test_an_uncapped_collision_splits_as_the_probe_rounds_did() -> None:
    """atlas-2dc's multi-TCP: rounds ending at 0.19 and 0.22 s give the channel ahead
    8 MiB over 0.165 s of the 0.1825 s pace's total (0.553) each way; the prediction
    is faster than the even split's lockstep, which the same figures give with even
    rounds."""
    cal = _cal(("dc1", "dc2"), "dc1-h1", "dc2-h1", 0.19, 0.22)
    setup = _plan("atlas-2dc.yaml", "multi-tcp", cal)
    assert setup.variant.sharing == "shared" and not setup.window_caps
    link = setup.prediction.spec.resources["wan:dc1->dc2"]
    assert link.split_shares == pytest.approx([(0.22 - LAT + 0.19 - LAT) / 2 / (0.19 - LAT) / 2] * 12)
    assert setup.prediction.spec.resources["wan:dc2->dc1"].split_shares == link.split_shares
    even = _cal(("dc1", "dc2"), "dc1-h1", "dc2-h1", 0.205, 0.205)  # the same total, rounds that end together
    lockstep = _plan("atlas-2dc.yaml", "multi-tcp", even)
    assert set(lockstep.prediction.spec.resources["wan:dc1->dc2"].split_shares) == {0.5}
    assert setup.prediction.iteration_time_s < 0.97 * lockstep.prediction.iteration_time_s


def test_no_split_on_a_lossy_link_or_for_one_stream() -> None:
    cal = _cal(("dc1", "dc2"), "dc1-h1", "dc2-h1", 0.19, 0.22)
    lossy = _plan("atlas-2dc.yaml", "multi-tcp", cal, **{"topology.wan.0.loss": 0.001})
    assert lossy.prediction.spec.resources["wan:dc1->dc2"].split_shares == ()
    one = _plan("atlas-2dc.yaml", "baseline", cal)  # one stream: no collision of its count was timed
    assert one.prediction.spec.resources["wan:dc1->dc2"].split_shares == ()


def test_no_split_on_a_way_the_run_caps() -> None:
    """atlas-3dc's multi-TCP clamps each stream's window on big <-> mid (the shared way's
    caps): its collisions there stay even, whatever the probe's rounds."""
    cal = _cal(("big", "mid"), "big-h1", "mid-h1", 0.19, 0.22)
    setup = _plan("atlas-3dc.yaml", "multi-tcp", cal)
    assert setup.window_caps
    for (a, z) in setup.window_caps:
        res = setup.prediction.spec.resources.get(f"wan:{a}->{z}")
        assert res is None or res.split_shares == ()
