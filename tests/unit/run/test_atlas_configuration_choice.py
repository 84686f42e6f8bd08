"""Atlas follows its own calibrated prediction (testbed/run/variants.py
`_choose_configuration`): of the stream counts the calibration timed (one included),
both ways of sharing the links and its own and the baseline's placement, it runs the
one predicted fastest, keeping its own within CHOICE_MARGIN and a temporal plan only
where no shared way is predicted within TEMPORAL_MARGIN of it, and the summary lists
every candidate. The case that asked for it: sweep-rtt at 5 ms RTT, where atlas's 8-stream
plan was predicted 2.03 s against the one-stream baseline's 1.78 s and ran anyway (2.05
against 1.85 s measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run import variants as variants_module
from testbed.run.calibration import Calibration
from testbed.run.scenario import load_scenario
from testbed.run.variants import CHOICE_MARGIN, TEMPORAL_MARGIN, plan_variant, variant_placement
from testbed_core.contracts.summary import ConfigurationCandidate, VariantResult
from testbed_core.variants import get_variant

ROOT = Path(__file__).resolve().parents[3]


def _sweep_point(delay: str, **sets: object):
    """A sweep-rtt point: atlas-2dc (dp=2, pp=2, 8 micro-batches of 8 MiB, 1 Gbit/s) at `delay` one way."""
    return load_scenario(ROOT / "scenarios/atlas-2dc.yaml",
                         {"topology.wan.0.delay": delay, "transport.pacing": True, **sets})[0]


def _cal(latency_s: float, one: float, eight: float, colliding_8: float) -> Calibration:
    return Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=latency_s,
                       rates_bps={1: one, 8: eight}, colliding_bps={8: colliding_8})


def _plan(name: str, scenario, cal: Calibration, others=()):
    return plan_variant(name, scenario, scenario.workload, scenario.workload_dir, cal, None, others=others)


def test_at_5_ms_atlas_runs_one_stream_where_its_prediction_says_so() -> None:
    """One stream fills most of the link at 5 ms; 8 streams measured 700 Mbit/s, so the
    stream policy keeps 8 and the plan (its transfers held token_margin longer) is
    predicted slower than one stream per channel side by side: the baseline's way."""
    sc = _sweep_point("5ms")
    cal = _cal(0.005, 5.3e8, 7.0e8, 6.0e8)
    atlas, baseline = _plan("atlas", sc, cal), _plan("baseline", sc, cal)
    configs = atlas.configurations
    assert configs is not None
    weighed = {(c.streams, c.sharing) for c in configs}
    assert weighed == {(1, "shared"), (1, "temporal"), (8, "shared"), (8, "temporal")}
    own = next(c for c in configs if c.own)
    assert (own.streams, own.sharing) == (8, "temporal")  # what it ran before
    taken = [c for c in configs if c.taken]
    assert len(taken) == 1 and (taken[0].streams, taken[0].sharing) == (1, "shared")
    times = [c.predicted_iteration_time_s for c in configs]
    assert times == sorted(times) and taken[0] is configs[0]
    assert own.predicted_iteration_time_s > 1.1 * taken[0].predicted_iteration_time_s
    # what runs is what was predicted fastest, and it is the baseline's configuration
    assert atlas.streams == 1 and atlas.sharing == "shared" and atlas.prediction.plan is None
    assert atlas.variant.streams == 1 and atlas.variant.sharing == "shared"
    assert atlas.prediction.iteration_time_s == pytest.approx(taken[0].predicted_iteration_time_s)
    assert atlas.prediction.iteration_time_s == pytest.approx(baseline.prediction.iteration_time_s, rel=1e-9)
    assert atlas.rate_bps == pytest.approx(5.3e8)
    assert atlas.sharing_alternatives == {"temporal": own.predicted_iteration_time_s,
                                          "shared": pytest.approx(next(
                                              c.predicted_iteration_time_s for c in configs
                                              if (c.streams, c.sharing) == (8, "shared")))}


def test_its_own_configuration_stays_within_the_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = _sweep_point("5ms")
    cal = _cal(0.005, 5.3e8, 7.0e8, 6.0e8)
    monkeypatch.setattr(variants_module, "CHOICE_MARGIN", 0.5)  # one stream is 15% faster: not enough now
    monkeypatch.setattr(variants_module, "TEMPORAL_MARGIN", -0.5)  # and the plan gives way only to a far faster way
    atlas = _plan("atlas", sc, cal)
    assert atlas.streams == 8 and atlas.sharing == "temporal" and atlas.prediction.plan is not None
    assert [c.own for c in atlas.configurations if c.taken] == [True]


