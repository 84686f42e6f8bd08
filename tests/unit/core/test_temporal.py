"""Temporal bandwidth sharing: the plan is complete, exclusive, derived from the
workload's sizes and times, reproducible when enforced, and no slower than sharing."""

from __future__ import annotations

import dataclasses

import pytest

from testbed_core.planning.network import NetParams, wan_resource
from testbed_core.planning.placement import place
from testbed_core.planning.prediction import Variant, build_spec
from testbed_core.planning.temporal import TemporalPlanError, derive_plan, stagger_candidates
from testbed_core.simulate import Resource, TransferKey, simulate
from testbed_core.topology import parse_topology
from testbed_core.workload import parse_workload

TOPO = parse_topology({
    "name": "t",
    "tcp": {"rmem_max": "1MB", "wmem_max": "1MB"},
    "dcs": [{"name": "dc1", "hosts": 4}, {"name": "dc2", "hosts": 4}],
    "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}],
})
LINKS = [wan_resource("dc1", "dc2"), wan_resource("dc2", "dc1")]


def workload(dp=4, pp=2, m=8, scale=0.1, micro_batch=2, schedule="1f1b"):
    return parse_workload({
        "name": "w",
        "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 50257},
        "parallelism": {"dp": dp, "pp": pp, "num_micro_batches": m, "micro_batch": micro_batch,
                        "schedule": schedule},
        "gpu": {"type": "A100", "efficiency": 0.5},
        "scale": scale,
    })


def spec_for(wl, strategy="atlas", free=None):
    par = wl.parallelism
    pl = place(free or {"dc1": 4, "dc2": 4}, par.pp, par.dp, par.tp, strategy=strategy)
    variant = Variant("atlas", "auto", "temporal", strategy, fill_link=True)
    spec, _ = build_spec(TOPO, wl, pl, variant, wl.effective(), NetParams())
    return spec


def test_plan_covers_every_wan_transfer_once_and_slots_never_overlap() -> None:
    wl = workload()
    plan = derive_plan(spec_for(wl), LINKS)
    par = wl.parallelism
    for link, direction in zip(LINKS, ("fwd", "bwd"), strict=True):
        keys = plan.tokens(link)
        assert len(keys) == len(set(keys)) == par.dp * par.num_micro_batches
        assert {k.direction for k in keys} == {direction}
        windows = [plan.slots[k] for k in keys]
        assert windows == sorted(windows)
        for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
            assert start >= end - 1e-12  # one transfer at a time
        assert {k.pipeline for k in keys} == set(range(par.dp))


def test_enforcing_the_plan_reproduces_it_and_beats_sharing() -> None:
    spec = spec_for(workload())
    plan = derive_plan(spec, LINKS)
    enforced = simulate(plan.apply(spec))
    assert enforced.makespan == pytest.approx(plan.predicted_iteration_s)
    for link in LINKS:
        assert enforced.order_on(link) == plan.tokens(link)
    shared = simulate(spec)  # the same streams, all pipelines sending when ready
    print(f"temporal {plan.predicted_iteration_s:.3f} s vs shared {shared.makespan:.3f} s")
    assert plan.predicted_iteration_s < shared.makespan


def test_slots_come_from_tensor_sizes_and_rates() -> None:
    small, big = (derive_plan(spec_for(workload(scale=s)), LINKS) for s in (0.05, 0.1))
    eff = workload(scale=0.1).effective()
    alone = eff.wire_activation_bytes * 8 / 1e9  # 13 streams fill the 1 Gbit/s link
    lengths = {round(end - start, 9) for start, end in big.slots.values()}
    assert lengths == {round(alone, 9)}
    k = big.tokens(LINKS[0])[0]
    s_small = small.slots[small.tokens(LINKS[0])[0]]
    assert (big.slots[k][1] - big.slots[k][0]) == pytest.approx(2 * (s_small[1] - s_small[0]), rel=1e-3)


def test_stagger_candidates_derive_from_the_workload() -> None:
    spec = spec_for(workload())
    cands = stagger_candidates(spec, set(LINKS))
    tx = workload().effective().wire_activation_bytes * 8 / 1e9
    assert 0.0 in cands and any(c == pytest.approx(tx) for c in cands)
    assert any(c == pytest.approx(max(spec.forward_s)) for c in cands)
    plan = derive_plan(spec, LINKS, candidates=[0.0, 0.5])
    assert [s for s, _ in plan.tried] == [0.0, 0.5]
    best = min(plan.tried, key=lambda x: x[1])
    assert plan.stagger_s == best[0] and plan.offsets == [i * best[0] for i in range(4)]


