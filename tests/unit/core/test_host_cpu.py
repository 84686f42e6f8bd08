"""The tensor checks in the planner's stage times (testbed_core/planning/host_cpu.py):
each stage pays a fill for every tensor it sends and a check for every one it receives,
and the prediction of a verified run grows by them on its critical path."""

from __future__ import annotations

import math

import pytest

from testbed_core.planning.host_cpu import HostCost, compute_only, with_host_cost
from testbed_core.planning.prediction import Variant, predict
from testbed_core.topology import Topology
from testbed_core.workload import Workload

TOPOLOGY = {"name": "t", "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 2}],
            "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}]}
WORKLOAD = {"name": "w", "model": {"layers": 6, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 1000},
            "parallelism": {"dp": 1, "pp": 3, "micro_batch": 1, "num_micro_batches": 4},
            "gpu": {"type": "A100", "efficiency": 0.5}}


def test_each_stage_pays_a_fill_per_send_and_a_check_per_receive() -> None:
    eff = Workload.model_validate(WORKLOAD).effective()
    cost = HostCost(fill_s=0.002, check_s=0.005)
    got = with_host_cost(eff, cost)
    # forwards: stage 0 fills, the middle checks and fills, the last checks; backwards the other way
    for k, extra in enumerate((0.002, 0.007, 0.005)):
        assert math.isclose(got.stage_forward_s[k], eff.stage_forward_s[k] + extra)
    for k, extra in enumerate((0.005, 0.007, 0.002)):
        assert math.isclose(got.stage_backward_s[k], eff.stage_backward_s[k] + extra)
    assert with_host_cost(eff, None) is eff


def test_a_verified_run_is_predicted_slower_by_its_checks_on_the_critical_path() -> None:
    topo = Topology.model_validate(TOPOLOGY)
    wl = Workload.model_validate(WORKLOAD)
    variant = Variant("atlas", 4, "shared", "atlas")
    plain = predict(topo, wl, variant).iteration_time_s
    eff = with_host_cost(wl.effective(), HostCost(fill_s=0.002, check_s=0.005))
    checked = predict(topo, wl, variant, effective=eff).iteration_time_s
    # at least one fill and one check per boundary each way lie on the pipeline's path
    assert checked >= plain + 2 * 2 * (0.002 + 0.005) - 1e-9


def test_compute_only_takes_the_checks_back_out() -> None:
    eff = Workload.model_validate(WORKLOAD).effective()
    cost = HostCost(fill_s=0.002, check_s=0.005)
    back = compute_only(with_host_cost(eff, cost), cost)
    assert back.stage_forward_s == pytest.approx(eff.stage_forward_s, abs=1e-12)
    assert back.stage_backward_s == pytest.approx(eff.stage_backward_s, abs=1e-12)
    assert compute_only(eff, None) is eff
    with pytest.raises(ValueError, match="do not include the tensor checks"):
        compute_only(eff, HostCost(fill_s=10.0, check_s=10.0))  # stage times without the checks


def test_every_op_pays_the_devices_overhead_and_the_workers_hold_for_compute_alone() -> None:
    eff = Workload.model_validate(WORKLOAD).effective()
    cost = HostCost(fill_s=0.0, check_s=0.0, op_s=0.0003)
    got = with_host_cost(eff, cost)
    assert got.stage_forward_s == pytest.approx([t + 0.0003 for t in eff.stage_forward_s])
    assert got.stage_backward_s == pytest.approx([t + 0.0003 for t in eff.stage_backward_s])
    back = compute_only(got, cost)
    assert back.stage_forward_s == pytest.approx(eff.stage_forward_s, abs=1e-12)
    with pytest.raises(ValueError, match=r"the device's 300.00 ms an op"):
        compute_only(eff, HostCost(fill_s=0.0, check_s=0.0, op_s=0.3))


def test_the_cost_is_built_from_whichever_was_timed() -> None:
    from testbed_core.contracts.calibration import VerifyCalibration

    assert HostCost.of(None, None) is None and HostCost.of(None, 0.0) is None
    assert HostCost.of(None, 0.0002) == HostCost(0.0, 0.0, 0.0002)
    v = VerifyCalibration(nbytes=1000, fill_s=[0.002], check_s=[0.004])
    assert HostCost.of(v, None) == HostCost(0.002, 0.004, 0.0)
    assert HostCost.of(v, 0.0002) == HostCost(0.002, 0.004, 0.0002)
