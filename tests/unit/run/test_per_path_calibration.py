"""Per-path calibration (testbed/run/calibration.py `path_uses`, `calibrate_variants`;
testbed_core/planning/wan_paths.py `wan_uses`, `path_rates_of`; the per-path prediction; testbed_core/contracts/calibration.py `PathCalibration`): every
WAN path the variants' placements cross is listed with the variants and host pairs
that use it, and each path's own measured figures reach the prediction of the
variants crossing it, not one factor for every link."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run.calibration import path_uses
from testbed.run.pacing import tensors_at_once, window_caps
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, plan_variant, run_variants
from testbed_core.contracts.calibration import Calibration, PathCalibration, dc_of_host

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "atlas-4dc.yaml"


def _scenario(**changes):
    scenario, _ = load_scenario(SCENARIO, changes or None)
    return scenario


def _cal(ew: float, wm: float, me: float, ring: float | None = None) -> Calibration:
    """A calibration of the three paths of atlas-4dc: 1 and 8 streams each at the given
    8-stream rate (1 stream: a tenth), the rings of dp-across-dc on east-west."""
    def path(dcs, r8, src, dst):
        return PathCalibration(dcs=dcs, src=src, dst=dst, nbytes=1 << 20, latency_s=0.03,
                               rates_bps={1: r8 / 10, 8: r8}, colliding_bps={8: 0.8 * r8}, concurrent=2)
    paths = [path(("east", "west"), ew, "east-h3", "west-h1"), path(("west", "mid"), wm, "west-h3", "mid-h1"),
             path(("mid", "edge"), me, "mid-h1", "edge-h1")]
    if ring is not None:
        paths[0].ring_bps, paths[0].ring_streams, paths[0].ring_channels = ring, 1, 5  # one stream per flow
    cal = Calibration(src="east-h3", dst="west-h1", nbytes=1 << 20, latency_s=0.03, paths=paths)
    cal.mirror_primary()
    return cal


def test_every_path_the_placements_cross_is_listed_with_its_variants() -> None:
    scenario = _scenario()
    uses = path_uses(scenario, place_variants(scenario, run_variants(scenario)))
    assert list(uses)[0] == ("east", "west")  # atlas's first crossing: the primary path
    assert set(uses) == {("east", "west"), ("west", "mid"), ("mid", "edge")}
    ew, wm, me = uses["east", "west"], uses["west", "mid"], uses["mid", "edge"]
    assert ew.channels == {"atlas": 2, "baseline": 2, "multi-tcp": 2, "torch-gloo": 2}
    assert ew.ring_variants == ["dp-across-dc"] and len(ew.ring_pairs) == 5  # every stage's ring
    assert all(a.startswith("east-") and b.startswith("west-") for a, b in ew.ring_pairs)
    assert set(wm.channels) == {"atlas", "baseline", "multi-tcp", "torch-gloo"}
    assert set(me.channels) == {"baseline", "multi-tcp", "torch-gloo"}  # atlas never crosses mid-edge
    assert all(a.startswith("mid-") and b.startswith("edge-") for a, b in me.pairs)


def test_each_path_keeps_its_own_rate_in_the_prediction() -> None:
    """Slowing only the mid-edge path slows the variants that cross it (baseline), not
    atlas, whose placement stays on east-west and west-mid."""
    scenario = _scenario()
    wl = scenario.workload
    fast, slow_edge = _cal(2e8, 2e8, 1e8), _cal(2e8, 2e8, 2e7)
    base = {c: plan_variant("baseline", scenario, wl, None, cal, None) for c, cal in (("fast", fast),
                                                                                      ("slow", slow_edge))}
    atlas = {c: plan_variant("atlas", scenario, wl, None, cal, None) for c, cal in (("fast", fast),
                                                                                    ("slow", slow_edge))}
    assert set(base["fast"].path_rates) == {("east", "west"), ("west", "mid"), ("mid", "edge")}
    assert base["slow"].path_rates["mid", "edge"].rate_bps == pytest.approx(2e6)  # 1 stream: a tenth
    assert base["slow"].prediction.iteration_time_s > 1.5 * base["fast"].prediction.iteration_time_s
    assert atlas["slow"].prediction.iteration_time_s == pytest.approx(atlas["fast"].prediction.iteration_time_s)
    used = {p.dcs: p for p in base["slow"].paths_used()}  # summary.json prediction.calibrated_paths
    assert used["mid", "edge"].channel_rate_mbps == pytest.approx(2.0) and used["east", "west"].ring_aggregate_mbps is None
    assert {p.dcs for p in atlas["slow"].paths_used()} == {("east", "west"), ("west", "mid")}


def test_the_rings_measured_on_a_path_set_dp_across_dcs_all_reduce() -> None:
    scenario = _scenario()
    wl = scenario.workload
    fast = plan_variant("dp-across-dc", scenario, wl, None, _cal(2e8, 2e8, 1e8, ring=2e8), None)
    slow = plan_variant("dp-across-dc", scenario, wl, None, _cal(2e8, 2e8, 1e8, ring=1e8), None)
    assert fast.path_rates["east", "west"].ring_bps == 2e8
    # the rings move 5 stages x (params x 2 B x scale) each way: twice as long at half the rate
    grown = slow.prediction.allreduce_s / fast.prediction.allreduce_s
    assert 1.8 < grown < 2.05


def test_a_calibration_without_paths_stands_for_every_path() -> None:
    """Summaries and tests from before per-path calibration: the one path timed is
    returned for any DC pair; with paths, an untimed pair is None."""
    old = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=1, latency_s=0.01, rates_bps={1: 1e8})
    assert old.path("x", "y").rates_bps == {1: 1e8}
    new = _cal(2e8, 2e8, 1e8)
    assert new.path("west", "east").dcs == ("east", "west")  # either order
    assert new.path("east", "edge") is None
    report = new.report()
    assert [p.dcs for p in report.paths] == [("east", "west"), ("west", "mid"), ("mid", "edge")]
    assert report.channel_rate_mbps == {"1": 20.0, "8": 200.0}  # the primary path at the top level
    assert report.paths[2].channel_rate_mbps["8"] == 100.0
    assert report.method.startswith("every WAN path")


def test_a_path_without_the_variants_stream_count_is_named() -> None:
    """plan_variants refuses a variant whose stream count was not timed on a path it
    crosses, naming the paths (the others still plan)."""
    from testbed.run.variants import plan_variants

    scenario = _scenario()
    cal = _cal(2e8, 2e8, 1e8)
    cal.paths[2].rates_bps = {8: 1e8}  # mid-edge: no single stream
    setups = plan_variants(run_variants(scenario, ["baseline", "atlas"]), scenario, scenario.workload, None, cal,
                           None, False)
    assert str(setups["baseline"]) == "variant baseline: 1 streams were not calibrated on mid<->edge"
    assert not isinstance(setups["atlas"], Exception)


def test_the_calibration_probes_each_path_with_what_crosses_it(tmp_path: Path, monkeypatch) -> None:
    """calibrate_variants on atlas-4dc (the probes recorded, not run): every path gets
    1 and 8 streams from a forward and a reverse pipeline's hosts; the shared 8-stream
    variants' collisions on each path their two pipelines cross; dp-across-dc's five
    rings on east-west; the LAN rings of Atlas's placement; every agent started at once."""
    import testbed.run.calibration as calibration
    from testbed.progress import Progress

    calls: list[tuple] = []

    class Agents:
        def __init__(self, *a, **k) -> None:
            pass

        def start(self, hosts) -> None:
            calls.append(("start", len(set(hosts))))

        def close(self) -> None:
            calls.append(("close",))

    caps: dict[tuple, dict] = {}

    def fake_calibrate(net, scenario, folder, secret, pairs, counts, nbytes, latency, progress, pc, agents,
                       caps_=None):
        calls.append(("single", pc.dcs, tuple(pairs), tuple(counts)))
        caps.update({("single", pc.dcs, n): caps_ or {} for n in counts})
        for n in counts:
            pc.rates_bps = {**pc.rates_bps, n: 1e8 if n == 1 else 3e8}
        return pc

    def fake_link(net, scenario, folder, secret, pairs, n, pc, progress, agents, caps_=None):
        calls.append(("collide", pc.dcs, len(pairs), n))
        caps[("collide", pc.dcs, n)] = caps_ or {}
        pc.colliding_bps = {**pc.colliding_bps, n: 2e8}

    def fake_rings(net, scenario, folder, secret, pairs, n, grad, pc, progress, agents):
        calls.append(("rings", pc.dcs, len(pairs), n))
        pc.ring_bps = 1.5e8

    def fake_lan(net, scenario, folder, secret, pairs, grad, cal, progress, agents):
        calls.append(("lan", len(pairs)))

    def fake_together(net, scenario, folder, secret, loads, n, progress, agents, one=None, colliding=None):
        calls.append(("together", n, tuple((pc.dcs, len(pairs)) for pc, pairs in loads)))
        caps[("together", n)] = (one, colliding)

    monkeypatch.setattr(calibration, "ProbeAgents", Agents)
    monkeypatch.setattr(calibration, "calibrate", fake_calibrate)
    monkeypatch.setattr(calibration, "calibrate_link", fake_link)
    monkeypatch.setattr(calibration, "calibrate_wan_rings", fake_rings)
    monkeypatch.setattr(calibration, "calibrate_lan", fake_lan)
    monkeypatch.setattr(calibration, "calibrate_together", fake_together)
    monkeypatch.setattr(calibration, "calibrate_one_way",
                        lambda net, scenario, folder, secret, pair, counts, pc, progress, agents, caps_=None:
                        calls.append(("one-way", pc.dcs, pair, tuple(counts), caps_)))

    class Net:
        local = False

    scenario = _scenario()
    eff = scenario.workload.effective(None)
    runs = run_variants(scenario)
    cal, auto = calibration.calibrate_variants(scenario, runs, place_variants(scenario, runs), Net(), tmp_path, "s",
                                               eff, Progress(label="t", tty=False), (1, 2, 4, 8, 16), 0.1)
    assert auto is None and calls[0][0] == "start" and calls[-1] == ("close",)
    assert [p.dcs for p in cal.paths] == [("east", "west"), ("west", "mid"), ("mid", "edge")]
    singles = [c for c in calls if c[0] == "single"]
    # one stream first on every path (never capped), then each count the variants may take
    paths = (("east", "west"), ("west", "mid"), ("mid", "edge"))
    assert [(c[1], c[3]) for c in singles] == [(p, (1,)) for p in paths] + [(p, (8,)) for p in paths]
    for c in singles:  # the first pipeline's channel (it carries tensors both ways: calibrate's duplex)
        ((a, b),) = c[2]
        assert dc_of_host(a) == c[1][0] and dc_of_host(b) == c[1][1]
    assert {c[1:] for c in calls if c[0] == "collide"} == {(p, 2, 8) for p in (("east", "west"), ("west", "mid"),
                                                                               ("mid", "edge"))}
    assert [c for c in calls if c[0] == "rings"] == [("rings", ("east", "west"), 5, 1)]  # one stream per flow
    # the shared 8-stream channels move 3e8 of the paths' nominal rate: timed one way alone too where that is
    # at least half the link (ONE_WAY_MIN_SHARE), from the first pipeline's hosts; window-limited ones not
    nominal = {p.dcs: p.nominal_bps for p in cal.paths}
    assert {c[1] for c in calls if c[0] == "one-way"} == {k for k, v in nominal.items() if 3e8 >= 0.5 * v}
    assert all(c[3] == (8,) for c in calls if c[0] == "one-way")
    # the run's window caps (pacing.window_caps on each shared variant's placement): the collisions (multi-tcp's
    # and atlas's shared way) take them where both run the same; the alone probes where atlas crosses serve its
    # plan too (uncapped): none there, multi-tcp's on the path only it crosses (mid-edge)
    placements = place_variants(scenario, runs)
    mt = window_caps(scenario.topology, placements["multi-tcp"], 8, eff.wire_activation_bytes,
                     tensors_at_once(scenario.workload.parallelism))
    at = window_caps(scenario.topology, placements["atlas"], 8, eff.wire_activation_bytes,
                     tensors_at_once(scenario.workload.parallelism))
    assert mt, "atlas-4dc's multi-tcp runs capped"
    for p in paths:
        users = [v for v in ("multi-tcp", "atlas") if v in cal.path(*p).variants]
        assert caps["single", p, 1] == {} and caps["single", p, 8] == ({} if "atlas" in users else mt)
        want = {w: c for w, c in mt.items() if "atlas" not in users or at.get(w) == c}
        assert caps["collide", p, 8] == want  # (the probe's channels look up their own directions)
    assert caps["together", 8][0] == {}
    assert ("lan", 5) in calls
    # the paths each shared multi-stream placement crosses, loaded at once with its two pipelines on each:
    # multi-tcp (and atlas's configured-count alternative, its own placement) at 8 streams
    together = [c[1:] for c in calls if c[0] == "together"]
    ew, wm, me = ("east", "west"), ("west", "mid"), ("mid", "edge")
    assert (8, ((ew, 2), (wm, 2), (me, 2))) in together and (8, ((ew, 2), (wm, 2))) in together
    assert len(together) == len(set(together))  # each (count, paths) once
    assert calls.index(("lan", 5)) > max(calls.index(("together", *t)) for t in together)
    assert cal.wall_s is not None and cal.rates_bps == {1: 1e8, 8: 3e8}  # the primary path's, at the top


