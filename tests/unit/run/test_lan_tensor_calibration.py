"""The LAN tensor probes and their use (testbed/run/calibration.py `calibrate_lan_tensor`,
`calibrate_lan_loaded`, `lan_tensor_pair_of`, `calibrate_variants`;
testbed_core/planning/wan_paths.py `lan_boundary_pair`, `boundary_pairs`;
testbed_core/planning/prediction.py `lan_tensor_rate`, `_loaded_lan_paths`): where a
pipeline boundary sits inside a DC and no DP ring is timed there, its own tensors are
timed on a one-stream channel between its two hosts, alone and with the pipeline's
other channels busy, and the planner moves the boundary's tensors at those rates (the
loaded one while a WAN channel of its ranks moves) instead of the DC's nominal one."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.calibration import ProbeTimes
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, plan_variant, run_variants
from testbed_core.contracts.calibration import Calibration, CalibrationReport, PathCalibration
from testbed_core.planning.network import NetParams
from testbed_core.planning.placement import Placement
from testbed_core.planning.prediction import Variant, lan_tensor_rate
from testbed_core.planning.wan_paths import boundary_pairs, lan_boundary_pair
from testbed_core.variants import REGISTRY, RunVariant

ROOT = Path(__file__).resolve().parents[3]
UNEQUAL = ROOT / "scenarios" / "bubbletea-unequal-bubbles.yaml"  # dp=1, pp=4: stages 0-1 in dc1, 2-3 in dc2
DP = ROOT / "scenarios" / "dp-2dc.yaml"  # dp=2 with the DP all-reduce: its rings are timed inside the DCs


def _placement(stage_dc: list[list[str]], hosts: dict[tuple[int, int], str], wrap: bool = False) -> Placement:
    pp = len(stage_dc[0])
    return Placement("t", pp, len(stage_dc), 1, tuple(tuple(r) for r in stage_dc),
                     {k: (v,) for k, v in hosts.items()}, {}, wrap)


def test_the_first_boundary_inside_a_dc_on_two_hosts_is_the_one_timed() -> None:
    pl = _placement([["a", "b", "b", "b"]], {(0, 0): "a-h1", (0, 1): "b-h1", (0, 2): "b-h2", (0, 3): "b-h3"})
    assert lan_boundary_pair(pl) == ("b-h1", "b-h2")
    crossing = _placement([["a", "b"]], {(0, 0): "a-h1", (0, 1): "b-h1"})
    assert lan_boundary_pair(crossing) is None
    one_host = _placement([["a", "a"]], {(0, 0): "a-h1", (0, 1): "a-h1"})
    assert lan_boundary_pair(one_host) is None
    # an interleaved schedule's wrap boundary (last stage back to the first) counts too
    wrap = _placement([["a", "b", "a"]], {(0, 0): "a-h1", (0, 1): "b-h1", (0, 2): "a-h2"}, wrap=True)
    assert lan_boundary_pair(wrap) == ("a-h2", "a-h1")


def test_the_loaded_probe_keeps_every_boundary_between_two_hosts_busy() -> None:
    pl = _placement([["a", "a", "b", "b", "b"]],
                    {(0, 0): "a-h1", (0, 1): "a-h2", (0, 2): "b-h1", (0, 3): "b-h1", (0, 4): "b-h2"})
    assert boundary_pairs(pl) == [("a-h1", "a-h2"), ("a-h2", "b-h1"), ("b-h1", "b-h2")]  # not b-h1 to itself
    wrap = _placement([["a", "b", "a"]], {(0, 0): "a-h1", (0, 1): "b-h1", (0, 2): "a-h2"}, wrap=True)
    assert boundary_pairs(wrap) == [("a-h1", "b-h1"), ("b-h1", "a-h2"), ("a-h2", "a-h1")]


def test_the_probe_times_atlas_placement_first_and_never_a_gloo_variant() -> None:
    from testbed.run.calibration import lan_tensor_pair_of

    inside = _placement([["a", "a"]], {(0, 0): "a-h1", (0, 1): "a-h2"})
    other = _placement([["a", "a"]], {(0, 0): "a-h3", (0, 1): "a-h4"})
    runs = {n: RunVariant(REGISTRY[n]) for n in ("baseline", "atlas", "torch-gloo")}
    assert lan_tensor_pair_of({"baseline": other, "atlas": inside}, runs) == ("atlas", ("a-h1", "a-h2"))
    assert lan_tensor_pair_of({"torch-gloo": inside, "baseline": other}, runs) == ("baseline", ("a-h3", "a-h4"))
    assert lan_tensor_pair_of({"torch-gloo": inside}, runs) is None


def _calibrate(scenario_file: Path, monkeypatch, tmp_path: Path) -> tuple[list[tuple], Calibration]:
    """calibrate_variants on `scenario_file` with every probe recorded, not run (with the
    `no_probe_agents` fixture)."""
    import testbed.run.calibration as calibration

    calls: list[tuple] = []

    def fake_calibrate(net, scenario, folder, secret, pairs, counts, nbytes, latency, progress, pc, agents,
                       caps=None):
        for n in counts:
            pc.rates_bps = {**pc.rates_bps, n: 1e8 * n}
        return pc

    monkeypatch.setattr(calibration, "calibrate", fake_calibrate)
    for name in ("calibrate_link", "calibrate_wan_rings", "calibrate_together", "calibrate_one_way",
                 "calibrate_turns", "calibrate_verify"):
        monkeypatch.setattr(calibration, name, lambda *a, **k: None)
    monkeypatch.setattr(calibration, "calibrate_lan", lambda *a, **k: calls.append(("rings", a[4])))
    monkeypatch.setattr(calibration, "calibrate_lan_tensor", lambda *a, **k: calls.append(("tensor", a[4], a[5])))
    monkeypatch.setattr(calibration, "calibrate_lan_loaded", lambda *a, **k: calls.append(("loaded", a[4], a[5])))

    class Net:
        local = False

    scenario, _ = load_scenario(scenario_file)
    runs = run_variants(scenario)
    cal, _ = calibration.calibrate_variants(scenario, runs, place_variants(scenario, runs), Net(), tmp_path, "s",
                                            scenario.workload.effective(None), Progress(label="t", tty=False),
                                            (1, 2, 4, 8, 16), 0.1)
    return calls, cal


def test_a_boundary_inside_a_dc_without_rings_is_timed_with_the_pipelines_tensor(monkeypatch, tmp_path,
                                                                                  no_probe_agents) -> None:
    from testbed.run.common import nominal_link
    from testbed_core.planning.streams import variant_streams

    calls, cal = _calibrate(UNEQUAL, monkeypatch, tmp_path)
    scenario = load_scenario(UNEQUAL)[0]
    nbytes = scenario.workload.effective(None).wire_activation_bytes
    # then the pipeline's channels all at once: inside the DCs on one stream, over the WAN
    # on the count Atlas runs with (fill-link: from the calibration's rates)
    n = variant_streams(REGISTRY["atlas"], scenario.transport.streams, cal, None,
                        nominal_link(scenario.topology, (cal.src, cal.dst)))
    assert n > 1
    assert calls == [("tensor", ("dc1-h1", "dc1-h2"), nbytes),
                     ("loaded", [("dc1-h1", "dc1-h2", 1), ("dc1-h2", "dc2-h1", n), ("dc2-h1", "dc2-h2", 1)], nbytes)]


def test_where_the_dp_rings_are_timed_inside_a_dc_no_tensor_probe_runs(monkeypatch, tmp_path, no_probe_agents) -> None:
    calls, _ = _calibrate(DP, monkeypatch, tmp_path)
    assert [c[0] for c in calls] == ["rings"]


def _fake_prober(monkeypatch, answer) -> dict:
    """Replace the calibration's Prober with one that records its call (returned) and
    answers `answer(pairs, sent)`: the ProbeTimes of each pair, `sent` the hand-over times."""
    import testbed.run.calibration as calibration

    seen: dict = {}

    class FakeProber:
        burst = 1

        def __init__(self, *a, **k) -> None:
            pass

        def run(self, pairs, streams, nbytes, count, label="", **k):
            seen.update(pairs=pairs, streams=streams, nbytes=nbytes, count=count, period=k.get("period_s"),
                        duplex=k.get("duplex"))
            return answer(pairs, [float(i) for i in range(count)])

    monkeypatch.setattr(calibration, "Prober", FakeProber)
    return seen


def test_calibrate_lan_tensor_times_one_stream_both_ways_and_takes_the_median(monkeypatch, tmp_path) -> None:
    import testbed.run.calibration as calibration

    # forward 10 ms each, back 20 ms each: the median of both ways
    seen = _fake_prober(monkeypatch, lambda pairs, sent: [
        ProbeTimes(sent, [s + 0.010 for s in sent], back_sent=sent, back_arrived=[s + 0.020 for s in sent])])
    scenario, _ = load_scenario(UNEQUAL, {"runner.base_port": "29500"})
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 * 2**20, latency_s=0.025)
    calibration.calibrate_lan_tensor(None, scenario, tmp_path, "s", ("dc1-h1", "dc1-h2"), 8 * 2**20, cal,
                                     Progress(label="t", tty=False), agents=object())
    assert seen["pairs"] == [("dc1-h1", "dc1-h2")] and seen["streams"] == 1 and seen["duplex"] is True
    assert cal.lan_tensor_pair == ("dc1-h1", "dc1-h2")
    assert len(cal.lan_tensor_transfer_s) == 2 * (seen["count"] - calibration.run_channels(
        scenario, calibration.ALONE_MAX_UNTIMED).untimed)
    assert cal.lan_tensor_rate_bps == pytest.approx(8 * 2**20 * 8 / 0.015)


def test_calibrate_lan_loaded_times_every_channel_each_way_at_once_in_rounds(monkeypatch, tmp_path) -> None:
    import testbed.run.calibration as calibration

    # the WAN's channels 120 ms, the ones inside the DCs 20 ms forward and 40 back
    took = {("dc1-h2", "dc2-h1"): 0.12, ("dc2-h1", "dc1-h2"): 0.12, ("dc1-h1", "dc1-h2"): 0.02,
            ("dc1-h2", "dc1-h1"): 0.04, ("dc2-h1", "dc2-h2"): 0.02, ("dc2-h2", "dc2-h1"): 0.04}
    seen = _fake_prober(monkeypatch, lambda pairs, sent: [ProbeTimes(sent, [x + took[p] for x in sent])
                                                          for p in pairs])
    scenario, _ = load_scenario(UNEQUAL, {"runner.base_port": "29500"})
    pc = PathCalibration(dcs=("dc1", "dc2"), src="dc1-h2", dst="dc2-h1", nbytes=1000, latency_s=0.025,
                         rates_bps={8: 8e8}, transfer_s={8: [0.1, 0.1]})
    cal = Calibration(src="dc1-h2", dst="dc2-h1", nbytes=1000, latency_s=0.025, paths=[pc])
    boundaries = [("dc1-h1", "dc1-h2", 1), ("dc1-h2", "dc2-h1", 8), ("dc2-h1", "dc2-h2", 1)]
    calibration.calibrate_lan_loaded(None, scenario, tmp_path, "s", boundaries, 1000, cal,
                                     Progress(label="t", tty=False), agents=object())
    # one channel each way per boundary, the WAN's first, all at once, in rounds a WAN transfer fits
    assert seen["pairs"] == [("dc1-h2", "dc2-h1"), ("dc1-h1", "dc1-h2"), ("dc2-h1", "dc2-h2"),
                             ("dc2-h1", "dc1-h2"), ("dc1-h2", "dc1-h1"), ("dc2-h2", "dc2-h1")]
    assert seen["streams"] == [8, 1, 1, 8, 1, 1]
    assert seen["period"] == pytest.approx(2.5 * 0.1 + calibration.PROBE_GAP_S) and not seen["duplex"]
    timed = seen["count"] - calibration.run_channels(scenario).untimed
    assert timed >= calibration.LOADED_ROUNDS
    assert cal.lan_loaded_with == [("dc1-h2", "dc2-h1", 8)]
    assert len(cal.lan_loaded_transfer_s) == 4 * timed and len(cal.lan_loaded_wan_s) == 2 * timed
    assert cal.lan_loaded_rate_bps == pytest.approx(1000 * 8 / 0.03)  # the median of 20 and 40 ms
    # a pipeline with no boundary inside a DC, or none over the WAN, has nothing to load
    seen.clear()
    calibration.calibrate_lan_loaded(None, scenario, tmp_path, "s", boundaries[1:2], 1000, cal,
                                     Progress(label="t", tty=False), agents=object())
    assert not seen


def test_the_report_keeps_the_probe_and_says_how_it_was_timed() -> None:
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=1000, latency_s=0.025,
                      paths=[PathCalibration(dcs=("dc1", "dc2"), src="dc1-h1", dst="dc2-h1", nbytes=1000,
                                             latency_s=0.025, rates_bps={1: 1e8}, transfer_s={1: [0.1]})],
                      lan_tensor_pair=("dc1-h1", "dc1-h2"), lan_tensor_rate_bps=5e9, lan_tensor_transfer_s=[0.01],
                      lan_loaded_with=[("dc1-h2", "dc2-h1", 8)], lan_loaded_rate_bps=2e9,
                      lan_loaded_transfer_s=[0.03], lan_loaded_wan_s=[0.12])
    cal.mirror_primary()
    report = cal.report()
    assert report.lan_tensor_channel_rate_mbps == pytest.approx(5000)
    assert report.lan_loaded_channel_rate_mbps == pytest.approx(2000)
    assert "lan_tensor_pair" in report.method and "lan_loaded_with" in report.method
    back = Calibration.from_report(CalibrationReport.model_validate_json(report.model_dump_json()))
    assert back.lan_tensor_pair == ("dc1-h1", "dc1-h2") and back.lan_tensor_rate_bps == pytest.approx(5e9)
    assert back.lan_loaded_with == [("dc1-h2", "dc2-h1", 8)] and back.lan_loaded_rate_bps == pytest.approx(2e9)
    assert back.lan_loaded_transfer_s == [0.03] and back.lan_loaded_wan_s == [0.12]


def test_a_boundary_inside_a_dc_moves_at_the_probed_rate_over_atlas_transport_only() -> None:
    topo = load_scenario(UNEQUAL)[0].topology
    nominal = topo.dc("dc1").lan_rate
    atlas, gloo = Variant("atlas", 8, "shared", "atlas"), Variant("torch-gloo", 1, "shared", "baseline")
    assert lan_tensor_rate(topo, "dc1", atlas, NetParams()) == nominal
    assert lan_tensor_rate(topo, "dc1", atlas, NetParams(lan_tensor_bps=5e9)) == 5e9
    # the DP rings' rate, where they were timed, stands for the channel (they run beside it)
    assert lan_tensor_rate(topo, "dc1", atlas, NetParams(lan_rate_bps=1.5e9, lan_tensor_bps=5e9)) == 1.5e9
    # gloo's C++ pairs are not bound by the transport's loop
    assert lan_tensor_rate(topo, "dc1", gloo, NetParams(lan_tensor_bps=5e9)) == nominal


def test_the_probed_rate_reaches_the_prediction_of_a_boundary_inside_a_dc() -> None:
    scenario, _ = load_scenario(UNEQUAL)
    nbytes = scenario.workload.effective(None).wire_activation_bytes

    def predicted(lan_bps: float | None, loaded_bps: float | None = None, variant: str = "atlas") -> float:
        pc = PathCalibration(dcs=("dc1", "dc2"), src="dc1-h2", dst="dc2-h1", nbytes=nbytes, latency_s=0.025,
                             rates_bps={1: 1e8, 8: 8e8}, transfer_s={1: [0.7], 8: [0.11]})
        cal = Calibration(src="dc1-h2", dst="dc2-h1", nbytes=nbytes, latency_s=0.025, paths=[pc],
                          lan_tensor_rate_bps=lan_bps, lan_loaded_rate_bps=loaded_bps)
        cal.mirror_primary()
        setup = plan_variant(variant, scenario, scenario.workload, None, cal, None)
        assert setup.prediction is not None
        return setup.prediction.iteration_time_s

    assert predicted(1e9) > predicted(None) + 0.05  # 8.4 MB: 67 ms a hop at 1 Gbit/s, 7 at 10
    # the loaded rate, for the tensors inside a DC that leave while a WAN channel of their ranks moves
    assert predicted(5e9, 1e9) > predicted(5e9) + 0.05
    assert predicted(5e9, 1e10) == pytest.approx(predicted(5e9))  # never faster than alone


def test_only_a_channel_inside_a_dc_whose_ranks_use_the_wan_is_loaded_and_never_gloo_s() -> None:
    """Stages 0-1 in dc1, 2-3 in dc2: both boundaries inside a DC share a rank with the
    WAN boundary (1-2), each loaded by its two directions' channels."""
    from testbed_core.planning.prediction import channel_resource

    scenario, _ = load_scenario(UNEQUAL)
    nbytes = scenario.workload.effective(None).wire_activation_bytes
    pc = PathCalibration(dcs=("dc1", "dc2"), src="dc1-h2", dst="dc2-h1", nbytes=nbytes, latency_s=0.025,
                         rates_bps={1: 1e8, 8: 8e8}, transfer_s={1: [0.7], 8: [0.11]})
    cal = Calibration(src="dc1-h2", dst="dc2-h1", nbytes=nbytes, latency_s=0.025, paths=[pc],
                      lan_tensor_rate_bps=5e9, lan_loaded_rate_bps=1e9)
    cal.mirror_primary()
    paths = plan_variant("atlas", scenario, scenario.workload, None, cal, None).prediction.spec.paths
    wan = {channel_resource(0, 1, "fwd"), channel_resource(0, 1, "bwd")}
    for b in (0, 2):
        for d in ("fwd", "bwd"):
            assert set(paths[(0, b, d)].loaded_by) == wan and paths[(0, b, d)].loaded_bps == pytest.approx(1e9)
    assert paths[(0, 1, "fwd")].loaded_bps is None
    gloo = plan_variant("torch-gloo", scenario, scenario.workload, None, cal, None).prediction.spec.paths
    assert all(p.loaded_bps is None for p in gloo.values())


