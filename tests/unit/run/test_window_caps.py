"""Shared multi-stream channels capped to their share of a path (testbed/run/pacing.py
`window_caps`): where the channels that cross a WAN direction (one pipeline's or
several) may put more in flight than the path holds, each stream's receive window is clamped
to its share of what the path takes without a tail drop (its BDP and half its queue, as
frames); the cap reaches both ends of each channel (the end that receives clamps) and
the planner's window and per-flow rate. Of the shipped scenarios atlas-3dc's and
atlas-4dc's shared variants are capped, and atlas-search-3dc's multi-stream ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run.jobs import build_jobs
from testbed.run.pacing import (
    MIN_CAP_WINDOW,
    PACED_BURST,
    route_bottleneck,
    route_holds,
    route_takes,
    tensors_at_once,
    window_caps,
)
from testbed.run.ports import PortPlan
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, plan_variant
from testbed.training.worker.channels import transport_config
from testbed_core.contracts.worker_job import TransportJob
from testbed_core.topology import bdp_bytes
from testbed_core.variants import RunVariant, get_variant

ROOT = Path(__file__).resolve().parents[3]
MIB = 1 << 20
TRANSPORT = TransportJob(chunk_bytes=4 << 20, congestion=None, pacing_rate_mbps=None, connect_timeout_s=10.0)


def _placed(name: str, variant: str):
    scenario, _ = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    placement = place_variants(scenario, [RunVariant(get_variant(variant))])[variant]
    return scenario, placement


def test_atlas_3dc_multi_tcp_gets_each_path_s_share_of_what_it_takes_without_a_tail_drop() -> None:
    """What the route takes (`route_takes`): its queue and its BDP over PACED_BURST, as
    frames on the wire; the windows are payload (LINK_GOODPUT of a frame). No floor at a
    tensor's stripe: big-small's 128 KiB stripe was past its share and its queue
    overflowed."""
    scenario, placement = _placed("atlas-3dc", "multi-tcp")
    topo = scenario.topology
    assert PACED_BURST == 2.0
    # mid-big: 200 Mbit/s x 50 ms = 1.25 MB and a queue as large; 2 channels x 8 streams
    slow, rtt = route_bottleneck(topo, "mid", "big")
    assert slow.queue_bytes + bdp_bytes(slow.rate, rtt) == pytest.approx(2.5e6)  # what the route holds
    assert route_takes(topo, "mid", "big") == pytest.approx(1.25e6 + 1.25e6 / 2)
    caps = window_caps(topo, placement, 8, MIB, 3)
    assert caps[("mid", "big")] == caps[("big", "mid")] == int((1.25e6 + 1.25e6 / 2) * 1448 / 1514 / 16) == 112_078
    assert 16 * caps[("mid", "big")] * 1514 / 1448 <= route_takes(topo, "mid", "big")  # the frames fit
    # big-small: 100 Mbit/s x 80 ms = 1 MB, a 1 MB queue: 1.5 MB of frames for 16 streams
    assert caps[("big", "small")] == caps[("small", "big")] == 89_663 < MIB // 8
    assert window_caps(topo, placement, 1, MIB, 3) == {}  # one stream: 2 x 256 KB fit
    # one 0.5 MiB tensor a channel at once, 1.1 MB of frames, fits big-small's 1.5 MB: no cap there
    assert ("big", "small") not in window_caps(topo, placement, 8, MIB // 2, 1)


def test_a_cap_never_goes_below_a_few_segments() -> None:
    scenario, placement = _placed("atlas-3dc", "multi-tcp")
    assert MIN_CAP_WINDOW == 16 << 10
    assert window_caps(scenario.topology, placement, 64, MIB, 3)[("big", "small")] == MIN_CAP_WINDOW


def test_atlas_4dc_multi_tcp_is_capped_now_that_no_stripe_floor_lifts_the_cap_past_its_window() -> None:
    """2 MiB tensors, 4 at once under 1F1B (pp 5): 2 channels x 8 streams x 256 KB put
    4.3 MB of frames on each path against 1.8-2.3 MB; the old floor (a 256 KiB stripe,
    above the 256 KB window) left it uncapped, with 2,499-2,740 tail drops a run."""
    scenario, placement = _placed("atlas-4dc", "multi-tcp")
    caps = window_caps(scenario.topology, placement, 8, 2 * MIB, tensors_at_once(scenario.workload.parallelism))
    assert caps[("west", "mid")] == 89_663 and caps[("east", "west")] == 134_494


@pytest.mark.parametrize("name", ["atlas-2dc", "quickstart", "dp-2dc", "lossy-4dc", "real-tiny-2dc",
                                  "prefill-service-2dc"])
def test_the_other_shipped_scenarios_are_not_capped(name: str) -> None:
    scenario, _ = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    tensor = scenario.workload.effective(None).wire_activation_bytes
    for variant in ("multi-tcp", "atlas"):
        placement = place_variants(scenario, [RunVariant(get_variant(variant))])[variant]
        if isinstance(placement, Exception):
            continue
        assert window_caps(scenario.topology, placement, 8, tensor, tensors_at_once(scenario.workload.parallelism)) == {}, \
            (name, variant)


def test_one_channel_alone_on_a_path_is_capped_where_the_tensors_handed_at_once_overflow_it() -> None:
    """atlas-search-3dc on the baseline's placement: one pipeline, one channel each way
    between big and far. Three 2 MiB tensors handed at once (1F1B, pp 4) to 8 streams
    of 2.64 MB windows put 6.6 MB of frames on a path that holds 3 MB: capped to its
    share of what the path takes, as two pipelines' channels would be (held-line-pp6's
    multi-tcp dropped frames and ran far slower than predicted uncapped). One tensor at
    a time (2.2 MB of frames) fits: no cap."""
    scenario, _ = _placed("atlas-search-3dc", "atlas")
    placement = place_variants(scenario, [RunVariant(get_variant("baseline"))])["baseline"]
    topo = scenario.topology
    tensor = scenario.workload.effective(None).wire_activation_bytes
    at_once = tensors_at_once(scenario.workload.parallelism)
    assert placement.stage_dc == (("big", "big", "big", "far"),) and (at_once, tensor) == (3, 2 * MIB)
    assert at_once * tensor * 1514 / 1448 > route_holds(topo, "big", "far") == 3e6 > tensor * 1514 / 1448
    caps = window_caps(topo, placement, 8, tensor, at_once)
    assert caps == {("big", "far"): int(route_takes(topo, "big", "far") * 1448 / 1514 / 8),
                    ("far", "big"): int(route_takes(topo, "far", "big") * 1448 / 1514 / 8)}
    assert window_caps(topo, placement, 8, tensor, 1) == {}  # one 1 MiB tensor in flight fits


def test_tensors_that_fit_the_path_are_not_capped() -> None:
    """A stream has no more in flight than it was handed: 0.13 MB tensors (sequences
    of 256 on the paper sweep's links), three at once under 1F1B on 2 channels (0.82 MB
    of frames), fit what big-small takes (1.5 MB), so its shared variants keep their
    windows; GPipe's 8 back to back (2.2 MB) do not."""
    paper = {"topology.wan.0.delay": "100ms", "topology.wan.0.rate": "1Gbit", "topology.wan.2.delay": "65ms",
             "workload.model.seq_len": 256}
    scenario, _ = load_scenario(ROOT / "scenarios" / "atlas-3dc.yaml", paper)
    placement = place_variants(scenario, [RunVariant(get_variant("multi-tcp"))])["multi-tcp"]
    par = scenario.workload.parallelism
    tensor = scenario.workload.effective(None).wire_activation_bytes
    assert (par.schedule, par.pp, tensor) == ("1f1b", 4, 131_072)
    assert tensors_at_once(par) == 3
    assert window_caps(scenario.topology, placement, 8, tensor, 3) == {}
    gpipe = par.model_copy(update={"schedule": "gpipe"})
    assert tensors_at_once(gpipe) == par.num_micro_batches
    assert window_caps(scenario.topology, placement, 8, tensor, tensors_at_once(gpipe))[("big", "small")] == 89_663
    setup = plan_variant("multi-tcp", scenario, scenario.workload, None, None, None)
    assert setup.window_caps == {}