def test_paths_timed_together_weigh_the_prediction_of_the_placement_that_loads_them() -> None:
    """A path's figures timed with the other paths of a placement loaded at once weigh
    in for that placement, by how loaded the predicted iteration keeps the path (the
    summary says so and gives the load), not for a placement that loads another set of
    paths: each rate lies between its alone and together figures, and the prediction
    between the all-alone and all-together ones."""
    from testbed_core.contracts.calibration import TogetherCalibration

    scenario = _scenario()
    wl = scenario.workload
    alone = _cal(2e8, 2e8, 1e8)
    busy = _cal(2e8, 2e8, 1e8)
    three = [("east", "west"), ("west", "mid"), ("mid", "edge")]
    for pc in busy.paths:
        r8 = pc.rates_bps[8]
        pc.together = [TogetherCalibration(streams=8, paths=three, channels=2, rate_bps=0.6 * r8,
                                           colliding_bps=0.5 * r8)]
    before = plan_variant("multi-tcp", scenario, wl, None, alone, None)
    after = plan_variant("multi-tcp", scenario, wl, None, busy, None)
    ew = after.path_rates["east", "west"]
    assert ew.load is not None and 0 < ew.load < 1  # the other paths busy part of its time
    assert ew.rate_bps == pytest.approx(2e8 - ew.load * 0.4 * 2e8)
    assert ew.colliding_bps == pytest.approx(1.6e8 - ew.load * (1.6e8 - 1e8))
    assert before.prediction.iteration_time_s < after.prediction.iteration_time_s
    with pytest.MonkeyPatch.context() as mp:  # every path weighed as fully loaded: the together figures alone
        mp.setattr("testbed.run.variants.LOAD_PASSES", 0)
        together = plan_variant("multi-tcp", scenario, wl, None, busy, None)
    assert together.path_rates["east", "west"].rate_bps == pytest.approx(1.2e8)
    assert after.prediction.iteration_time_s < together.prediction.iteration_time_s
    used = {p.dcs: p for p in after.paths_used()}
    assert used["mid", "edge"].timed == "alone and with the placement's other paths loaded at once, weighed by their load"
    assert used["mid", "edge"].load == after.path_rates["mid", "edge"].load
    assert {p.timed for p in before.paths_used()} == {"path alone"}
    # atlas's placement loads east-west and west-mid only: the three-path figures are not its own
    atlas = plan_variant("atlas", scenario, wl, None, busy, None)
    assert all(pr.load is None for pr in atlas.path_rates.values())


