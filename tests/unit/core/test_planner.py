"""Atlas planning (testbed_core/planning/): the DC-selection heuristic (and its
infeasible case), WAN paths and rates, the iteration-time model against closed forms,
and the variants as the registry defines them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed_core.constants import RMEM_FRACTION
from testbed_core.contracts.summary import Placement as SummaryPlacement
from testbed_core.planning.network import NetParams, wan_path
from testbed_core.planning.placement import PlacementError, free_gpus, place
from testbed_core.planning.prediction import Variant, choose_sharing, predict
from testbed_core.topology import load_topology, parse_topology
from testbed_core.variants import REGISTRY
from testbed_core.workload import load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[3]


def topo(delay: str = "25ms", rate: str = "1Gbit", hosts=(2, 2), rmem: str = "1MB", loss: float = 0.0,
         lan: str = "10Gbit"):
    return parse_topology({
        "name": "t",
        "tcp": {"rmem_max": rmem, "wmem_max": rmem},
        "dcs": [{"name": f"dc{i + 1}", "hosts": n, "lan_rate": lan} for i, n in enumerate(hosts)],
        "wan": [{"between": ["dc1", "dc2"], "rate": rate, "delay": delay, "loss": loss}],
    })


def workload(**par):
    p = {"dp": 1, "pp": 2, "num_micro_batches": 1, "schedule": "gpipe"}
    p.update(par)
    return parse_workload({
        "name": "w",
        "model": {"layers": 4, "hidden": 1024, "heads": 8, "seq_len": 512, "vocab": 1000},
        "parallelism": p,
        "gpu": {"type": "A100", "efficiency": 0.5},
    })


# ------------------------------------------------------------------ placement

def test_heuristic_fills_largest_dc_first_with_consecutive_stages() -> None:
    pl = place({"a": 4, "b": 8, "c": 2}, pp=5, dp=2, tp=1)
    # b: floor(8/2) = 4 stages (0-3), then a: floor(4/2) = 2, of which 1 is needed; c unused
    assert pl.stage_dc[0] == ("b", "b", "b", "b", "a")
    assert pl.stage_dc[1] == pl.stage_dc[0]  # DP replicas stay in the same DC
    assert pl.used() == {"b": 8, "a": 2}
    assert [(c.boundary, c.src, c.dst, c.pipelines) for c in pl.crossings()] == [(3, "b", "a", (0, 1))]


def test_heuristic_uses_tp_times_dp_and_breaks_ties_in_listed_order() -> None:
    pl = place({"x": 8, "y": 8}, pp=3, dp=2, tp=2)  # 4 GPUs per stage: 2 stages per DC
    assert pl.stage_dc[0] == ("x", "x", "y")
    pl = place({"x": 3, "y": 9}, pp=2, dp=1, tp=3)
    assert pl.stage_dc[0] == ("y", "y")


def test_infeasible_placement_names_the_shortfall() -> None:
    with pytest.raises(PlacementError) as info:
        place({"dc1": 5, "dc2": 3}, pp=4, dp=2, tp=1)
    msg = str(info.value)
    assert msg.startswith("infeasible")
    assert "each stage needs dp x tp = 2 x 1 = 2 GPUs in one DC" in msg
    assert "stages that fit per DC: dc1: 5 free -> 2, dc2: 3 free -> 1" in msg
    assert "only 3 of 4 stages fit, short by 1 stages of 2 GPUs" in msg
    assert "--gpus" in msg


def test_hosts_are_assigned_stage_major() -> None:
    pl = place({"dc1": 4, "dc2": 2}, pp=3, dp=2, tp=1, hosts={"dc1": ["h1", "h2", "h3", "h4"], "dc2": ["h1", "h2"]})
    assert pl.hosts[(0, 0)] == ("dc1-h1",) and pl.hosts[(1, 0)] == ("dc1-h2",)
    assert pl.hosts[(0, 1)] == ("dc1-h3",) and pl.hosts[(1, 2)] == ("dc2-h2",)
    pl = place({"dc1": 4}, pp=1, dp=2, tp=2, hosts={"dc1": ["a", "b"]}, gpus_per_host=2)
    assert pl.hosts[(0, 0)] == ("dc1-a", "dc1-a") and pl.hosts[(1, 0)] == ("dc1-b", "dc1-b")


def test_other_strategies() -> None:
    free = {"a": 2, "b": 8, "c": 4}
    assert place(free, 4, strategy="in-order").stage_dc[0] == ("a", "a", "b", "b")
    assert place(free, 4, strategy="even").stage_dc[0] == ("a", "a", "b", "c")
    assert place(free, 4, strategy="round-robin").stage_dc[0] == ("a", "b", "c", "a")
    assert len(place(free, 4, strategy="round-robin").crossings()) == 3
    # with chunks the last stage hands each back to the first: "even"'s c -> a is a third crossing
    assert [(c.src, c.dst) for c in place(free, 4, strategy="even", chunks=2).crossings()] == [
        ("a", "b"), ("b", "c"), ("c", "a")]
    assert len(place(free, 4, strategy="even").crossings()) == 2
    # the record says so, and a summary reads it back (testbed_core/contracts/summary.py)
    record = place(free, 4, strategy="even", chunks=2).to_json()
    assert record["wrap"] is True and place(free, 4, strategy="even").to_json()["wrap"] is False
    assert SummaryPlacement.model_validate(record).wrap is True
    dp = place({"a": 2, "b": 4, "c": 2}, 2, dp=3, strategy="dp-across")
    assert [row[0] for row in dp.stage_dc] == ["b", "a", "b"]  # whole pipelines, most free GPUs left first
    assert dp.crossings() == []
    with pytest.raises(PlacementError, match=r"the even placement puts more GPUs in a DC than it has \(a needs 3, has 2\)"):
        place(free, 9, strategy="even")
    with pytest.raises(PlacementError, match="each pipeline needs pp x tp = 2 x 1 = 2 GPUs .* short by 1 pipelines"):
        place({"a": 2, "b": 2}, 2, dp=3, strategy="dp-across")
    with pytest.raises(PlacementError, match="unknown placement strategy 'best'"):
        place(free, 2, strategy="best")


def test_free_gpus_from_topology_and_override() -> None:
    t = topo(hosts=(2, 3))
    assert free_gpus(t) == {"dc1": 2, "dc2": 3}
    assert free_gpus(t, gpus_per_host=4, override={"dc2": 1}) == {"dc1": 8, "dc2": 1}
    with pytest.raises(PlacementError, match=r"unknown DC 'dc9' \(DCs in topology t: dc1, dc2\)"):
        free_gpus(t, override={"dc9": 1})


def test_crossing_follows_lowest_latency_route() -> None:
    t = load_topology(ROOT / "topologies" / "3dc-triangle.yaml")
    pl = place({"dc1": 1, "dc3": 1, "dc2": 0}, pp=2, dp=1, tp=1, strategy="in-order")
    (c,) = pl.crossings(t)
    assert c.path == ("dc1", "dc2", "dc3")  # 10 + 15 ms beats the direct 40 ms
    wp = wan_path(t, "dc1", "dc3", 1, NetParams())
    assert wp.latency_s == pytest.approx(0.025) and wp.bottleneck_bps == 500e6
    assert wp.resources == ("wan:dc1->dc2", "wan:dc2->dc3")


# --------------------------------------------------------------- WAN rates

def test_per_flow_rate_is_window_over_rtt_and_streams_multiply() -> None:
    t = topo(rmem="1MB")
    one = wan_path(t, "dc1", "dc2", 1, NetParams())
    assert RMEM_FRACTION == 0.66
    assert one.flow_rate_bps == pytest.approx(0.66e6 * 8 / 0.05)  # 0.66 of 1 MB per 50 ms RTT = 105.6 Mbit/s
    assert one.rate_bps == pytest.approx(105.6e6)
    assert wan_path(t, "dc1", "dc2", 8, NetParams()).rate_bps == pytest.approx(844.8e6)
    assert wan_path(t, "dc1", "dc2", 64, NetParams()).rate_bps == 1e9  # capped by the link
    assert wan_path(t, "dc1", "dc2", "auto", NetParams()).streams == 10  # ceil(1000 / 105.6)
    assert wan_path(t, "dc1", "dc2", 4, NetParams(), fill_link=True).streams == 10
    assert wan_path(t, "dc1", "dc2", 1, NetParams(flow_rate_bps=107e6)).rate_bps == 107e6
    assert wan_path(t, "dc1", "dc2", 1, NetParams(rmem_fraction=1.0)).rate_bps == pytest.approx(160e6)


def test_a_measured_rate_keeps_the_channels_windows() -> None:
    """A measured rate is one transfer's alone: the channel still has only streams x
    window unacknowledged (the simulation holds back-to-back transfers to it); the
    window model's rate is window / RTT already, so no second limit there."""
    t = topo(rmem="1MB")
    measured = wan_path(t, "dc1", "dc2", 8, NetParams(flow_rate_bps=107e6))
    assert measured.window_bytes == pytest.approx(0.66e6) and measured.window_bits == pytest.approx(8 * 0.66e6 * 8)
    assert wan_path(t, "dc1", "dc2", 8, NetParams()).window_bits == math.inf


