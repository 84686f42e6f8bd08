"""The turns probe and its use (testbed/run/calibration.py `calibrate_turns`,
`calibrate_variants`; testbed_core/contracts/calibration.py `TurnsCalibration`;
testbed_core/planning/wan_paths.py `path_rates_of`; testbed/run/variants.py): a path a
temporal plan crosses is timed as the plan uses it (cold channels taking turns, each
way), and the plan's slots take the holds it measured, each way, where it was timed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.calibration import path_uses
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, plan_variant, predict_variant, run_variants
from testbed_core.contracts.calibration import (
    TURNS_MAX_UNTIMED,
    Calibration,
    CalibrationReport,
    PathCalibration,
    TurnsCalibration,
    dc_of_host,
)

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "atlas-4dc.yaml"
NBYTES = load_scenario(SCENARIO)[0].workload.effective(None).wire_activation_bytes
BITS = NBYTES * 8
ALONE_S = 0.03 + BITS / 3e8  # one 8-stream transfer timed alone: 30 ms one way, 300 Mbit/s


def _scenario(**changes):
    scenario, _ = load_scenario(SCENARIO, changes or None)
    return scenario


def _cal(turns: dict[tuple[str, str], tuple[float, float]] | None = None) -> Calibration:
    """atlas-4dc's three paths at 300 Mbit/s for 8 streams (30 ms one way), and, per path
    in `turns`, a turns probe whose transfers took (forward, return) seconds."""
    def path(dcs, src, dst):
        pc = PathCalibration(dcs=dcs, src=src, dst=dst, nbytes=NBYTES, latency_s=0.03,
                             rates_bps={1: 3e7, 8: 3e8}, colliding_bps={8: 2.4e8}, concurrent=2,
                             transfer_s={1: [0.03 + BITS / 3e7], 8: [ALONE_S]})
        if turns and dcs in turns:
            ahead, back = turns[dcs]
            pc.turns = [TurnsCalibration(streams=8, channels=2, slot_s=(ALONE_S - 0.03) * 1.2, untimed=4,
                                         transfer_s=[ahead] * 4, return_s=[back] * 4)]
        return pc
    paths = [path(("east", "west"), "east-h3", "west-h1"), path(("west", "mid"), "west-h3", "mid-h1"),
             path(("mid", "edge"), "mid-h1", "edge-h1")]
    cal = Calibration(src="east-h3", dst="west-h1", nbytes=NBYTES, latency_s=0.03, paths=paths)
    cal.mirror_primary()
    return cal


def test_calibrate_turns_times_cold_channels_taking_turns_each_way(tmp_path: Path, monkeypatch) -> None:
    import testbed.run.calibration as calibration

    runs: list[dict] = []

    class FakeProber:
        def __init__(self, *a, **k) -> None:
            self.agents = None

        def run(self, pairs, streams, nbytes, count, label="", period_s=None, offsets=None, warm=True):
            runs.append({"pairs": list(pairs), "streams": streams, "count": count, "period": period_s,
                         "offsets": list(offsets or []), "warm": warm})
            out = []
            for a, _ in pairs:  # the untimed first tensors slow (1 s), then 200 ms ahead and 300 ms back
                d = 0.2 if dc_of_host(a) == "east" else 0.3
                out.append(calibration.ProbeTimes([0.0] * count, [1.0] * (count - 6) + [d] * 6))
            return out

    monkeypatch.setattr(calibration, "Prober", FakeProber)
    cal = _cal()
    pc = cal.paths[0]
    pairs = [("east-h3", "west-h1"), ("east-h4", "west-h2")]
    scenario = _scenario(**{"workload.warmup": 1, "workload.parallelism.num_micro_batches": 3,
                            "runner.base_port": "29500"})
    calibration.calibrate_turns(None, scenario, tmp_path, "s", pairs, 8, pc, Progress(label="t", tty=False),
                                agents=object())
    (run,) = runs
    slot = (ALONE_S - 0.03) * (1 + scenario.runner.token_margin)
    untimed = 3  # one warm-up iteration's tensors, and the cap
    assert untimed == TURNS_MAX_UNTIMED
    assert run["pairs"] == [*pairs, ("west-h1", "east-h3"), ("west-h2", "east-h4")]  # both ways at once
    assert run["warm"] is False and run["count"] == untimed + 6  # cold: no warm-up tensor
    assert run["offsets"] == pytest.approx([0, 2 * slot, 0, 2 * slot]) and run["period"] == pytest.approx(4 * slot)
    (fig,) = pc.turns
    assert (fig.streams, fig.channels, fig.untimed, fig.slot_s) == (8, 2, untimed, pytest.approx(slot))
    assert fig.transfer_s == [0.2] * 12 and fig.return_s == [0.3] * 12  # the untimed ones left out
    back = Calibration.from_report(CalibrationReport.model_validate(cal.report().model_dump()))
    assert back.paths[0].turns_for(8) == fig and back.paths[0].turns_for(1) is None
    assert "turns" in cal.report().method
    # real devices' workers warm their WAN channels with the calibration's tensor: so does the probe
    real, _ = load_scenario(ROOT / "scenarios" / "real-tiny-2dc.yaml", {"runner.base_port": "29500"})
    assert real.workload.gpu.mode == "real"
    calibration.calibrate_turns(None, real, tmp_path, "s", pairs, 8, pc, Progress(label="t", tty=False),
                                agents=object())
    assert runs[-1]["warm"] is True
    # its 2 warm-up iterations of 4 micro-batches carry 8 tensors: the probe sends the cap's untimed first
    assert real.workload.warmup * real.workload.parallelism.num_micro_batches == 8
    assert runs[-1]["count"] == TURNS_MAX_UNTIMED + 6 and pc.turns_for(8).untimed == TURNS_MAX_UNTIMED


def test_calibrate_turns_skips_a_count_the_alone_probe_did_not_time(tmp_path: Path, monkeypatch) -> None:
    import testbed.run.calibration as calibration

    monkeypatch.setattr(calibration, "Prober", lambda *a, **k: pytest.fail("probed without a planned hold"))
    pc = _cal().paths[0]
    calibration.calibrate_turns(None, _scenario(**{"runner.base_port": "29500"}), tmp_path, "s", [("east-h3", "west-h1")], 4, pc,
                                Progress(label="t", tty=False), agents=object())
    assert pc.turns == []


def test_the_calibration_times_turns_for_the_plans_counts_on_the_paths_atlas_crosses(tmp_path: Path, monkeypatch,
                                                                                        no_probe_agents) -> None:
    """calibrate_variants on atlas-4dc (probes recorded, not run): the turns probe runs on
    Atlas's two paths with its two pipelines' channels, at each count it may plan with
    (1 and 8 streams), not on the path only shared variants cross; none with shared
    sharing requested."""
    import testbed.run.calibration as calibration

    def plays(**changes) -> list[tuple]:
        calls: list[tuple] = []

        def fake_calibrate(net, scenario, folder, secret, pairs, counts, nbytes, latency, progress, pc, agents,
                           caps=None):
            for n in counts:
                pc.rates_bps = {**pc.rates_bps, n: 1e8 if n == 1 else 3e8}
            return pc

        def fake_turns(net, scenario, folder, secret, pairs, n, pc, progress, agents):
            calls.append((pc.dcs, len(pairs), n))
            pc.turns = [*pc.turns, TurnsCalibration(streams=n, channels=len(pairs), slot_s=0.1, untimed=0,
                                                    transfer_s=[0.2], return_s=[0.2])]

        monkeypatch.setattr(calibration, "calibrate", fake_calibrate)
        monkeypatch.setattr(calibration, "calibrate_turns", fake_turns)
        for name in ("calibrate_link", "calibrate_wan_rings", "calibrate_lan", "calibrate_together", "calibrate_one_way"):
            monkeypatch.setattr(calibration, name, lambda *a, **k: None)

        class Net:
            local = False

        scenario = _scenario(**changes)
        runs = run_variants(scenario)
        calibration.calibrate_variants(scenario, runs, place_variants(scenario, runs), Net(), tmp_path, "s",
                                       scenario.workload.effective(None), Progress(label="t", tty=False),
                                       (1, 2, 4, 8, 16), 0.1)
        return calls

    scenario = _scenario()
    uses = path_uses(scenario, place_variants(scenario, run_variants(scenario)))
    assert uses["east", "west"].channels["atlas"] == 2
    assert sorted(plays()) == [(("east", "west"), 2, 1), (("east", "west"), 2, 8),
                               (("west", "mid"), 2, 1), (("west", "mid"), 2, 8)]
    assert plays(**{"runner.atlas_sharing": "shared"}) == []


def test_the_plans_slots_take_the_measured_holds_each_way() -> None:
    """With the turns probe on Atlas's paths, its temporal plan holds each link for the
    measured hold of that direction (a slow return way: longer slots there, a slower
    prediction), not the alone rate token_margin longer; the shared variants' predictions
    do not change; without the probe the plan is as before."""
    scenario = _scenario(**{"runner.atlas_sharing": "temporal"})
    wl = scenario.workload
    plain = plan_variant("atlas", scenario, wl, None, _cal(), None)
    even = plan_variant("atlas", scenario, wl, None, _cal({("east", "west"): (0.15, 0.15),
                                                           ("west", "mid"): (0.15, 0.15)}), None)
    slow_back = plan_variant("atlas", scenario, wl, None, _cal({("east", "west"): (0.15, 0.25),
                                                                ("west", "mid"): (0.15, 0.25)}), None)
    assert plain.sharing == even.sharing == slow_back.sharing == "temporal"
    plain_slot = (ALONE_S - 0.03) * (1 + scenario.runner.token_margin)
    hold = 0.15 - 0.03 + 0.005  # overruns the planned slot: wire time and hand-over
    assert hold > plain_slot
    assert even.path_rates["east", "west"].turns_rate_bps == pytest.approx((BITS / hold, BITS / hold))
    assert plain.path_rates["east", "west"].turns_rate_bps is None
    assert even.rate_bps == pytest.approx(BITS / hold)  # the variant's channel rate as summary.json gives it
    slots = {res: [end - start for start, end in (even.prediction.plan.slots[k] for k in keys)]
             for res, keys in even.prediction.plan.order.items()}
    assert all(d == pytest.approx(hold) for ds in slots.values() for d in ds)
    assert all(end - start == pytest.approx(plain_slot) for start, end in plain.prediction.plan.slots.values())
    assert plain.prediction.iteration_time_s < even.prediction.iteration_time_s \
        < slow_back.prediction.iteration_time_s
    back = {res: {end - start for start, end in (slow_back.prediction.plan.slots[k] for k in keys)}
            for res, keys in slow_back.prediction.plan.order.items()}
    east_west, west_east = back["wan:east->west"], back["wan:west->east"]
    assert max(east_west) == pytest.approx(hold) and max(west_east) == pytest.approx(0.25 - 0.03 + 0.005)
    for name in ("multi-tcp", "baseline"):
        a = plan_variant(name, scenario, wl, None, _cal(), None).prediction.iteration_time_s
        b = plan_variant(name, scenario, wl, None, _cal({("east", "west"): (0.15, 0.25)}), None)
        assert b.prediction.iteration_time_s == pytest.approx(a)


def test_a_plans_bytes_arrive_after_their_wire_time_its_link_is_held_for_the_hold() -> None:
    """The turns probe's transfers took 150 ms (120 on the wire): the plan's slots (what
    the senders hold their links for) are the hold, wire time and hand-over, while each
    transfer's bytes reach its receiver after its wire time and one latency; so the
    iteration is predicted faster than with the bytes held back to the hold's end."""
    scenario = _scenario(**{"runner.atlas_sharing": "temporal"})
    setup = plan_variant("atlas", scenario, scenario.workload, None,
                         _cal({("east", "west"): (0.15, 0.15), ("west", "mid"): (0.15, 0.15)}), None)
    pr = setup.path_rates["east", "west"]
    assert pr.turns_wire_bps == pytest.approx((BITS / 0.12, BITS / 0.12))
    hold = 0.12 + 0.005
    plan, sim = setup.prediction.plan, setup.prediction.sim
    for key in plan.order["wan:east->west"]:
        span = sim.transfer(key)
        assert span.end - span.start == pytest.approx(0.12)
        assert span.arrival == pytest.approx(span.end + 0.03)
        assert plan.slots[key][1] - plan.slots[key][0] == pytest.approx(hold)
    held_back = replace(pr, turns_wire_bps=None)  # as before: the bytes arrive at the end of the hold
    setup.path_rates = {**setup.path_rates, ("east", "west"): held_back,
                        ("west", "mid"): replace(setup.path_rates["west", "mid"], turns_wire_bps=None)}
    before = predict_variant(setup, scenario, scenario.workload, None, None, None, False)
    assert before.iteration_time_s > setup.prediction.iteration_time_s