def test_calibrate_together_times_every_path_at_once(tmp_path: Path, monkeypatch) -> None:
    """calibrate_together runs one probe with a channel each way on every path, then one
    with every pipeline's channels, all paths in the same rounds; each path gets its
    median channel rate and its colliding aggregate (mean) from its own transfers."""
    import testbed.run.calibration as calibration
    from testbed.progress import Progress

    runs: list[tuple[int, int]] = []

    class FakeProber:
        def __init__(self, *a, **k) -> None:
            self.agents = None
            self.burst = 1

        def run(self, pairs, streams, nbytes, count, label="", period_s=None, offsets=None, warm=True, caps=None,
                opened=None):
            runs.append((len(pairs), streams, opened.warm if opened else warm, caps))
            assert period_s is not None and period_s > 0.5  # rounds that fit the slowest path
            out = []
            for a, b in pairs:  # 1 MiB in 0.03 s + (0.1 s east-west, 0.2 s west-mid) each, +0.1 s colliding
                east_west = {dc_of_host(a), dc_of_host(b)} == {"east", "west"}
                d = 0.03 + (0.1 if east_west else 0.2) + (0.1 if len(pairs) > 4 else 0)
                out.append(calibration.ProbeTimes([0.0] * count, [d] * count))
            return out

    monkeypatch.setattr(calibration, "Prober", FakeProber)
    cal = _cal(2e8, 2e8, 1e8)
    ew, wm = cal.paths[0], cal.paths[1]
    ew.transfer_s = {8: [0.13, 0.13]}
    wm.transfer_s = {8: [0.23, 0.23]}
    ew_pairs = [("east-h3", "west-h1"), ("east-h4", "west-h2")]
    wm_pairs = [("west-h3", "mid-h1"), ("west-h4", "mid-h2")]
    calibration.calibrate_together(None, _scenario(**{"runner.base_port": "29500"}), tmp_path, "s",
                                   [(ew, ew_pairs), (wm, wm_pairs)], 8, Progress(label="t", tty=False),
                                   agents=object())
    # one channel each way per path, then both pipelines' channels: cold (modelled devices), as clamped
    assert runs == [(4, 8, False, None), (8, 8, False, None)]
    t_ew, t_wm = ew.together_for(8, [("west", "east"), ("mid", "west")]), wm.together[0]
    bits = (1 << 20) * 8
    assert t_ew.rate_bps == pytest.approx(bits / 0.1)
    assert t_wm.rate_bps == pytest.approx(bits / 0.2)
    assert t_ew.colliding_bps == pytest.approx(2 * bits / 0.2)  # 2 channels, 0.23 s - 0.03 s delay
    assert t_ew.channels == 2 and t_ew.paths == [("east", "west"), ("west", "mid")]
    assert ew.report().together[0].colliding_aggregate_mbps == pytest.approx(2 * bits / 0.2 / 1e6)


