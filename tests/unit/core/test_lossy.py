"""The short-transfer loss model (testbed_core/planning/lossy.py): its pieces against
hand-computed figures, a channel's time with the losses placed by hand, and the whole
model against what TCP theory says of a long flow."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from testbed_core.planning.lossy import (
    ALPHA,
    _Channel,
    channel_time,
    chunk_bytes,
    lossy_flow_rate,
    mathis_window,
    pto_s,
    repair_delay,
    rto_s,
    run_times,
    service_factors,
    spread_makespan,
    stripe_loss_probability,
)
from testbed_core.planning.network import MSS, NetParams, loss_limited_rate, wan_path
from testbed_core.topology import parse_topology


class _Never:
    """Draws that never lose a tail-loss probe."""

    def random(self) -> float:
        return 0.99


def _gaps(*values: int) -> Iterator[int]:
    yield from values
    while True:
        yield 1 << 40  # no further loss


def test_the_pieces_numbers() -> None:
    # Cubic's Reno-friendly AIMD: increase 3 x 0.3 / 1.7 = 0.529 per RTT, decrease to 0.7:
    # average window sqrt(0.529 x 1.7 / (2 x 0.3 x 0.001)) = sqrt(1500) = 38.73 packets at 0.1%,
    # Mathis's 1.22 / sqrt(p) (1.2247 / 0.03162 = 38.73)
    assert ALPHA == pytest.approx(0.52941, rel=1e-4)
    assert mathis_window(0.001) == pytest.approx(38.730, rel=1e-4)
    # 72 packets (a 0.84 MB tensor over 8 streams, as the brief has it): 1 - 0.999^72
    assert stripe_loss_probability(72 * MSS, 0.001) == pytest.approx(0.069503, rel=1e-4)
    assert stripe_loss_probability(1, 0.001) == pytest.approx(0.001)
    # Linux: probe timeout 2 RTT (at least 10 ms), retransmission timeout RTT + 200 ms
    assert pto_s(0.05) == pytest.approx(0.1) and pto_s(0.002) == pytest.approx(0.010)
    assert rto_s(0.05) == pytest.approx(0.25)
    # what a loss in a stripe's last round costs, by how many packets follow it
    assert repair_delay(3, 0.05) == pytest.approx(0.05)  # fast retransmit: one RTT
    assert repair_delay(1, 0.05) == pytest.approx(0.0625)  # RACK's reordering window first
    assert repair_delay(0, 0.05) == pytest.approx(0.1)  # the last packet: the probe
    assert repair_delay(0, 0.05, probe_lost=True) == pytest.approx(0.25)  # and its timeout


def test_chunks_follow_the_transport() -> None:
    assert chunk_bytes(838_861, 8) == 128 << 10  # 52 KiB shares: the 128 KiB floor, 7 chunks
    assert chunk_bytes(8 << 20, 8) == 512 << 10  # two 512 KiB chunks per stream
    assert chunk_bytes(8 << 20, 1) == 4 << 20  # one stream: the default 4 MiB chunk


def test_a_loss_free_channel_is_its_window_rounds() -> None:
    # 8 MiB on one stream, window 512 kB = 353.6 packets (353 a round): 5,794 packets in
    # 17 rounds; the last leaves at 16 x 10 ms and lands 5 ms later, plus 67.1 ms at 1 Gbit/s
    t = channel_time(8 << 20, 1, 0.01, 0.0, 512e3, 1e9)
    assert t == pytest.approx(16 * 0.01 + 0.005 + (8 << 20) * 8 / 1e9)


@pytest.mark.parametrize(("gap", "extra"), [
    (50, 0.0),  # lost in the second round of three: repaired while the third goes out
    (90, 0.05),  # lost in the last round with 10 after it: fast retransmit, one RTT
    (99, 0.0625),  # one after it: RACK waits a quarter RTT more
    (100, 0.1),  # the stripe's last packet: the tail-loss probe, 2 RTT after it left
])
def test_where_the_loss_falls_decides_what_it_costs(gap: int, extra: float) -> None:
    # one stream, 100 packets, 0.1% loss (window 38.73: rounds of 38, 39, then 23), 50 ms RTT;
    # the loss-free time: the last round leaves at 2 x 50 ms and lands 25 ms later
    nbytes = 100 * MSS
    g = _gaps(gap)
    t = channel_time(nbytes, 1, 0.05, 0.001, 10e6, 1e9, transfers=1, warmup=0, gaps=lambda: next(g), draws=_Never())
    assert t == pytest.approx(0.125 + extra + nbytes * 8 / 1e9)


def test_the_channel_waits_for_its_slowest_stripe() -> None:
    # 8 streams, 0.84 MB: 7 chunks of 128 KiB (91 packets, the last 37): each on its own
    # stream in three rounds (38, 39, 14), the seventh in one. Stream 2 loses its 91st
    # packet (its stripe's last): the whole tensor waits the probe's 100 ms
    nbytes = 838_861
    order = iter([1 << 40, 91] + [1 << 40] * 6)
    t = channel_time(nbytes, 8, 0.05, 0.001, 10e6, 1e9, transfers=1, warmup=0,
                     gaps=lambda: next(order, 1 << 40), draws=_Never())
    assert t == pytest.approx(2 * 0.05 + 0.025 + 0.1 + nbytes * 8 / 1e9)


def test_a_long_flow_comes_to_mathis_and_short_stripes_fall_below_it() -> None:
    # one stream, 8 MiB tensors at 10 ms RTT (5.8 losses each): within 5% of 1.22 MSS / (RTT sqrt p)
    mathis = loss_limited_rate(0.01, 0.001)
    one = lossy_flow_rate(8 << 20, 1, 0.01, 0.001, 512e3, 1e9)
    assert one == pytest.approx(mathis, rel=0.05)
    # eight streams of 91-packet stripes at 50 ms: each stripe is two or three rounds of its
    # window, the channel waits for the slowest and for the repairs of its last rounds
    eight = lossy_flow_rate(838_861, 8, 0.05, 0.001, 512e3, 1e9)
    assert eight < 0.7 * loss_limited_rate(0.05, 0.001)
    # the same inputs, the same figure (seeded draws)
    assert channel_time(838_861, 8, 0.05, 0.001, 512e3, 1e9) == channel_time(838_861, 8, 0.05, 0.001, 512e3, 1e9)


def test_slow_start_after_idle_costs_every_transfer_its_ramp() -> None:
    # 0.84 MB on one stream at 50 ms (580 packets): from the initial 10 packets slow start
    # takes rounds the kept window (about 38) does not
    kept = channel_time(838_861, 1, 0.05, 0.001, 4e6, 1e9)
    restarted = channel_time(838_861, 1, 0.05, 0.001, 4e6, 1e9, idle_restart=True)
    assert restarted > kept + 0.05


def _topo(loss: str | float):
    return parse_topology({"name": "t", "tcp": {"rmem_max": "1MB", "wmem_max": "1MB"},
                           "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                           "wan": [{"between": ["a", "b"], "rate": "1Gbit", "delay": "25ms", "loss": loss}]})


def test_the_planner_holds_a_lossy_channel_to_it() -> None:
    from testbed_core.constants import RMEM_FRACTION

    lossy, clean = _topo("0.1%"), _topo(0)
    window = RMEM_FRACTION * 1e6  # what a receiver advertises of its 1 MB buffer
    path = wan_path(lossy, "a", "b", 8, NetParams(), transfer_bytes=838_861)
    assert path.flow_rate_bps == pytest.approx(lossy_flow_rate(838_861, 8, 0.05, 0.001, window, 1e9))
    assert path.flow_rate_bps < loss_limited_rate(0.05, 0.001)
    # without a size: Mathis's long flow, as before; without loss: the size changes nothing
    assert wan_path(lossy, "a", "b", 8, NetParams()).flow_rate_bps == pytest.approx(loss_limited_rate(0.05, 0.001))
    assert (wan_path(clean, "a", "b", 8, NetParams(), transfer_bytes=838_861).flow_rate_bps
            == wan_path(clean, "a", "b", 8, NetParams()).flow_rate_bps == pytest.approx(window * 8 / 0.05))  # over 50 ms
    # a measured rate below the model stands
    slow = NetParams(path_flow_rate_bps={("a", "b"): 1e6})
    assert wan_path(lossy, "a", "b", 8, slow, transfer_bytes=838_861).flow_rate_bps == 1e6
    assert math.isfinite(path.rate_bps)


def test_the_fast_what_if_sees_the_same_loss_model() -> None:
    # the fast predictor passes the tensor size to wan_path as build_spec does: on a lossy
    # link both give the same iteration of mean transfers, one stream and eight; the exact
    # one then adds the spread of the lossy transfers' times (`spread_makespan`), which only
    # lengthens it
    from testbed_core.planning.prediction import Variant, predict
    from testbed_core.variants import REGISTRY
    from testbed_core.whatif.predict import fast_predict
    from testbed_core.workload import parse_workload

    topo = parse_topology({"name": "t", "tcp": {"rmem_max": "1MB", "wmem_max": "1MB"},
                           "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
                           "wan": [{"between": ["a", "b"], "rate": "1Gbit", "delay": "25ms", "loss": "0.1%"}]})
    wl = parse_workload({"name": "w", "model": {"layers": 4, "hidden": 1024, "heads": 8, "seq_len": 512, "vocab": 1000},
                         "parallelism": {"dp": 2, "pp": 2, "num_micro_batches": 4, "schedule": "1f1b"},
                         "gpu": {"type": "A100", "efficiency": 0.5}, "scale": 0.5})
    for name in ("baseline", "multi-tcp"):
        exact = predict(topo, wl, Variant.of(REGISTRY[name], 8))
        fast = fast_predict(topo, wl, Variant.of(REGISTRY[name], 8), placement=exact.placement)
        assert fast.iteration_time_s == pytest.approx(exact.sim.makespan + exact.allreduce_s, rel=1e-6)
        assert exact.iteration_time_s > exact.sim.makespan + exact.allreduce_s
        (path, *_) = exact.paths.values()
        # one stream of these tensors: about Mathis's rate (the model's steady state, a
        # what-if without a run's history); eight stripes: well under it
        mathis = loss_limited_rate(0.05, 0.001)
        if name == "multi-tcp":
            assert path.flow_rate_bps <= 0.8 * mathis
        else:
            assert path.flow_rate_bps == pytest.approx(mathis, rel=0.1)


def test_cubic_climbs_back_towards_the_window_it_lost() -> None:
    # one stream, no loss after a cut from 200 packets: Cubic's curve w_max + C (t - K)^3,
    # K = cbrt(200 x 0.3 / 0.4) = 5.31 s; at 60 ms a round it regains most of the 60 lost
    # within K (far faster than the Reno-friendly 0.53 a round: +50 in 87 rounds)
    ch = _Channel(1, 0.001, 1000, _Never(), False, gaps=lambda: 1 << 40)
    s = ch.streams[0]
    s.cwnd = 200.0
    ch._cut(s)
    assert s.cwnd == pytest.approx(140) and s.w_max == 200
    for _ in range(87):  # 5.2 s of sending
        ch._grow(s, int(s.cwnd), 0.06)
    assert 190 < s.cwnd < 201
    # a second loss below w_max: fast convergence lowers it to (1 + 0.7) / 2 of the window
    ch._cut(s)
    assert s.w_max == pytest.approx(s.cwnd / 0.7 * 0.85)


def test_slow_start_may_grow_past_the_receivers_window_but_sends_within_it() -> None:
    # a fresh stream: the initial 10 packets, doubling; Linux lets cwnd grow to twice what is
    # in flight, so the first loss of a window capped by the receiver at 100 packets leaves
    # cwnd at 140, still above what the receiver allows: the loss costs no rate
    ch = _Channel(1, 0.001, 100, _Never(), False, gaps=lambda: 1 << 40, fresh=True)
    s = ch.streams[0]
    assert s.cwnd == 10 and s.ssthresh == math.inf
    for _ in range(6):
        ch._grow(s, int(min(s.cwnd, ch.cap)), 0.05)
    assert s.cwnd == 200
    ch._cut(s)
    assert s.cwnd == pytest.approx(140) and min(s.cwnd, ch.cap) == 100


def test_a_short_run_on_fresh_connections_is_faster_than_the_steady_state() -> None:
    # the lossy 4-DC kind: 0.42 MB tensors, one stream, 60 ms, 256 KB windows; a run of one
    # warm-up and two measured iterations of 8 tensors: the windows start above the loss's
    # average and few losses (0.29 a tensor) bring them down
    steady = channel_time(419_430, 1, 0.06, 0.001, 262_144, 2e8)
    runs = run_times(419_430, 1, 0.06, 0.001, 262_144, 2e8, 8, 16)
    assert all(len(r) == 16 for r in runs) and len(runs) >= 20
    mean = sum(map(sum, runs)) / sum(map(len, runs))
    assert mean < 0.8 * steady
    # a long run comes near it
    long = run_times(419_430, 1, 0.06, 0.001, 262_144, 2e8, 400, 40)
    assert sum(map(sum, long)) / sum(map(len, long)) == pytest.approx(steady, rel=0.15)
    # the planner's rate follows the history it is given
    assert (lossy_flow_rate(419_430, 1, 0.06, 0.001, 262_144, 2e8, history=(8, 16))
            > lossy_flow_rate(419_430, 1, 0.06, 0.001, 262_144, 2e8))


def test_pacing_spreads_the_last_round() -> None:
    # one window's worth (100 packets, window 100) on a long-lived stream: unpaced it lands
    # half a round trip after it left; paced at 1.2 x cwnd a round trip its last packet
    # leaves 99 / 120 of a round trip later
    nbytes = 100 * MSS
    plain = channel_time(nbytes, 1, 0.05, 1e-12, 100 * MSS, 1e15, transfers=1, warmup=0)
    paced = channel_time(nbytes, 1, 0.05, 1e-12, 100 * MSS, 1e15, transfers=1, warmup=0, paced=True)
    assert plain == pytest.approx(0.025, abs=1e-6)
    assert paced == pytest.approx(0.025 + 99 / 120 * 0.05, abs=1e-6)


def test_the_spread_lengthens_a_pipeline_that_waits_on_it() -> None:
    from testbed_core.schedules import build_schedule
    from testbed_core.simulate import Path as SimPath
    from testbed_core.simulate import Resource, SimSpec, simulate

    sched = build_schedule("1f1b", 2, 8)
    link = ("wan:a->b",)
    spec = SimSpec(sched, 1, [0.01, 0.01], [0.02, 0.02], [1e6], [1e6],
                   paths={(0, 0, "fwd"): SimPath(("chan:f", *link), 0.025),
                          (0, 0, "bwd"): SimPath(("chan:b", "wan:b->a"), 0.025)},
                   resources={"chan:f": Resource(8e7, "exclusive"), "chan:b": Resource(8e7, "exclusive"),
                              "wan:a->b": Resource(1e9), "wan:b->a": Resource(1e9)})
    flat = simulate(spec).makespan
    factors, block, per_run = service_factors(838_861, 1, 0.05, 0.001, 524_288, 1e9)
    assert block == 1 and per_run == 0 and sum(factors) / len(factors) == pytest.approx(1.0)
    # only the forward channel's route is lossy: its tensors take the spread, the mean kept
    spread = spread_makespan(spec, {link: (factors, block, per_run)}, simulate)
    assert spread > flat
    assert spread == spread_makespan(spec, {link: (factors, block, per_run)}, simulate)  # seeded
    # no lossy route: the plain simulation
    assert spread_makespan(spec, {}, simulate) == flat
    # every factor 1: the same iteration as without
    assert spread_makespan(spec, {link: ((1.0,), 1, 0)}, simulate, runs=3) == pytest.approx(flat)


def test_a_runs_channels_come_down_from_slow_start_together() -> None:
    # two lossy channels (forward a->b, backward b->a) whose replicas run a fast
    # iteration (fresh windows) then a slow one: each simulation takes the same
    # iteration on both, so the mean iteration is the mean of the all-fast and the
    # all-slow iterations, never a fast forward with a slow backward
    from testbed_core.schedules import build_schedule
    from testbed_core.simulate import Path as SimPath
    from testbed_core.simulate import Resource, SimSpec, simulate

    spec = SimSpec(build_schedule("1f1b", 2, 8), 1, [0.01, 0.01], [0.02, 0.02], [838_861.0], [838_861.0],
                   paths={(0, 0, "fwd"): SimPath(("chan:f", "wan:a->b"), 0.025),
                          (0, 0, "bwd"): SimPath(("chan:b", "wan:b->a"), 0.025)},
                   resources={"chan:f": Resource(1e7, "exclusive"), "chan:b": Resource(1e7, "exclusive"),
                              "wan:a->b": Resource(1e9), "wan:b->a": Resource(1e9)})
    run = (0.4,) * 8 + (1.6,) * 8  # one replica: two iterations of 8 tensors
    fwd = (run * 5, 8, 16)
    bwd = (run * 7, 8, 16)
    spread = spread_makespan(spec, {("wan:a->b",): fwd, ("wan:b->a",): bwd}, simulate)

    def flat(f: float) -> float:
        return spread_makespan(spec, {("wan:a->b",): ((f,), 1, 0), ("wan:b->a",): ((f,), 1, 0)}, simulate, runs=1)

    assert spread == pytest.approx((flat(0.4) + flat(1.6)) / 2)
    # without the replica's length (a steady state's factors) the blocks are drawn each
    # on its own: fast and slow iterations mixed
    mixed = spread_makespan(spec, {("wan:a->b",): (*fwd[:2], 0), ("wan:b->a",): (*bwd[:2], 0)}, simulate)
    assert mixed != pytest.approx(spread)


def test_a_run_longer_than_the_simulations_is_taken_over_its_whole_length() -> None:
    # one replica of 64 iterations whose windows come down halfway (fast, then slow): 32
    # simulations take every other iteration of the whole run, not its first 32 (all
    # fast), so the mean iteration is the mean of the fast and the slow ones
    from testbed_core.planning.lossy import _iteration
    from testbed_core.schedules import build_schedule
    from testbed_core.simulate import Path as SimPath
    from testbed_core.simulate import Resource, SimSpec, simulate

    assert sorted(_iteration(k, 32, 8) for k in range(32)) == sorted(list(range(8)) * 4)
    assert [_iteration(k, 4, 16) for k in range(4)] == [2, 6, 10, 14]
    spec = SimSpec(build_schedule("1f1b", 2, 8), 1, [0.01, 0.01], [0.02, 0.02], [838_861.0], [838_861.0],
                   paths={(0, 0, "fwd"): SimPath(("chan:f", "wan:a->b"), 0.025)},
                   resources={"chan:f": Resource(1e7, "exclusive"), "wan:a->b": Resource(1e9)})
    run = (0.5,) * 8 * 32 + (1.5,) * 8 * 32

    def flat(f: float) -> float:
        return spread_makespan(spec, {("wan:a->b",): ((f,), 1, 0)}, simulate, runs=1)

    spread = spread_makespan(spec, {("wan:a->b",): (run, 8, 64 * 8)}, simulate, runs=32)
    assert spread == pytest.approx((flat(0.5) + flat(1.5)) / 2)


def test_the_simulations_take_every_replica_before_any_twice() -> None:
    # three replicas of a two-iteration run, each iteration's tensors all alike: six
    # simulations take each (replica, iteration) once, twelve each twice, so the mean
    # iteration is the mean of the six, whatever the seed, not of six random draws
    from testbed_core.planning.lossy import SPREAD_RUNS
    from testbed_core.schedules import build_schedule
    from testbed_core.simulate import Path as SimPath
    from testbed_core.simulate import Resource, SimSpec, simulate

    spec = SimSpec(build_schedule("1f1b", 2, 8), 1, [0.01, 0.01], [0.02, 0.02], [838_861.0], [838_861.0],
                   paths={(0, 0, "fwd"): SimPath(("chan:f", "wan:a->b"), 0.025)},
                   resources={"chan:f": Resource(1e7, "exclusive"), "wan:a->b": Resource(1e9)})
    levels = [(0.5, 1.0), (0.8, 1.2), (0.6, 1.6)]
    factors = (tuple(x for a, b in levels for x in (a,) * 8 + (b,) * 8), 8, 16)

    def flat(f: float) -> float:
        return spread_makespan(spec, {("wan:a->b",): ((f,), 1, 0)}, simulate, runs=1)

    exact = sum(flat(x) for pair in levels for x in pair) / 6
    for seed in (1, 2, 3):
        for runs in (6, 12):
            assert spread_makespan(spec, {("wan:a->b",): factors}, simulate, runs, seed) == pytest.approx(exact)
    # the planner's default takes enough simulations that a 25% spread of the
    # iterations leaves its mean within about 1% (lossy-4dc: 0.6-0.7% over seeds)
    assert SPREAD_RUNS >= 256


def test_one_short_runs_mean_may_fall_far_from_the_expected_iteration() -> None:
    from testbed_core.planning.lossy import run_interval
    from testbed_core.schedules import build_schedule
    from testbed_core.simulate import Path as SimPath
    from testbed_core.simulate import Resource, SimSpec, simulate

    spec = SimSpec(build_schedule("1f1b", 2, 8), 1, [0.01, 0.01], [0.02, 0.02], [838_861.0], [838_861.0],
                   paths={(0, 0, "fwd"): SimPath(("chan:f", "wan:a->b"), 0.025)},
                   resources={"chan:f": Resource(1e7, "exclusive"), "wan:a->b": Resource(1e9)})
    factors = service_factors(838_861, 1, 0.05, 0.001, 524_288, 1e9, history=(8, 16), block=8)
    assert factors[1] == 8 and len(factors[0]) % 16 == 0
    expected = spread_makespan(spec, {("wan:a->b",): factors}, simulate)
    lo, hi = run_interval(spec, {("wan:a->b",): factors}, simulate, 2, runs=60)
    assert lo < expected < hi and hi / lo > 1.1  # two iterations of a one-stream lossy channel: far apart


def test_the_shipped_lossy_scenario_says_where_one_run_may_fall() -> None:
    from pathlib import Path

    from testbed.run.runner import lossy_note
    from testbed.run.scenario import load_scenario
    from testbed.run.variants import lossy_history, plan_variant
    from testbed_core.planning.lossy import chance_interval

    root = Path(__file__).resolve().parents[3]
    sc, _ = load_scenario(root / "scenarios" / "lossy-4dc.yaml")
    # 1 warm-up and 8 measured iterations of 8 micro-batches; modelled workers send no warm-up tensor
    # (only real-device ones warm their channels, 2 MB a stream: testbed/training/worker/train.py)
    assert lossy_history(sc) == (8, 64, 0) and lossy_history(sc, warmed=False)[2] == 0
    real = sc.model_copy(update={"workload": sc.workload.model_copy(update={
        "gpu": sc.workload.gpu.model_copy(update={"mode": "real"})})})
    assert lossy_history(real) == (8, 64, 2 << 20) and lossy_history(real, warmed=False)[2] == 0
    setup = plan_variant("baseline", sc, sc.workload, sc.workload_dir, None, None)
    pred = setup.prediction
    note, band = lossy_note(pred, sc, sc.workload)
    assert band is not None and band[0] < pred.iteration_time_s < band[1]
    assert "falls by chance between" in note and "short-transfer loss model" in note
    # a topology without loss: no interval
    clean = sc.topology.model_copy(update={"wan": [w.model_copy(update={"loss": 0.0}) for w in sc.topology.wan]})
    assert chance_interval(pred, clean, 8) is None


def test_gloo_streams_are_timed_unpaced_on_a_paced_run() -> None:
    # transport.pacing paces atlas_transport's streams (SO_MAX_PACING_RATE); gloo's
    # sockets ask for no pacing, so the loss model times torch-gloo's tensors unpaced
    from pathlib import Path

    from testbed.run.scenario import load_scenario
    from testbed.run.variants import lossy_paced, plan_variant

    root = Path(__file__).resolve().parents[3]
    sc, _ = load_scenario(root / "scenarios" / "lossy-4dc.yaml")

    def pacing(on: bool):  # noqa: ANN202
        return sc.model_copy(update={"transport": sc.transport.model_copy(update={"pacing": on})})

    paced, unpaced = pacing(True), pacing(False)
    assert lossy_paced(paced) and not lossy_paced(paced, rendezvous=True) and not lossy_paced(unpaced)

    def iteration(name: str, scenario) -> float:  # noqa: ANN001
        return plan_variant(name, scenario, scenario.workload, scenario.workload_dir, None, None).prediction.iteration_time_s

    assert iteration("torch-gloo", paced) == iteration("torch-gloo", unpaced)
    assert iteration("baseline", paced) != iteration("baseline", unpaced)


def test_slow_start_grows_to_twice_the_flight_of_a_tensor_that_fits_its_window() -> None:
    # Linux grows a slow-start window while it is under twice the packets in flight
    # (tcp_is_cwnd_limited), not only in rounds the window held back: a fresh stream that
    # carries 91-packet stripes reaches 182, where window-limited rounds alone stop at 160
    ch = _Channel(1, 0.001, 10_000, _Never(), False, gaps=lambda: 1 << 40, fresh=True)
    for _ in range(4):
        ch.transfer([91], 0.05)
    assert ch.streams[0].cwnd == 182
    # after a loss (congestion avoidance) a round that does not fill the window grows nothing
    ch._cut(ch.streams[0])
    cut = ch.streams[0].cwnd
    ch.transfer([91], 0.05)
    assert ch.streams[0].cwnd == cut


def test_back_to_back_tensors_ride_one_flight() -> None:
    # three tensors handed at once queue on the same streams: each arrives after the one
    # before it, and their flight opens slow start wider than one tensor at a time does
    def fresh() -> _Channel:
        return _Channel(4, 0.001, 10_000, _Never(), False, gaps=lambda: 1 << 40, fresh=True)

    together = fresh()
    ends = together.transfer_many([[91, 91, 91, 19]] * 3, 0.05)
    assert ends == sorted(ends) and ends[0] < ends[-1]
    apart = fresh()
    for _ in range(3):
        apart.transfer([91, 91, 91, 19], 0.05)
    assert together.streams[0].cwnd > apart.streams[0].cwnd
    # a run whose iterations hand the channel its first three tensors at once: the later
    # iterations' tensors move faster than one at a time (the wider windows last)
    args = (419_430.0, 8, 0.05, 0.001, 2_000_000.0, 4e8, 8, 16)
    one = run_times(*args, paced=True)
    grouped = run_times(*args, paced=True, groups=(3, 1, 1, 1, 1, 1))
    assert len(grouped) == len(one) and all(len(r) == 16 for r in grouped)

    def mean(runs: tuple[tuple[float, ...], ...]) -> float:
        return sum(map(sum, runs)) / sum(map(len, runs))

    assert mean(grouped) < 0.95 * mean(one)
    # the factors keep the rate's mean (tensors one at a time) as their unit: the gain moves
    # the planner's mean iteration
    factors = service_factors(*args[:6], history=(8, 16), block=8, paced=True, groups=(3, 1, 1, 1, 1, 1))[0]
    assert sum(factors) / len(factors) < 0.95


def test_the_simulation_says_which_tensors_come_back_to_back() -> None:
    from testbed_core.planning.lossy import channel_groups
    from testbed_core.schedules import build_schedule
    from testbed_core.simulate import Path as SimPath
    from testbed_core.simulate import Resource, SimSpec, simulate

    # 1F1B over 4 stages, compute far shorter than a transfer: the first stage's warm-up
    # forwards (pp - 1) and its first steady one are handed to its channel at once
    def spec(policy: str) -> SimSpec:
        paths, resources = {}, {}
        for b in range(3):
            for d, (x, y) in (("fwd", (b, b + 1)), ("bwd", (b + 1, b))):
                paths[(0, b, d)] = SimPath((f"chan:{b}{d}", f"wan:{x}->{y}"), 0.025)
                resources[f"chan:{b}{d}"] = Resource(3e7, "exclusive")
                resources[f"wan:{x}->{y}"] = Resource(4e8, policy)  # type: ignore[arg-type]
        return SimSpec(build_schedule("1f1b", 4, 8), 1, [0.002] * 4, [0.004] * 4, [419_430.0] * 3,
                       [419_430.0] * 3, paths=paths, resources=resources)

    shared = spec("shared")
    groups = channel_groups(shared, simulate(shared))
    assert groups[("wan:0->1",)][0] == 4 and sum(groups[("wan:0->1",)]) == 8
    assert all(sum(g) == 8 for g in groups.values())
    # a planned (exclusive) link: its dispatcher hands the transport one tensor at a time
    planned = spec("exclusive")
    assert channel_groups(planned, simulate(planned)) == {}