@pytest.mark.parametrize(("delay", "cal"), [
    ("5ms", _cal(0.005, 5.255e8, 8.32e8, 7.34e8)),   # the kept sweep-rtt point's calibration
    ("5ms", _cal(0.005, 5.3e8, 7.0e8, 6.0e8)),
    ("25ms", _cal(0.025, 1.09e8, 7.33e8, 6.5e8)),
    ("25ms", _cal(0.025, 1.09e8, 5.0e8, 8.8e8)),     # 8-stream channels fit side by side: multi-tcp's way
    ("100ms", _cal(0.05, 5.5e7, 4.72e8, 3.72e8)),
], ids=["5ms-kept", "5ms-slow-8", "25ms", "25ms-side-by-side", "100ms"])
def test_atlas_is_never_predicted_slower_than_baseline_or_multi_tcp(delay: str, cal: Calibration) -> None:
    """The issue's target, as the prediction sees it: at every sweep point atlas's
    prediction is within CHOICE_MARGIN of the faster of baseline and multi-tcp, or ahead."""
    sc = _sweep_point(delay)
    atlas, baseline, multi = (_plan(n, sc, cal) for n in ("atlas", "baseline", "multi-tcp"))
    fastest_other = min(baseline.prediction.iteration_time_s, multi.prediction.iteration_time_s)
    assert atlas.prediction.iteration_time_s <= fastest_other * (1 + CHOICE_MARGIN)
    taken = next(c for c in atlas.configurations if c.taken)
    assert taken.predicted_iteration_time_s == pytest.approx(atlas.prediction.iteration_time_s)
    fastest = min(atlas.configurations, key=lambda c: c.predicted_iteration_time_s)
    margin = TEMPORAL_MARGIN if fastest.sharing == "temporal" and atlas.sharing == "shared" else CHOICE_MARGIN
    assert fastest.predicted_iteration_time_s >= atlas.prediction.iteration_time_s / (1 + margin) - 1e-12


@pytest.mark.parametrize(("rate_8", "colliding_8", "sharing"), [
    (7.38e8, 8.0e8, "shared"),    # the demo's calibration: the plan predicted 2% faster, ran 7% over it
    (7.38e8, 6.0e8, "temporal"),  # side by side the channels lose a quarter of the link: the plan, clearly
])
def test_a_plan_runs_only_where_it_is_predicted_clearly_faster(rate_8: float, colliding_8: float,
                                                                sharing: str) -> None:
    """The quickstart (the demo's run, 25 ms one way): the temporal plan is predicted a
    little faster than the same 8-stream channels sharing the link; within
    TEMPORAL_MARGIN the shared way runs (the plan's own prediction is listed, not taken)."""
    sc = load_scenario(ROOT / "scenarios/quickstart.yaml", {"bubbletea.enabled": False, "transport.pacing": True})[0]
    atlas = _plan("atlas", sc, _cal(0.025, 1.09e8, rate_8, colliding_8))
    by_way = {(c.streams, c.sharing): c.predicted_iteration_time_s for c in atlas.configurations}
    plan, shared = by_way[(8, "temporal")], by_way[(8, "shared")]
    assert plan < shared  # the plan is predicted faster either way
    assert (shared <= plan * (1 + TEMPORAL_MARGIN)) == (sharing == "shared")
    assert atlas.streams == 8 and atlas.sharing == sharing
    assert (atlas.prediction.plan is None) == (sharing == "shared")
    own = next(c for c in atlas.configurations if c.own)
    assert (own.streams, own.sharing) == (8, "temporal")
    assert own.taken == (sharing == "temporal")


def test_at_100_ms_the_plan_gives_way_to_sharing_within_the_margin() -> None:
    """sweep-rtt at 100 ms RTT (its calibration of 2026-12-05): 8-stream channels are
    window-limited (517 Mbit/s alone on 1 Gbit/s, 574 in all side by side), the plan is
    predicted about 4% faster than sharing, and ran 28% slower than multi-tcp (channels
    left at the warm-up's windows); within TEMPORAL_MARGIN it is listed, not run."""
    sc = _sweep_point("50ms")
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.05,
                      rates_bps={1: 5.46e7, 8: 5.17e8, 16: 3.70e8}, colliding_bps={8: 5.74e8})
    atlas, multi = _plan("atlas", sc, cal), _plan("multi-tcp", sc, cal)
    by_way = {(c.streams, c.sharing): c.predicted_iteration_time_s for c in atlas.configurations}
    assert by_way[(8, "temporal")] < by_way[(8, "shared")] <= by_way[(8, "temporal")] * (1 + TEMPORAL_MARGIN)
    assert (atlas.streams, atlas.sharing) == (8, "shared") and atlas.prediction.plan is None
    assert atlas.prediction.iteration_time_s == pytest.approx(multi.prediction.iteration_time_s, rel=1e-9)