def test_a_capped_window_bounds_a_measured_rate() -> None:
    """The run's cap on shared channels' windows (path_window_bytes, testbed/run/pacing.py
    `window_caps`) holds each stream to a window a round trip, below the rate the
    calibration timed uncapped; a cap above the measured rate, or none, leaves it."""
    t = topo(rmem="1MB")
    capped = wan_path(t, "dc1", "dc2", 8, NetParams(flow_rate_bps=107e6, path_window_bytes={("dc1", "dc2"): 100_000}))
    assert capped.flow_rate_bps == pytest.approx(100_000 * 8 / 0.05)  # 16 Mbit/s a stream
    assert capped.window_bytes == 100_000
    other_way = wan_path(t, "dc2", "dc1", 8, NetParams(flow_rate_bps=107e6, path_window_bytes={("dc1", "dc2"): 100_000}))
    assert other_way.flow_rate_bps == 107e6
    wide = wan_path(t, "dc1", "dc2", 8, NetParams(flow_rate_bps=10e6, path_window_bytes={("dc1", "dc2"): 100_000}))
    assert wide.flow_rate_bps == 10e6


def test_streams_that_only_carry_stripes_keep_windows_of_two_stripes() -> None:
    """A channel whose streams only ever carry the workload's tensors (stripe_windows)
    keeps a window of at most STRIPE_WINDOW stripes per stream, which holds back tensors
    sent back to back (a GPipe burst: one transfer alone is not slowed); not on a lossy
    route (its loss model has its own windows), not without the tensor size."""
    from testbed_core.planning.network import STRIPE_WINDOW, stripe_window

    t = topo(rmem="1MB")
    net = NetParams(flow_rate_bps=107e6, stripe_windows=True)
    assert STRIPE_WINDOW == 2.0 and stripe_window(256 << 10, 8) == 64 << 10
    small = wan_path(t, "dc1", "dc2", 8, net, transfer_bytes=256 << 10)
    assert small.window_bytes == 64 << 10 and small.window_bits == 8 * (64 << 10) * 8
    big = wan_path(t, "dc1", "dc2", 8, net, transfer_bytes=8 << 20)  # 2 MiB stripes: the socket's 0.66 MB
    assert big.window_bytes == pytest.approx(0.66e6)
    assert wan_path(t, "dc1", "dc2", 8, net).window_bytes == pytest.approx(0.66e6)
    assert wan_path(t, "dc1", "dc2", 8, NetParams(flow_rate_bps=107e6), transfer_bytes=256 << 10).window_bytes \
        == pytest.approx(0.66e6)
    lossy = wan_path(topo(rmem="1MB", loss=0.001), "dc1", "dc2", 8, net, transfer_bytes=256 << 10)
    assert lossy.window_bytes == pytest.approx(0.66e6)