def test_single_pipeline_needs_no_stagger() -> None:
    spec = spec_for(workload(dp=1), free={"dc1": 1, "dc2": 1})
    assert stagger_candidates(spec, set(LINKS)) == [0.0]
    plan = derive_plan(spec, LINKS)
    assert plan.offsets == [0.0]
    assert plan.first_transfer_s(1)[0] == pytest.approx(spec.forward_s[0])


def test_slot_lookup_and_its_errors() -> None:
    plan = derive_plan(spec_for(workload(dp=2, m=2), free={"dc1": 2, "dc2": 2}), LINKS)
    key = plan.tokens(LINKS[0])[0]
    assert plan.slot(LINKS[0], key.pipeline, key.mb, "fwd") == plan.slots[key]
    assert plan.position(key) == {LINKS[0]: 0}
    with pytest.raises(TemporalPlanError, match=r"no plan for link direction 'wan:x->y' \(planned: wan:dc1->dc2, wan:dc2->dc1\)"):
        plan.slot("wan:x->y", 0, 0, "fwd")
    with pytest.raises(TemporalPlanError, match="no bwd transfer of pipeline 0, micro-batch 0 on wan:dc1->dc2"):
        plan.slot(LINKS[0], 0, 0, "bwd")
    doc = plan.to_json()
    assert doc["order"][LINKS[0]][0]["start_s"] == plan.slots[key][0]
    # round-robin over two DCs crosses dc1->dc2 at boundaries 0 and 2
    rr = derive_plan(spec_for(workload(dp=1, pp=4, m=4), strategy="round-robin"), LINKS)
    with pytest.raises(TemporalPlanError, match=r"crosses wan:dc1->dc2 at boundaries \[0, 2\]: pass boundary="):
        rr.slot(LINKS[0], 0, 0, "fwd")
    assert rr.slot(LINKS[0], 0, 0, "fwd", boundary=2)[0] > rr.slot(LINKS[0], 0, 0, "fwd", boundary=0)[0]


def test_unknown_links_are_refused() -> None:
    spec = spec_for(workload(dp=2, m=2), free={"dc1": 2, "dc2": 2})
    with pytest.raises(TemporalPlanError, match="are not resources of the simulation"):
        derive_plan(spec, ["wan:dc1->dc3"])


def test_apply_keeps_other_resources() -> None:
    spec = spec_for(workload(dp=2, m=2), free={"dc1": 2, "dc2": 2})
    plan = derive_plan(spec, LINKS)
    applied = plan.apply(spec)
    assert applied.resources[LINKS[0]].policy == "exclusive"
    assert applied.resources[LINKS[0]].order == tuple(plan.tokens(LINKS[0]))
    chans = [n for n in spec.resources if n.startswith("chan:")]
    assert chans and all(applied.resources[n] == spec.resources[n] for n in chans)
    assert spec.resources[LINKS[0]] == Resource(1e9)  # the input is not modified
    assert applied.offsets == plan.offsets and spec.offsets is None  # the plan's stagger, on a copy
    assert isinstance(plan.tokens(LINKS[1])[0], TransferKey)


def test_a_link_held_past_the_wire_delays_the_next_holder_not_the_receiver() -> None:
    """A link direction with hold_factor 3 (a planned transfer's token passes after its
    hold, 3x its time on the wire): the bytes arrive after their wire time and one
    latency, the next transfer on the link starts only when the hold ends, and the plan's
    slots are the holds (what the runner hands its senders)."""
    wl = workload(dp=2, m=2)
    spec = spec_for(wl, free={"dc1": 2, "dc2": 2})
    plan_spec = spec
    held = dataclasses.replace(spec, resources={
        n: (dataclasses.replace(r, hold_factor=3.0) if n in LINKS else r) for n, r in spec.resources.items()})
    plain, slow = derive_plan(plan_spec, LINKS), derive_plan(held, LINKS)
    run = simulate(slow.apply(held))
    keys = slow.tokens(LINKS[0])
    first, second = run.transfer(keys[0]), run.transfer(keys[1])
    wire = first.end - first.start
    assert wire == pytest.approx(wl.effective().wire_activation_bytes * 8 / 1e9)  # 13 streams fill the link
    assert first.arrival == pytest.approx(first.end + 0.025)  # the bytes do not wait for the hold
    assert first.held_until == pytest.approx(first.start + 3 * wire)
    assert second.start >= first.held_until - 1e-12  # the next holder does
    assert slow.slots[keys[0]] == pytest.approx((first.start, first.start + 3 * wire))
    assert all(e - s == pytest.approx(3 * wire) for s, e in slow.slots.values())
    assert all(t.released is None for t in simulate(plain.apply(plan_spec)).transfers)
    assert plain.predicted_iteration_s < slow.predicted_iteration_s
    # the plan's stagger candidates count a transfer's hold, not its wire time alone
    assert any(c == pytest.approx(3 * wire) for c in stagger_candidates(held, set(LINKS)))