def test_the_baseline_s_placement_is_a_candidate() -> None:
    """atlas-3dc: Atlas's heuristic puts three stages in the big DC, the even placement
    spreads them; with the baseline's placement passed (plan_variants passes the
    placements of the run's baseline-placed variants), both are weighed."""
    sc = load_scenario(ROOT / "scenarios/atlas-3dc.yaml", {})[0]
    even = variant_placement(get_variant("baseline"), sc)
    own = variant_placement(get_variant("atlas"), sc)
    assert even.stage_dc != own.stage_dc
    cal = Calibration(src="big-h1", dst="mid-h1", nbytes=sc.workload.effective(sc.workload_dir).wire_activation_bytes,
                      latency_s=0.02, rates_bps={1: 1.0e8, 8: 6.0e8}, colliding_bps={8: 5.0e8})
    atlas = _plan("atlas", sc, cal, others=[even])
    configs = atlas.configurations
    places = {c.placement for c in configs}
    assert places == {"atlas", "even (the baseline's)"}
    assert {tuple(c.stage_dcs) for c in configs} == {own.stage_dc[0], even.stage_dc[0]}
    taken = next(c for c in configs if c.taken)
    assert atlas.placement.stage_dc[0] == tuple(taken.stage_dcs)


def test_only_atlas_with_auto_sharing_and_a_calibration_chooses() -> None:
    sc = _sweep_point("5ms")
    cal = _cal(0.005, 5.3e8, 7.0e8, 6.0e8)
    for name in ("baseline", "multi-tcp"):
        assert _plan(name, sc, cal).configurations is None
    forced = _sweep_point("5ms", **{"runner.atlas_sharing": "temporal"})
    setup = _plan("atlas", forced, cal)
    assert setup.configurations is None and setup.streams == 8 and setup.sharing == "temporal"
    uncalibrated = plan_variant("atlas", sc, sc.workload, sc.workload_dir, None, None)
    assert uncalibrated.configurations is None


def test_the_summary_keeps_the_candidates() -> None:
    c = ConfigurationCandidate(streams=1, sharing="shared", placement="atlas", stage_dcs=["dc1", "dc2"],
                               predicted_iteration_time_s=1.78, taken=True, own=False)
    assert "configurations" in VariantResult.model_fields
    assert ConfigurationCandidate.model_validate(c.model_dump()) == c
    with pytest.raises(ValueError, match="sharing"):
        ConfigurationCandidate(streams=1, sharing="sometimes", placement="atlas", stage_dcs=[],  # type: ignore[arg-type]
                               predicted_iteration_time_s=1.0, taken=False, own=False)


def test_one_pipeline_weighs_sharing_at_every_timed_count_without_a_collision_probe() -> None:
    """A run of one pipeline has no two channels on a path, so the calibration times no
    collision; atlas must still weigh the configured count shared (multi-TCP's way). The
    case: scenarios/lossy-4dc.yaml, where it could not, and ran an 8-stream plan
    predicted 1.572 s against multi-TCP's 1.435 (the kept run at 2c37227). Here atlas-2dc
    with one pipeline of 4 stages: one stream nearly fills the link, so the stream
    policy keeps one, and 8 streams shared is predicted faster: weighed and taken,
    predicted as multi-TCP."""
    sc = load_scenario(ROOT / "scenarios/atlas-2dc.yaml",
                       {"workload.parallelism.dp": 1, "workload.parallelism.pp": 4})[0]
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.025,
                      rates_bps={1: 9.5e8, 8: 9.6e8})
    atlas, multi = _plan("atlas", sc, cal), _plan("multi-tcp", sc, cal)
    configs = {(c.streams, c.sharing): c for c in atlas.configurations}
    assert configs[(1, "shared")].own and (8, "shared") in configs and (8, "temporal") in configs
    assert (atlas.streams, atlas.sharing) == (8, "shared") == (multi.streams, multi.sharing)
    assert atlas.prediction.iteration_time_s == pytest.approx(multi.prediction.iteration_time_s, rel=1e-9)
    assert atlas.prediction.iteration_time_s < configs[(1, "shared")].predicted_iteration_time_s


def test_two_pipelines_on_one_path_still_need_their_collision_timed() -> None:
    """Where two pipelines' channels cross a path, sharing at a count above one is
    weighed only where that count's collision was timed (the prediction needs their
    aggregate); where one pipeline crosses each path, its alone figure is enough."""
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8 << 20, latency_s=0.005,
                      rates_bps={1: 5.3e8, 4: 6.5e8, 8: 7.0e8}, colliding_bps={8: 6.0e8})
    two = _sweep_point("5ms")  # dp=2: both pipelines cross dc1-dc2
    placement = variant_placement(get_variant("atlas"), two, two.workload)
    assert variants_module._collision_timed(placement, two, cal, 8)
    assert not variants_module._collision_timed(placement, two, cal, 4)
    one = load_scenario(ROOT / "scenarios/atlas-2dc.yaml", {"workload.parallelism.dp": 1})[0]
    placement = variant_placement(get_variant("atlas"), one, one.workload)
    assert variants_module._collision_timed(placement, one, cal, 4)
    assert not variants_module._collision_timed(placement, one, cal, 2)  # never timed at all
