"""How many untimed tensors at once a calibration probe hands each channel
(testbed/run/pacing.py `probe_burst`): as many as the schedule hands a run's channel
(`tensors_at_once`), fewer where its channels would put more in flight each way than the
route holds (`route_holds`): held-far-pp4's one channel a way takes 1F1B's three, two
uncapped 8-stream channels on atlas-3dc's big-small path one, the same capped ones
three; inside a DC nothing bounds it."""

from __future__ import annotations

from pathlib import Path

from testbed.run.pacing import probe_burst, route_holds
from testbed_core.planning.calibrated import LINK_GOODPUT
from testbed_core.topology import load_topology

ROOT = Path(__file__).resolve().parents[3]
MB = 1_048_576


def test_a_burst_that_fits_the_route_is_handed_whole() -> None:
    far = load_topology(ROOT / "results" / "held-back" / "2dc-far.yaml")
    assert 3 * MB / LINK_GOODPUT < route_holds(far, "dc1", "dc2")  # 300 Mbit/s, 150 ms: 5.6 MB and its queue
    one_way = [("dc1", "dc2", 1, None)]
    assert probe_burst(far, one_way, MB, 3) == 3
    assert probe_burst(far, one_way + [("dc2", "dc1", 1, None)], MB, 3) == 3  # duplex: each way its own
    assert probe_burst(far, one_way, MB, 1) == 1
    assert probe_burst(far, [("dc1", "dc1", 1, None)] * 4, 64 * MB, 8) == 8  # inside a DC: no route


def test_a_burst_that_would_overflow_the_route_is_cut_to_what_it_holds() -> None:
    topo = load_topology(ROOT / "topologies" / "3dc-unequal.yaml")
    holds = route_holds(topo, "big", "small")
    colliding = [("big", "small", 8, None)] * 2  # uncapped: the streams' windows are the buffers'
    k = probe_burst(topo, colliding, MB, 3)
    assert k < 3
    assert k == 1 or 2 * k * MB / LINK_GOODPUT <= holds  # the most that fits, at least one
    assert 2 * (k + 1) * MB / LINK_GOODPUT > holds or k + 1 > 3
    # the same channels capped as the run caps them: their windows bound the flight
    capped = [("big", "small", 8, 90_000)] * 2
    assert 2 * 8 * 90_000 / LINK_GOODPUT <= holds
    assert probe_burst(topo, capped, MB, 3) == 3
    # one direction over is enough to cut it
    assert probe_burst(topo, colliding + [("small", "big", 8, 90_000)] * 2, MB, 3) == k