def test_a_lossy_route_keeps_its_loss_model_not_the_turns_probe() -> None:
    """On a route with configured loss the loss model spreads the plan's transfers
    (testbed_core/planning/lossy.py), and the probe's transfers met the same loss: its
    figures would count the loss twice, so they are not used there."""
    scenario = _scenario(**{"runner.atlas_sharing": "temporal"})
    links = [sorted(link.between) for link in scenario.topology.wan]
    lossy = _scenario(**{"runner.atlas_sharing": "temporal",
                         f"topology.wan.{links.index(['east', 'west'])}.loss": 0.001})
    from testbed_core.planning.wan_paths import path_rates_of

    turns = _cal({("east", "west"): (0.15, 0.25), ("west", "mid"): (0.15, 0.25)})
    placement = place_variants(lossy, run_variants(lossy, ["atlas"]))["atlas"]
    rates = path_rates_of(placement, lossy.topology, turns, 8, False)
    assert rates["east", "west"].turns_rate_bps is None
    assert rates["west", "mid"].turns_rate_bps is not None


def test_a_lossy_routes_plan_keeps_the_links_goodput_not_the_rate_measured_through_the_loss() -> None:
    """A temporal plan's link carries one channel's measured rate, but on a route with
    configured loss that rate was measured through the loss, which the loss model
    (testbed_core/planning/lossy.py) brings back on its own: there the link keeps its
    TCP goodput, and the channel's tensors take the loss model's time (issue 40,
    lossy-4dc's plans were made at 48-124 Mbit/s on a 400 Mbit/s link)."""
    from testbed_core.planning.calibrated import LINK_GOODPUT

    links = [sorted(link.between) for link in _scenario().topology.wan]
    at = links.index(["east", "west"])
    clean = _scenario(**{"runner.atlas_sharing": "temporal"})
    lossy = _scenario(**{"runner.atlas_sharing": "temporal", f"topology.wan.{at}.loss": 0.001})
    nominal = clean.topology.wan[at].rate
    cal = _cal()
    cal.paths[0].rates_bps = {1: 1e7, 8: 6e7}  # east-west timed far below its link (through the loss)
    cal.mirror_primary()
    plans = {name: plan_variant("atlas", sc, sc.workload, None, cal, None) for name, sc in
             (("clean", clean), ("lossy", lossy))}
    assert plans["clean"].sharing == plans["lossy"].sharing == "temporal"
    bottleneck = {name: next(wp.bottleneck_bps for wp in s.prediction.paths.values() if wp.dcs == ("east", "west"))
                  for name, s in plans.items()}
    assert bottleneck["clean"] == pytest.approx(6e7 / (1 + clean.runner.token_margin))
    assert bottleneck["lossy"] == pytest.approx(LINK_GOODPUT * nominal)
    # the lossless links of the lossy scenario keep the measured rate
    others = [wp.bottleneck_bps for wp in plans["lossy"].prediction.paths.values() if wp.dcs == ("west", "mid")]
    assert others and others[0] == pytest.approx(3e8 / (1 + clean.runner.token_margin))