def test_loss_caps_a_flow_by_mathis() -> None:
    t = topo(rmem="64MB", loss=0.01)
    wp = wan_path(t, "dc1", "dc2", 1, NetParams())
    assert wp.flow_rate_bps == pytest.approx(1.22 * 1448 * 8 / (0.05 * math.sqrt(0.01)))


# ------------------------------------------------------------ iteration model

def test_one_microbatch_over_one_crossing_is_the_closed_form() -> None:
    t, wl = topo(), workload()
    eff = wl.effective()
    pred = predict(t, wl, Variant("x", 1, "shared", "even"))
    assert pred.placement.stage_dc[0] == ("dc1", "dc2")
    tx = eff.wire_activation_bytes * 8 / 105.6e6  # one stream: 0.66 x 1 MB per 50 ms RTT
    expected = sum(eff.stage_forward_s) + sum(eff.stage_backward_s) + 2 * (0.025 + tx)
    assert pred.pipeline_time_s == pytest.approx(expected, rel=1e-9)
    assert pred.allreduce_s == 0.0  # dp = 1
    assert pred.compute_only_s == pytest.approx(sum(eff.stage_forward_s) + sum(eff.stage_backward_s))
    assert pred.wan_bytes == {"wan:dc1->dc2": eff.wire_activation_bytes, "wan:dc2->dc1": eff.wire_activation_bytes}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_zero_delay_fast_wan_gives_textbook_bubble(schedule: str) -> None:
    t = topo(delay="0ms", rate="10Tbit", rmem="1GB", lan="10Tbit")
    for pp, m in [(2, 6), (4, 8)]:
        wl = parse_workload({
            "name": "w", "model": {"layers": 8, "hidden": 1024, "heads": 8, "seq_len": 512, "vocab": 8,
                                   "tied_embeddings": True},
            "parallelism": {"pp": pp, "num_micro_batches": m, "schedule": schedule},
            "gpu": {"type": "H100"},
        })
        pred = predict(t, wl, Variant("x", 8, "shared", "even"), free={"dc1": 4, "dc2": 4})
        assert pred.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), abs=0.03)


