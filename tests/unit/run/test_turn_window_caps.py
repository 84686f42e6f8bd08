"""A temporal plan's turns capped to what their route takes without a tail drop
(testbed_core/planning/temporal.py `turn_window_caps`): one turn puts a whole tensor's
stripes in flight at once; where that exceeds the route's queue plus a quarter of its
bandwidth-delay product, each stream's receive window is clamped to its share, the clamp reaches
both ends of each channel crossing that direction, and the plan's prediction is the
same. Of the shipped scenarios only atlas-4dc's west-mid (a 2 MB tensor over 200 Mbit/s
x 40 ms with a one-BDP queue) is capped."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run.jobs import build_jobs
from testbed.run.ports import PortPlan
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, plan_variant
from testbed_core.contracts.worker_job import TransportJob
from testbed_core.planning.calibrated import LINK_GOODPUT
from testbed_core.planning.temporal import turn_flight_bytes, turn_window_caps
from testbed_core.variants import RunVariant, get_variant

ROOT = Path(__file__).resolve().parents[3]
MIB = 1 << 20
TRANSPORT = TransportJob(chunk_bytes=4 << 20, congestion=None, pacing_rate_mbps=None, connect_timeout_s=10.0)


def _atlas(name: str, overrides: dict | None = None):
    scenario, _ = load_scenario(ROOT / "scenarios" / f"{name}.yaml", overrides)
    return scenario, place_variants(scenario, [RunVariant(get_variant("atlas"))])["atlas"]


def test_atlas_4dc_is_capped_to_its_queues_and_a_quarter_bdp() -> None:
    scenario, placement = _atlas("atlas-4dc")
    topo = scenario.topology
    # west-mid: 200 Mbit/s x 40 ms = 1.0 MB, a queue as large; east-west 1.5 MB and as large
    assert turn_flight_bytes(topo, "west", "mid") == pytest.approx(1.25e6)
    assert turn_flight_bytes(topo, "east", "west") == pytest.approx(1.875e6)
    caps = turn_window_caps(topo, placement, 8, 2 * MIB)  # 2 MiB is 2.19 MB of frames
    west_mid, east_west = int(1.25e6 * LINK_GOODPUT / 8), int(1.875e6 * LINK_GOODPUT / 8)
    assert caps == {("west", "mid"): west_mid, ("mid", "west"): west_mid,
                    ("east", "west"): east_west, ("west", "east"): east_west}
    assert west_mid == 149_438
    # a tensor that fits west-mid's 1.25 MB of frames, or one stream (a 256 KB window): no cap
    assert turn_window_caps(topo, placement, 8, MIB) == {}
    assert turn_window_caps(topo, placement, 1, 2 * MIB) == {}


def test_a_short_queue_still_gets_a_bdp() -> None:
    """A queue under three quarters of a BDP: the cap keeps a BDP, or the link would idle."""
    scenario, _ = _atlas("atlas-4dc", {"topology.wan.1.queue": "200KB"})
    assert turn_flight_bytes(scenario.topology, "west", "mid") == pytest.approx(1.0e6)


def test_a_cap_never_goes_below_a_few_segments() -> None:
    scenario, placement = _atlas("atlas-4dc")
    caps = turn_window_caps(scenario.topology, placement, 128, 2 * MIB)
    assert caps[("west", "mid")] == 16 << 10


@pytest.mark.parametrize("name", ["atlas-2dc", "atlas-3dc", "lossy-4dc", "prefill-service-2dc"])
def test_the_other_shipped_scenarios_turns_fit(name: str) -> None:
    scenario, placement = _atlas(name)
    if isinstance(placement, Exception):
        pytest.skip(f"{name}: atlas not placed ({placement})")
    tensor = scenario.workload.effective(None).wire_activation_bytes
    assert turn_window_caps(scenario.topology, placement, 8, tensor) == {}, name


def test_one_stream_with_a_window_past_the_route_is_capped_too() -> None:
    """atlas-search-3dc's big-near (1 Gbit/s x 10 ms, a 1.25 MB queue) takes 1.5625 MB
    of a turn; one stream's 2 MB window (4 MB buffers) sends a 2 MiB tensor all at once."""
    scenario, placement = _atlas("atlas-search-3dc")
    share = int(1.5625e6 * LINK_GOODPUT)
    assert turn_window_caps(scenario.topology, placement, 1, 2 * MIB) == {("big", "near"): share, ("near", "big"): share}


def test_the_receiving_end_of_each_turn_clamps_and_the_prediction_is_unchanged(tmp_path: Path) -> None:
    scenario, _ = load_scenario(ROOT / "scenarios" / "atlas-4dc.yaml")
    setup = plan_variant("atlas", scenario, scenario.workload, None, None, None)
    share = int(1.25e6 * LINK_GOODPUT / setup.variant.streams)
    assert setup.sharing == "temporal" and setup.window_caps[("west", "mid")] == share
    assert setup.window_caps[("mid", "west")] == share
    ips = {f"{dc.name}-{h}": f"10.0.{i}.{j}" for i, dc in enumerate(scenario.topology.dcs)
           for j, h in enumerate(dc.hosts)}
    jobs = build_jobs(setup=setup, workload=scenario.workload, topology=scenario.topology, host_ips=ips,
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=3,
                      transport=TRANSPORT)
    ends = {(c.boundary, c.role): c.window_clamp for job in jobs.values() for c in job.channels}
    assert ends[(3, "listen")] == ends[(3, "connect")] == share  # west-mid
    assert ends[(1, "listen")] == ends[(1, "connect")] == int(1.875e6 * LINK_GOODPUT / 8)  # east-west
    assert ends[(0, "listen")] is None  # inside east
