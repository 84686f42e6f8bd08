"""Unpaced sockets (gloo's pairs, `NetParams.unpaced_bursts`): a tensor that fits its
channel's windows leaves as one burst and waits whole in the bottleneck's queue, so two
pipelines' tensors sent at once cross one after the other at the link's rate, the first
arriving a tensor's wire time before the second, instead of side by side at half the
rate each (both last). Tensors larger than the windows cross in window rounds and share
the link as before."""

from __future__ import annotations

import pytest

from testbed_core.planning.network import NetParams, wan_resource
from testbed_core.planning.placement import place
from testbed_core.planning.prediction import Variant, build_spec, predict
from testbed_core.topology import parse_topology
from testbed_core.workload import parse_workload


def topo(rmem: str):
    return parse_topology({
        "name": "t",
        "tcp": {"rmem_max": rmem, "wmem_max": rmem},
        "dcs": [{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": 2}],
        "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "30ms"}],
    })


WL = parse_workload({
    "name": "w",
    "model": {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 8192},
    "parallelism": {"dp": 2, "pp": 2, "num_micro_batches": 4, "micro_batch": 1, "schedule": "1f1b"},
    "gpu": {"type": "A100", "efficiency": 0.5},
})
GLOO = Variant("torch-gloo", 1, "shared", "even")
SPLIT = place({"dc1": 2, "dc2": 2}, 2, 2, 1, strategy="even")  # each pipeline: stage 0 in dc1, 1 in dc2
LINKS = (wan_resource("dc1", "dc2"), wan_resource("dc2", "dc1"))
# the paced probe's rate of one stream (what a paced calibration measures), under the link's
PACED_FLOW = 400e6


def spec(rmem: str, bursts: bool):
    net = NetParams(flow_rate_bps=PACED_FLOW, unpaced_bursts=bursts, allreduce=False)
    return build_spec(topo(rmem), WL, SPLIT, GLOO, WL.effective(), net)[0]


def test_the_tensors_fit_the_windows_here() -> None:
    assert WL.effective().wire_activation_bytes == 1 << 20  # 1 MiB; 4 MB x 0.66 holds it, 512 KB does not


def test_bursts_cross_first_come_first_served_at_the_link_rate() -> None:
    s = spec("4MB", bursts=True)
    for link in LINKS:
        assert s.resources[link].policy == "exclusive"
    chans = [r for name, r in s.resources.items() if name.startswith("chan:")]
    assert chans and all(r.capacity_bps == pytest.approx(1e9) for r in chans)  # not the paced 400 Mbit/s


def test_without_bursts_or_with_tensors_over_the_window_the_link_is_shared() -> None:
    for s in (spec("4MB", bursts=False), spec("512KB", bursts=True)):
        for link in LINKS:
            assert s.resources[link].policy == "shared"
        chans = [r for name, r in s.resources.items() if name.startswith("chan:")]
        assert all(r.capacity_bps == pytest.approx(PACED_FLOW) for r in chans)


def test_two_pipelines_first_tensors_arrive_one_wire_time_apart() -> None:
    net = NetParams(flow_rate_bps=PACED_FLOW, unpaced_bursts=True, allreduce=False)
    pred = predict(topo("4MB"), WL, GLOO, net=net, placement=SPLIT)
    first = sorted((t for t in pred.sim.transfers if t.key.mb == 0 and t.key.direction == "fwd"),
                   key=lambda t: t.end)
    assert len(first) == 2
    wire = (1 << 20) * 8 / 1e9
    assert first[0].end - first[0].start == pytest.approx(wire, rel=0.01)  # alone on the link
    assert first[1].end - first[0].end == pytest.approx(wire, rel=0.01)  # then the other, whole
    shared = predict(topo("4MB"), WL, GLOO, net=NetParams(flow_rate_bps=1e9, allreduce=False), placement=SPLIT)
    both = [t for t in shared.sim.transfers if t.key.mb == 0 and t.key.direction == "fwd"]
    assert all(t.end == pytest.approx(first[1].end, abs=1e-3) for t in both)  # side by side: both last