def test_variants_rank_as_atlas_expects_on_the_2dc_example() -> None:
    t = load_topology(ROOT / "topologies" / "2dc.yaml")
    wl = load_workload(ROOT / "scenarios" / "workloads" / "gpt-1.3b.yaml")
    preds = {name: predict(t, wl, Variant.of(d)) for name, d in REGISTRY.items()}
    it = {n: p.iteration_time_s for n, p in preds.items()}
    assert it["atlas"] <= it["multi-tcp"] < it["baseline"]
    assert preds["atlas"].plan is not None
    # keeping DP inside the DCs: dp-across-dc pays a WAN all-reduce
    assert preds["dp-across-dc"].allreduce_s > 10 * preds["atlas"].allreduce_s
    assert it["dp-across-dc"] > it["atlas"]
    for p in preds.values():
        assert p.iteration_time_s >= p.compute_only_s
        assert p.iteration_time_s == pytest.approx(p.pipeline_time_s + p.allreduce_s)
    no_ar = predict(t, wl, Variant.of(REGISTRY["atlas"]), net=NetParams(allreduce=False))
    assert no_ar.iteration_time_s == pytest.approx(no_ar.pipeline_time_s)


def test_more_delay_never_helps() -> None:
    wl = workload(num_micro_batches=4, dp=2, schedule="1f1b")
    times = [predict(topo(delay=d), wl, Variant.of(REGISTRY["multi-tcp"])).iteration_time_s
             for d in ("1ms", "10ms", "40ms")]
    assert times == sorted(times) and times[0] < times[-1]


def test_json_carries_placement_and_paths() -> None:
    t = topo()
    pred = predict(t, workload(dp=2), Variant.of(REGISTRY["atlas"]))
    doc = pred.to_json(t)
    assert doc["placement"]["stage_dc"] == [["dc1", "dc2"], ["dc1", "dc2"]]
    assert doc["placement"]["wan_crossings"][0]["path"] == ["dc1", "dc2"]
    assert doc["wan_paths"][0]["streams"] == 10
    assert doc["temporal_plan"]["order"]


def test_auto_sharing_keeps_the_plan_only_where_it_is_predicted_to_pay() -> None:
    """One stream per channel cannot fill the link: holding it for one transfer at a
    time wastes what the other pipeline could use, so "auto" shares it; with enough
    streams to fill the link the temporal plan is kept. Both predictions are kept."""
    t = topo(rmem="4MB")  # one flow ~640 Mbit/s of the 1 Gbit/s link
    wl = workload(num_micro_batches=4, dp=2, schedule="1f1b")
    one = predict(t, wl, Variant("one", 1, "auto", "atlas"))
    forced = predict(t, wl, Variant("one", 1, "temporal", "atlas"))
    shared = predict(t, wl, Variant("one", 1, "shared", "atlas"))
    assert one.sharing == "shared" and one.plan is None
    assert one.sharing_alternatives == pytest.approx({"temporal": forced.pipeline_time_s,
                                                      "shared": shared.pipeline_time_s})
    assert one.iteration_time_s == pytest.approx(shared.iteration_time_s)
    assert forced.sharing == "temporal" and shared.sharing_alternatives is None
    atlas = predict(t, wl, Variant.of(REGISTRY["atlas"]))
    assert atlas.sharing == "temporal" and atlas.plan is not None
    assert atlas.sharing_alternatives["temporal"] <= atlas.sharing_alternatives["shared"]
    doc = one.to_json(t)
    assert doc["sharing"] == "shared" and doc["sharing_requested"] == "auto"
    assert doc["temporal_plan"] is None and set(doc["sharing_alternatives_s"]) == {"temporal", "shared"}