def test_the_device_overhead_probe_holds_a_real_device_and_keeps_the_median(tmp_path) -> None:
    import testbed.run.calibration as calibration

    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=1000, latency_s=0.025)
    lines: list[str] = []
    progress = Progress(label="t", tty=False)
    progress.log = lines.append  # type: ignore[method-assign]
    calibration.calibrate_host_ops(tmp_path, cal, progress)
    assert len(cal.op_overhead_samples_s) == calibration.OPS_COUNT
    assert all(0.0 <= x < 0.5 for x in cal.op_overhead_samples_s)
    assert cal.op_overhead_s == pytest.approx(sorted(cal.op_overhead_samples_s)[calibration.OPS_COUNT // 2], abs=0.01)
    # the holds are on the device's own timeline, as a worker's are
    timeline = (tmp_path / "devices" / "calibration-ops.timeline.jsonl").read_text().splitlines()
    assert len(timeline) == calibration.OPS_WARMUP + calibration.OPS_COUNT
    assert "an emulated device's hold past its modelled time, 40 holds of 2 ms: median" in lines[-1]
    back = Calibration.from_report(CalibrationReport.model_validate_json(cal.report().model_dump_json()))
    assert back.op_overhead_s == cal.op_overhead_s and back.op_overhead_samples_s == cal.op_overhead_samples_s
    assert "op_overhead_s" in cal.report().method