def test_modelled_channels_keep_windows_of_their_stripes_real_ones_do_not() -> None:
    """Modelled workers' channels only ever carry the workload's tensors (no warm-up
    tensor): the prediction holds each stream to the window its stripes leave it
    (testbed_core/planning/network.py `stripe_window`); real devices' workers warm their
    channels first, so theirs keep the socket's window."""
    from testbed_core.planning.network import NetParams, stripe_window, wan_path

    scenario = _scenario(**{"workload.model.seq_len": 256})  # stripes far under the sockets' windows
    small = scenario.workload.effective(None).wire_activation_bytes
    setup = plan_variant("multi-tcp", scenario, scenario.workload, None, _cal(), None)
    for p in setup.prediction.paths.values():
        assert stripe_window(small, 8) < wan_path(scenario.topology, p.src, p.dst, 8, NetParams()).window_bytes
        assert p.window_bytes == stripe_window(small, 8)
    real, _ = load_scenario(ROOT / "scenarios" / "real-tiny-2dc.yaml")
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=real.workload.effective(None).wire_activation_bytes,
                      latency_s=0.025, rates_bps={1: 5e7}, transfer_s={1: [0.05]})
    setup = plan_variant("baseline", real, real.workload, None, cal, None)
    for p in setup.prediction.paths.values():  # the socket's window, as without the stripes
        assert p.window_bytes == wan_path(real.topology, p.src, p.dst, p.streams, NetParams()).window_bytes
        assert p.window_bytes > stripe_window(cal.nbytes, p.streams)