def test_choose_sharing_prefers_the_plan_within_the_margin() -> None:
    assert choose_sharing(1.0, 0.98) == "temporal"
    assert choose_sharing(1.0, 0.96) == "shared"
    assert choose_sharing(1.0, 1.5) == "temporal"
    assert choose_sharing(1.0, 0.9, margin=0.2) == "temporal"


def test_variants_of_the_registry() -> None:
    table = {name: Variant.of(d, streams=4, baseline_placement="in-order") for name, d in REGISTRY.items()}
    assert list(table) == list(REGISTRY)
    assert table["baseline"] == Variant("baseline", 1, "shared", "in-order")
    assert table["multi-tcp"] == Variant("multi-tcp", 4, "shared", "in-order")
    assert table["atlas"] == Variant("atlas", 4, "auto", "atlas", fill_link=True)
    assert table["dp-across-dc"] == Variant("dp-across-dc", 1, "shared", "dp-across")  # one stream per flow


def test_single_stream_rings_sharing_a_link_get_no_more_than_their_windows() -> None:
    """dp-across-dc: each ring is one window-limited TCP stream; rings colliding on a WAN
    link together move at most their number times one stream's rate, however fast the
    link, so the all-reduce slows as the RTT grows (the paper's trend)."""
    from testbed_core.planning.prediction import predict
    from testbed_core.topology import parse_topology
    from testbed_core.workload import parse_workload

    wl = parse_workload({
        "name": "w", "model": {"name": "m", "layers": 8, "hidden": 1024, "heads": 16, "seq_len": 512,
                               "vocab": 4096, "dtype": "bf16"},
        "parallelism": {"dp": 2, "pp": 2, "tp": 1, "micro_batch": 1, "num_micro_batches": 4},
        "gpu": {"type": "A100", "efficiency": 0.5}})
    times = {}
    for delay in ("10ms", "100ms"):
        topo = parse_topology({"name": "t", "tcp": {"rmem_max": "512KB", "wmem_max": "512KB"},
                               "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
                               "wan": [{"between": ["a", "b"], "rate": "1Gbit", "delay": delay}]})
        variant = Variant.of(REGISTRY["dp-across-dc"], streams=8)
        assert variant.streams == 1
        p = predict(topo, wl, variant)
        times[delay] = p.iteration_time_s
    assert times["100ms"] > 5 * times["10ms"], times


def test_gloo_sends_wait_for_the_receivers_posted_receive() -> None:
    """gloo's pairs send an unbound buffer only after the peer's recv-ready notice: with
    one micro-batch, stage 1 posts its receive at 0, its notice reaches stage 0 one
    latency later, so the activation leaves at max(forward, latency); the gradient's
    receive was posted long before it is sent. atlas_transport sends at once."""
    t, wl = topo(), workload()
    eff = wl.effective()
    plain = predict(t, wl, Variant("baseline", 1, "shared", "even"))
    gloo = predict(t, wl, Variant("torch-gloo", 1, "shared", "even"))
    assert not plain.variant.rendezvous and gloo.variant.rendezvous and gloo.spec.rendezvous
    wait = max(0.0, 0.025 - eff.stage_forward_s[0])
    assert wait > 0
    assert gloo.pipeline_time_s == pytest.approx(plain.pipeline_time_s + wait, rel=1e-9)
    first = gloo.sim.transfer(next(s.key for s in gloo.sim.transfers if s.key.direction == "fwd"))
    assert first.ready == pytest.approx(eff.stage_forward_s[0]) and first.start == pytest.approx(0.025)


def test_gloo_rendezvous_costs_grow_with_latency_in_1f1b() -> None:
    wl = workload(pp=4, num_micro_batches=8, schedule="1f1b")
    gaps = []
    for delay in ("5ms", "50ms"):
        t = topo(delay=delay, hosts=(2, 2))
        plain = predict(t, wl, Variant("baseline", 1, "shared", "even"))
        gloo = predict(t, wl, Variant("torch-gloo", 1, "shared", "even"))
        assert gloo.pipeline_time_s >= plain.pipeline_time_s - 1e-9
        gaps.append(gloo.pipeline_time_s - plain.pipeline_time_s)
    assert gaps[1] > gaps[0] > 0
