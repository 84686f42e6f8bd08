"""The planner's loss-limited rate (Mathis et al.): one flow through a lossy WAN path is
held to MSS / RTT x 1.22 / sqrt(p), a calibrated (measured) rate included; N streams
get N times that, capped by the link; a loss-free path is left as it was."""

from __future__ import annotations

import math

import pytest

from testbed_core.constants import RMEM_FRACTION
from testbed_core.planning.network import MSS, NetParams, loss_limited_rate, wan_path
from testbed_core.topology import parse_topology


def _topo(loss: str | float = 0, delay: str = "25ms", rate: str = "400Mbit"):
    return parse_topology({"name": "t", "tcp": {"rmem_max": "4MB", "wmem_max": "4MB"},
                           "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}, {"name": "c", "hosts": 1}],
                           "wan": [{"between": ["a", "b"], "rate": rate, "delay": delay, "loss": loss},
                                   {"between": ["b", "c"], "rate": "10Gbit", "delay": "5ms"}]})


def test_the_formula_s_numbers() -> None:
    # 50 ms RTT, 0.1% loss: 1.22 x 1448 B x 8 / (0.05 s x sqrt(0.001)) = 8.94 Mbit/s
    assert loss_limited_rate(0.05, 0.001) == pytest.approx(8.937e6, rel=1e-3)
    # four times the loss halves it; twice the RTT halves it
    assert loss_limited_rate(0.05, 0.004) == pytest.approx(loss_limited_rate(0.05, 0.001) / 2)
    assert loss_limited_rate(0.1, 0.001) == pytest.approx(loss_limited_rate(0.05, 0.001) / 2)
    assert loss_limited_rate(0.05, 0.0) == math.inf and loss_limited_rate(0.0, 0.01) == math.inf


def test_a_lossy_path_s_flow_is_held_to_it_by_the_window_model() -> None:
    lossless = wan_path(_topo(), "a", "b", 1, NetParams())
    lossy = wan_path(_topo("0.1%"), "a", "b", 1, NetParams())
    assert lossless.flow_rate_bps == pytest.approx(4e6 * RMEM_FRACTION * 8 / 0.05)  # window-limited: 4 MB x 0.66 over 50 ms, 422 Mbit/s
    assert lossy.flow_rate_bps == pytest.approx(1.22 * MSS * 8 / (0.05 * math.sqrt(0.001)))


def test_a_measured_rate_is_held_to_it_too() -> None:
    measured = 30e6  # what a short calibration probe saw on one stream
    net = NetParams(path_flow_rate_bps={("a", "b"): measured})
    assert wan_path(_topo(), "a", "b", 1, net).flow_rate_bps == measured  # no loss: the measurement stands
    lossy = wan_path(_topo("0.1%"), "a", "b", 1, net)
    assert lossy.flow_rate_bps == pytest.approx(8.937e6, rel=1e-3) and lossy.measured
    below = NetParams(path_flow_rate_bps={("a", "b"): 5e6})  # measured below the bound: the measurement
    assert wan_path(_topo("0.1%"), "a", "b", 1, below).flow_rate_bps == 5e6


def test_streams_multiply_it_up_to_the_link() -> None:
    topo = _topo("0.1%")
    eight = wan_path(topo, "a", "b", 8, NetParams())
    assert eight.rate_bps == pytest.approx(8 * 8.937e6, rel=1e-3)
    many = wan_path(topo, "a", "b", 64, NetParams())
    assert many.rate_bps == topo.link("a", "b").rate  # 64 x 8.9 Mbit/s > 400 Mbit/s: the link's
    # fill-link policies take enough streams for the loss-limited flows to fill the link
    assert wan_path(topo, "a", "b", "auto", NetParams()).streams == math.ceil(400e6 / 8.937e6)


def test_loss_over_a_route_counts_every_link_and_the_whole_rtt() -> None:
    # a -> c crosses a-b (0.1%) and b-c (loss-free): p = 0.001, RTT = 2 x (25 + 5) ms
    path = wan_path(_topo("0.1%"), "a", "c", 1, NetParams())
    assert path.flow_rate_bps == pytest.approx(loss_limited_rate(0.06, 0.001))
