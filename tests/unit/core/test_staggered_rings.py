"""`staggered_rings_finish` and the DP all-reduce inside the DCs
(testbed_core/planning/prediction.py): the stages' rings start one after another and
share what the calibration's rings moved all at once, each at most what one moved
alone; numbers checked by hand."""

from __future__ import annotations

import pytest

from testbed_core.planning.network import NetParams
from testbed_core.planning.prediction import (
    Variant,
    lan_tensor_rate,
    predict,
    staggered_rings_finish,
)
from testbed_core.topology import parse_topology
from testbed_core.variants import REGISTRY
from testbed_core.workload import parse_workload


def test_rings_that_do_not_overlap_each_run_at_one_rings_rate() -> None:
    """Two rings of 1e8 bits, 1 s apart, 4e8 all at once, 2e8 alone: each alone 0.5 s."""
    assert staggered_rings_finish([0.0, 1.0], [1e8, 1e8], 4e8, 2e8) == pytest.approx([0.5, 1.5])


def test_overlapping_rings_share_the_aggregate() -> None:
    """Rings of 1e8 bits at 0 and 0.25 s, aggregate 2e8, alone 2e8: the first alone
    for 0.25 s (5e7 bits), then both at 1e8 each: the first ends 0.5 s later (0.75), the
    second has 5e7 left, alone at 2e8: 0.25 s more (1.0)."""
    assert staggered_rings_finish([0.0, 0.25], [1e8, 1e8], 2e8, 2e8) == pytest.approx([0.75, 1.0])


def test_rings_all_at_once_take_the_calibrated_time() -> None:
    """Three equal rings starting together, as the calibration ran them (3 x 8e8 = 2.4e9
    all at once): each at 8e8, whatever one moves alone; 1.6e9 bits take 2 s."""
    assert staggered_rings_finish([0.0] * 3, [1.6e9] * 3, 2.4e9, 1.6e9) == pytest.approx([2.0] * 3)
    assert staggered_rings_finish([5.0] * 3, [1.6e9] * 3, 2.4e9, 9e9) == pytest.approx([7.0] * 3)


def test_bad_figures_are_refused() -> None:
    assert staggered_rings_finish([], [], 1e8, 1e8) == []
    with pytest.raises(ValueError, match="2 ring starts but 1 volumes"):
        staggered_rings_finish([0.0, 1.0], [1e8], 1e8, 1e8)
    with pytest.raises(ValueError, match="must be positive"):
        staggered_rings_finish([0.0], [1e8], 0.0, 1e8)


def _one_dc(stages: int) -> tuple:
    topo = parse_topology({"name": "t", "dcs": [{"name": "a", "hosts": 2 * stages, "lan_rate": "100Gbit"},
                                                {"name": "b", "hosts": 1}],
                           "wan": [{"between": ["a", "b"], "rate": "1Gbit", "delay": "10ms"}]})
    wl = parse_workload({"name": "w", "model": {"layers": 4, "hidden": 1024, "heads": 8, "seq_len": 512,
                                                "vocab": 1000, "tied_embeddings": True},
                         "parallelism": {"dp": 2, "pp": stages, "num_micro_batches": 4, "schedule": "1f1b"},
                         "gpu": {"type": "A100", "efficiency": 0.5}})
    return topo, wl


def test_the_allreduce_inside_a_dc_follows_the_stages_ends() -> None:
    """dp=2, pp=2 in one DC: each stage's ring sends its gradients' bits once (2(dp-1)/dp
    = 1). Calibrated 2 rings at once at 1e9 each (2e9 in all), one alone at 2e9: the
    added time is the simulation of the two rings from their stages' last backwards,
    and below the rate-of-all-at-once figure (every ring at 1e9 from its end)."""
    topo, wl = _one_dc(2)
    eff = wl.effective()
    base = NetParams(lan_rate_bps=1e9)
    crowd = predict(topo, wl, Variant("x", 1, "shared", "atlas"), free={"a": 4, "b": 0}, net=base)
    staged = predict(topo, wl, Variant("x", 1, "shared", "atlas"), free={"a": 4, "b": 0},
                     net=NetParams(lan_rate_bps=1e9, lan_rings=2, lan_ring_alone_bps=2e9))
    bits = [eff.stage_params[k] * 2 * 8 for k in range(2)]  # bf16
    ends = {k: max(c.end for c in crowd.sim.compute if c.stage == k and c.kind == "B") for k in range(2)}
    makespan = crowd.pipeline_time_s
    assert crowd.allreduce_s == pytest.approx(max(ends[k] + bits[k] / 1e9 for k in range(2)) - makespan)
    want = max(staggered_rings_finish([ends[0], ends[1]], bits, 2e9, 2e9)) - makespan
    assert staged.allreduce_s == pytest.approx(want)
    assert staged.allreduce_s < crowd.allreduce_s
    # without the ring timed alone, the rings keep the all-at-once rate (the kept runs' model)
    same = predict(topo, wl, Variant("x", 1, "shared", "atlas"), free={"a": 4, "b": 0},
                   net=NetParams(lan_rate_bps=1e9, lan_rings=2))
    assert same.allreduce_s == pytest.approx(crowd.allreduce_s)


def test_pipeline_tensors_inside_a_dc_move_at_the_measured_rate_over_atlas_and_nominal_over_gloo() -> None:
    """A pipeline tensor between two stages in one DC: over atlas_transport at the
    calibration's LAN channel rate (the transport's own loop bounds it on the emulated
    LAN), through gloo's C++ pairs at the DC's nominal rate (held-back runs: 1 MiB in
    0.6-1.0 ms on 10 Gbit/s LANs, where the transport's rings measured 6-8 ms)."""
    topo, wl = _one_dc(2)
    net = NetParams(lan_rate_bps=1e9)
    nbytes = wl.effective().wire_activation_bytes
    for name, rate in (("baseline", 1e9), ("torch-gloo", 100e9)):
        variant = Variant.of(REGISTRY[name], baseline_placement="in-order")  # both stages in DC a
        pred = predict(topo, wl, variant, free={"a": 4, "b": 0}, net=net)
        lan = [t for t in pred.sim.transfers if not any(r.startswith("wan:") for r in t.resources)]
        assert lan, name
        assert min(t.end - t.start for t in lan) == pytest.approx(nbytes * 8 / rate, rel=1e-6), name
        assert lan_tensor_rate(topo, "a", variant, net) == rate
    assert lan_tensor_rate(topo, "a", Variant.of(REGISTRY["baseline"]), NetParams()) == 100e9  # nothing measured