def test_the_receiving_end_of_each_channel_clamps_and_the_prediction_keeps_the_cap(tmp_path: Path) -> None:
    scenario, _ = load_scenario(ROOT / "scenarios" / "atlas-3dc.yaml")
    setup = plan_variant("multi-tcp", scenario, scenario.workload, None, None, None)
    assert setup.sharing == "shared" and setup.window_caps[("mid", "big")] == 112_078
    assert setup.prediction.paths[("mid", "big")].window_bytes == 112_078  # the planner's window too
    atlas = plan_variant("atlas", scenario, scenario.workload, None, None, None)
    assert atlas.sharing == "temporal" and atlas.window_caps == {}  # one transfer at a time on a link
    ips = {f"{dc.name}-{h}": f"10.0.{i}.{j}" for i, dc in enumerate(scenario.topology.dcs)
           for j, h in enumerate(dc.hosts)}
    jobs = build_jobs(setup=setup, workload=scenario.workload, topology=scenario.topology, host_ips=ips,
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=3,
                      transport=TRANSPORT)
    ends = {(c.boundary, c.role): c.window_clamp for job in jobs.values() for c in job.channels}
    # boundary 1 crosses mid->big: stage 2 (listen) receives the activations, stage 1 the gradients
    assert ends[(1, "listen")] == ends[(1, "connect")] == 112_078
    assert ends[(2, "listen")] == ends[(2, "connect")] == 89_663
    assert ends[(0, "listen")] is ends[(0, "connect")] is None  # inside mid
    boundary2 = next(c for job in jobs.values() for c in job.channels if c.boundary == 2)
    assert transport_config(TRANSPORT, boundary2.streams, boundary2.window_clamp).window_clamp == 89_663