def test_a_temporal_plan_loads_its_paths_together_one_channel_each() -> None:
    """Atlas with a temporal plan by request puts one transfer at a time on each link:
    its paths are timed loaded together with one channel each way (no collision);
    with shared links, multi-tcp's two pipelines collide on each of its three paths."""
    from testbed.run.calibration import together_of
    from testbed_core.planning.wan_paths import together_loads

    cal = _cal(3e8, 3e8, 1e8)
    for request, name, want in (("temporal", "atlas", {("east", "west"): 1, ("west", "mid"): 1}),
                                ("shared", "multi-tcp", {("east", "west"): 2, ("west", "mid"): 2,
                                                         ("mid", "edge"): 2})):
        scenario = _scenario(**{"runner.atlas_sharing": request})
        runs = run_variants(scenario, [name])
        placements = place_variants(scenario, runs)
        uses = path_uses(scenario, placements)
        loads = together_loads(together_of(scenario, runs, placements, cal, None, 2e8), uses, cal.paths)
        (n,) = loads
        (group,) = loads[n]
        assert {pc.dcs: len(pairs) for pc, pairs in group} == want


def test_the_largest_ring_ends_at_the_rate_one_ring_gets_alone() -> None:
    """dp-across-dc's last stage has the most gradients: its ring ends alone on the
    link, at the path's measured channel rate at the rings' stream count, held to what
    one stream's window carries per round trip (the rate was measured with 1 MiB
    tensors; the gradients are many windows long): atlas-4dc's 512 KB rmem_max gives a
    337920-byte window (RMEM_FRACTION 0.66), over 60 ms 337920 x 8 / 0.06 = 45.06 Mbit/s. A channel measured
    at 1e8 is predicted as one measured at that window rate; a slower one (2e7, under
    the rings' share with all five running, 1.5e8 / 5) takes longer."""
    scenario = _scenario()
    wl = scenario.workload

    def allreduce(rate: float) -> float:
        cal = _cal(2e8, 2e8, 1e8, ring=1.5e8)
        cal.paths[0].rates_bps = {1: rate, 8: 2e8}
        setup = plan_variant("dp-across-dc", scenario, wl, None, cal, None)
        assert setup.path_rates["east", "west"].ring_alone_bps == rate
        return setup.prediction.allreduce_s

    window = 512_000 * 0.66 * 8 / 0.06
    assert allreduce(1e8) == pytest.approx(allreduce(window))
    assert allreduce(1e8) < allreduce(window * 0.99)
    assert allreduce(2e7) > allreduce(1e8)


def test_the_lan_rings_are_timed_at_once_then_one_alone(monkeypatch, tmp_path: Path) -> None:
    """`calibrate_lan`: every DP pair's ring at once, then the first pair's alone (the
    first of each not counted); the rates are bytes sent / median, and plan_variant hands
    both, with the ring count, to the prediction's all-reduce inside the DCs."""
    from testbed.progress import Progress
    from testbed.run import calibration

    calls = []

    together, alone = [0.4, 0.2, 0.3], [0.1, 0.5, 0.1]

    def fake_rings(net, scenario, folder, secret, pairs, streams, grad, count, label, agents):
        calls.append((label, len(pairs), streams, count))
        return [9.0, *(together if len(pairs) > 1 else alone)][:count], 10_000_000

    monkeypatch.setattr(calibration, "time_rings", fake_rings)
    scenario = _scenario(**{"runner.calibration_transfers": 1})
    cal = Calibration(src="east-h3", dst="west-h1", nbytes=1 << 20, latency_s=0.03)
    pairs = [("east-h1", "east-h2"), ("west-h1", "west-h2"), ("mid-h1", "mid-h2")]
    calibration.calibrate_lan(object(), scenario, tmp_path, "s", pairs, 20_000_000, cal,
                              Progress(label="t", tty=False))
    # at least LAN_RING_ROUNDS timed rings (1 asked for), the first of each not counted
    assert calibration.LAN_RING_ROUNDS == 3
    assert calls == [("lan-", 3, 1, 4), ("lan-alone-", 1, 1, 4)]
    assert cal.lan_rate_bps == pytest.approx(8e7 / 0.3) and cal.lan_transfer_s == together
    assert cal.lan_alone_rate_bps == pytest.approx(8e7 / 0.1) and cal.lan_alone_transfer_s == alone
    assert "lan_alone_channel_rate_mbps" in cal.report().model_dump()
    # one pair: nothing to time alone
    calls.clear()
    one = Calibration(src="east-h3", dst="west-h1", nbytes=1 << 20, latency_s=0.03)
    calibration.calibrate_lan(object(), scenario, tmp_path, "s", pairs[:1], 20_000_000, one,
                              Progress(label="t", tty=False))
    assert [c[0] for c in calls] == ["lan-"] and one.lan_alone_rate_bps is None
    # the prediction: atlas's rings inside the DCs at 5 x 1e8 all at once, 4e8 alone, are
    # faster than at 1e8 each from their stages' ends; without the alone probe, as before
    scenario = _scenario()
    crowd = _cal(2e8, 2e8, 1e8)
    crowd.lan_pairs, crowd.lan_rate_bps = [("east-h1", "east-h2")] * 5, 1e8
    staged = _cal(2e8, 2e8, 1e8)
    staged.lan_pairs, staged.lan_rate_bps, staged.lan_alone_rate_bps = crowd.lan_pairs, 1e8, 4e8
    before = plan_variant("atlas", scenario, scenario.workload, None, crowd, None)
    after = plan_variant("atlas", scenario, scenario.workload, None, staged, None)
    assert (before.lan_rings, after.lan_rings, after.lan_alone_bps) == (None, 5, 4e8)
    assert after.prediction.allreduce_s < before.prediction.allreduce_s
