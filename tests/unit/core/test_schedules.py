"""Pipeline schedules against their known forms and torch's, and the simulator against
closed forms (devices driven through the schedules: tests/unit/training/test_executor.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from testbed_core.schedules import (
    Op,
    Schedule,
    ScheduleError,
    build_schedule,
    validate,
    with_transfers,
)
from testbed_core.simulate import (
    INF,
    Resource,
    SimSpec,
    SimulationError,
    TransferKey,
    max_min_rates,
    simulate,
)
from testbed_core.simulate import (
    Path as NetPath,
)

PAIRS = [(2, 4), (4, 8), (3, 6)]


def ideal(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


def uniform_spec(schedule: Schedule, pipelines: int, forward_s: float, backward_s: float) -> SimSpec:
    """Uniform stages, no network cost: the textbook setting."""
    n = schedule.stages
    return SimSpec(schedule, pipelines, [forward_s] * n, [backward_s] * n, [0.0] * (n - 1), [0.0] * (n - 1))


def forwards_before_first_backward(s: Schedule, rank: int) -> int:
    """Forwards a rank runs before its first backward: for 1F1B the p-s-1 warm-up
    forwards plus the first forward of the steady 1F1B phase."""
    kinds = [op.kind for op in s.compute_ops(rank)]
    return kinds.index("B") if "B" in kinds else len(kinds)


# ------------------------------------------------------------------ schedules

@pytest.mark.parametrize(("p", "m"), PAIRS + [(4, 2)])
def test_1f1b_known_form(p: int, m: int) -> None:
    s = build_schedule("1f1b", p, m)
    for stage in range(p):
        ops = s.compute_ops(stage)
        assert sum(op.kind == "F" for op in ops) == m and sum(op.kind == "B" for op in ops) == m
        warmup = min(p - stage - 1, m)  # Narayanan et al.: p - s - 1 warm-up forwards
        assert forwards_before_first_backward(s, stage) == min(warmup + 1, m)
        # steady state alternates F, B; cool-down is only B
        steady = ops[warmup: warmup + 2 * (m - warmup)]
        assert [op.kind for op in steady] == ["F", "B"] * (m - warmup)
        assert all(op.kind == "B" for op in ops[warmup + 2 * (m - warmup):])
        assert [op.mb for op in ops if op.kind == "F"] == list(range(m))
        assert [op.mb for op in ops if op.kind == "B"] == list(range(m))


def test_gpipe_known_form() -> None:
    s = build_schedule("gpipe", 3, 5)
    for stage in range(3):
        kinds = [op.kind for op in s.compute_ops(stage)]
        assert kinds == ["F"] * 5 + ["B"] * 5


def test_transfers_surround_compute() -> None:
    s = build_schedule("gpipe", 2, 1)
    assert [str(op) for op in s.ops[0]] == ["F0@s0", "SEND_F0@s0->s1", "RECV_B0@s0<-s1", "B0@s0"]
    assert [str(op) for op in s.ops[1]] == ["RECV_F0@s1<-s0", "F0@s1", "B0@s1", "SEND_B0@s1->s0"]


def _torch_compute_order(kind: str, p: int, m: int, v: int = 1) -> dict[int, list[tuple[str, int, int]]]:
    from torch.distributed.pipelining import schedules as sched  # torch is a pinned dependency

    if kind == "gpipe":
        order = sched.ScheduleGPipe._get_pipeline_order(SimpleNamespace(_num_stages=p, _n_microbatches=m))
    else:
        ns = SimpleNamespace(n_local_stages=v, microbatches_per_round=m // max(1, m // p), pp_group_size=p,
                             _n_microbatches=m)
        order = {r: sched.ScheduleInterleaved1F1B._calculate_single_rank_operations(ns, r) for r in range(p)}
    ct = sched._ComputationType
    names = {ct.FORWARD: "F", ct.FULL_BACKWARD: "B"}
    return {r: [(names[a.computation_type], a.microbatch_index, a.stage_index)
                for a in acts if a is not None and a.computation_type in names] for r, acts in order.items()}


@pytest.mark.parametrize(("kind", "p", "m", "v"),
                         [("gpipe", 2, 4, 1), ("gpipe", 4, 3, 1), ("interleaved-1f1b", 2, 4, 2),
                          ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 4, 4, 3)])
def test_compute_order_matches_torch_pipelining(kind: str, p: int, m: int, v: int) -> None:
    ours = build_schedule(kind, p, m, v)
    theirs = _torch_compute_order(kind, p, m, v)
    assert {r: [(o.kind, o.mb, o.stage) for o in ours.compute_ops(r)] for r in range(p)} == theirs


def test_interleaved_known_form() -> None:
    p, m, v = 4, 8, 2
    s = build_schedule("interleaved-1f1b", p, m, v)
    for r in range(p):
        warmup = (p - r - 1) * 2 + (v - 1) * p  # Megatron-LM
        assert forwards_before_first_backward(s, r) == warmup + 1
        assert {op.stage for op in s.compute_ops(r)} == {r, r + p}
    assert s.stages == 8 and s.rank_of(5) == 1


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ScheduleError, match=r"unknown schedule 'zb' \(allowed: gpipe, 1f1b, interleaved-1f1b\)"):
        build_schedule("zb", 2, 2)
    with pytest.raises(ScheduleError, match="multiple of p"):
        build_schedule("interleaved-1f1b", 4, 6, 2)
    with pytest.raises(ScheduleError, match="chunks=2 is only for interleaved"):
        build_schedule("1f1b", 2, 2, 2)
    # stage 1 runs its backward before its forward's input arrives -> deadlock
    order = [[Op("F", 0, 0), Op("B", 0, 0)], [Op("B", 0, 1), Op("F", 0, 1)]]
    with pytest.raises(ScheduleError, match="before its forward"):
        validate(Schedule("bad", 2, 1, 1, with_transfers(order, 2)))
    # stage 0 waits for the gradient before sending the activation: deadlock
    ops = ((Op("RECV_B", 0, 0, 1), Op("F", 0, 0), Op("SEND_F", 0, 0, 1), Op("B", 0, 0)),
           (Op("RECV_F", 0, 1, 0), Op("F", 0, 1), Op("B", 0, 1), Op("SEND_B", 0, 1, 0)))
    with pytest.raises(ScheduleError, match="deadlock, waiting: rank 0 at RECV_B0"):
        validate(Schedule("bad", 2, 1, 1, ops))


# ------------------------------------------------------------------ simulator

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), PAIRS)
def test_simulated_bubble_is_textbook_with_zero_delay(name: str, p: int, m: int) -> None:
    res = simulate(uniform_spec(build_schedule(name, p, m), 1, 1.0, 2.0))
    assert res.makespan == pytest.approx((m + p - 1) * 3.0)
    assert res.bubble_fraction() == pytest.approx(ideal(p, m), abs=1e-9)


def test_interleaved_bubble_shrinks_by_v() -> None:
    p, m, v = 4, 8, 2
    s = build_schedule("interleaved-1f1b", p, m, v)
    res = simulate(uniform_spec(s, 1, 1.0 / v, 2.0 / v))
    assert res.bubble_fraction() == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-9)
    assert res.bubble_fraction() < ideal(p, m)


def test_latency_and_rate_add_up_on_the_critical_path() -> None:
    # One micro-batch over one WAN boundary: F0 -> wire -> F1, B1 -> wire -> B0.
    s = build_schedule("gpipe", 2, 1)
    lat, rate, nbytes = 0.025, 1e9, 1_250_000  # 10 ms on the wire
    spec = SimSpec(s, 1, [0.1, 0.2], [0.3, 0.4], [nbytes], [nbytes],
                   paths={(0, 0, "fwd"): NetPath(("up",), lat), (0, 0, "bwd"): NetPath(("down",), lat)},
                   resources={"up": Resource(rate), "down": Resource(rate)})
    res = simulate(spec)
    assert res.makespan == pytest.approx(0.1 + 0.035 + 0.2 + 0.4 + 0.035 + 0.3)
    t = res.transfer(TransferKey(0, 0, 0, "fwd"))
    assert (t.start, t.end, t.arrival) == pytest.approx((0.1, 0.11, 0.135))


def _two_pipelines(policy: str, order=None) -> SimSpec:
    s = build_schedule("gpipe", 2, 1)
    nbytes = 1_250_000  # 10 ms alone at 1 Gbit/s
    paths = {(d, 0, dr): NetPath((f"l-{dr}",), 0.0) for d in range(2) for dr in ("fwd", "bwd")}
    res = {f"l-{dr}": Resource(1e9, policy, order) for dr in ("fwd", "bwd")}
    return SimSpec(s, 2, [0.1, 0.1], [0.1, 0.1], [nbytes], [nbytes], paths, res)


def test_shared_link_splits_and_exclusive_link_serialises() -> None:
    shared = simulate(_two_pipelines("shared"))
    a, b = (shared.transfer(TransferKey(d, 0, 0, "fwd")) for d in range(2))
    assert a.end == pytest.approx(0.12) and b.end == pytest.approx(0.12)  # both at half rate
    excl = simulate(_two_pipelines("exclusive"))
    a, b = (excl.transfer(TransferKey(d, 0, 0, "fwd")) for d in range(2))
    assert sorted([a.end, b.end]) == pytest.approx([0.11, 0.12])  # one after the other, full rate
    assert excl.makespan < shared.makespan
    # A planned order is obeyed, even against readiness order.
    order = (TransferKey(1, 0, 0, "fwd"), TransferKey(0, 0, 0, "fwd"))
    spec = _two_pipelines("exclusive")
    spec.resources["l-fwd"] = Resource(1e9, "exclusive", order)
    planned = simulate(spec)
    assert planned.order_on("l-fwd") == list(order)


def test_crowded_link_carries_its_measured_total_only_while_transfers_collide() -> None:
    # colliding channels get 0.5 Gbit/s in total: both 1.25 MB transfers end at 40 ms
    # (not 20); a transfer alone on the link still gets the full rate (10 ms)
    spec = _two_pipelines("shared")
    spec.resources = {k: Resource(1e9, crowded_bps=5e8) for k in spec.resources}
    res = simulate(spec)
    a, b = (res.transfer(TransferKey(d, 0, 0, "fwd")) for d in range(2))
    assert a.end == pytest.approx(0.14) and b.end == pytest.approx(0.14)
    spec.offsets = [0.0, 0.5]  # never at the same time
    alone = simulate(spec)
    assert alone.transfer(TransferKey(1, 0, 0, "fwd")).end - 0.6 == pytest.approx(0.01)


def test_a_collision_of_two_splits_the_crowded_total_as_drawn() -> None:
    """Crowded at 0.5 Gbit/s with the favoured transfer's share drawn from (0.8,): it
    moves its 1e7 bits at 4e8 (25 ms), the other at 1e8 until then and its last 7.5e6
    bits alone at the link's 1e9 (7.5 ms more); which one is favoured is the seed's
    draw, the same for the same seed, each pipeline in some."""
    ends = {}
    for seed in range(12):
        spec = _two_pipelines("shared")
        spec.resources = {k: Resource(1e9, crowded_bps=5e8, split_shares=(0.8,)) for k in spec.resources}
        spec.seed = seed
        res = simulate(spec)
        a, b = (res.transfer(TransferKey(d, 0, 0, "fwd")).end for d in range(2))
        assert sorted([a, b]) == pytest.approx([0.125, 0.1325])
        assert (res.transfer(TransferKey(0, 0, 0, "fwd")).end, res.makespan) == \
            (simulate(spec).transfer(TransferKey(0, 0, 0, "fwd")).end, simulate(spec).makespan)
        ends[seed] = a < b
    assert set(ends.values()) == {True, False}
    even = _two_pipelines("shared")
    even.resources = {k: Resource(1e9, crowded_bps=5e8, split_shares=(0.5,)) for k in even.resources}
    a, b = (simulate(even).transfer(TransferKey(d, 0, 0, "fwd")).end for d in range(2))
    assert a == pytest.approx(0.14) and b == pytest.approx(0.14)  # a share of half: the even split
    uncrowded = _two_pipelines("shared")  # no crowded total measured: shares are not applied
    uncrowded.resources = {k: Resource(1e9, split_shares=(0.8,)) for k in uncrowded.resources}
    a, b = (simulate(uncrowded).transfer(TransferKey(d, 0, 0, "fwd")).end for d in range(2))
    assert a == pytest.approx(0.12) and b == pytest.approx(0.12)


def _window_spec(window_bytes: float) -> SimSpec:
    """GPipe, 3 micro-batches over one WAN boundary, 40 ms one way: the forwards leave
    back to back on one channel (1 MB each, 8 ms alone at 1 Gbit/s)."""
    s = build_schedule("gpipe", 2, 3)
    nbytes, lat = 1_000_000, 0.04
    paths = {(0, 0, d): NetPath((f"c-{d}",), lat, window_bits=window_bytes * 8) for d in ("fwd", "bwd")}
    res = {f"c-{d}": Resource(1e9, "exclusive") for d in ("fwd", "bwd")}
    return SimSpec(s, 1, [0.001, 0.001], [0.001, 0.001], [nbytes], [nbytes], paths, res)


def test_a_channel_waits_for_its_window_before_the_next_transfer() -> None:
    """With windows for one tensor, each next tensor leaves a round trip (80 ms) after
    the previous one began to leave (ACK clocking), not right behind it; with windows
    for all three, back to back; with no window given (INF), back to back as before."""
    one = simulate(_window_spec(1_000_000))
    starts = [one.transfer(TransferKey(0, 0, m, "fwd")).start for m in range(3)]
    assert starts[1] - starts[0] == pytest.approx(0.08) and starts[2] - starts[1] == pytest.approx(0.08)
    assert one.transfer(TransferKey(0, 0, 2, "fwd")).arrival == pytest.approx(starts[2] + 0.008 + 0.04)
    wide = simulate(_window_spec(3_000_000))
    assert [wide.transfer(TransferKey(0, 0, m, "fwd")).start for m in range(3)] == pytest.approx(
        [0.001, 0.009, 0.017])
    spec = _window_spec(1_000_000)
    spec.paths = {k: NetPath(p.resources, p.latency_s) for k, p in spec.paths.items()}
    assert simulate(spec).makespan == pytest.approx(wide.makespan)
    assert one.makespan > wide.makespan + 0.15


def test_a_backlogged_channel_moves_at_its_backlog_rate_within_its_whole_window() -> None:
    """GPipe's forwards reach the channel back to back: the first finds it idle and takes
    one tensor's measured time (200 Mbit/s: 40 ms); the two handed over while it was
    leaving follow at the link's rate (1 Gbit/s: 8 ms each), their window the streams'
    whole one rather than the stripe window that would hold them a round trip."""
    spec = _window_spec(1_000_000)
    spec.resources = {k: Resource(2e8, "exclusive", backlog_bps=1e9) for k in spec.resources}
    spec.paths = {k: NetPath(p.resources, p.latency_s, window_bits=p.window_bits, backlog_window_bits=3e6 * 8)
                  for k, p in spec.paths.items()}
    res = simulate(spec)
    spans = [res.transfer(TransferKey(0, 0, m, "fwd")) for m in range(3)]
    assert spans[0].end - spans[0].start == pytest.approx(0.04)
    assert [s.start for s in spans[1:]] == pytest.approx([spans[0].end, spans[0].end + 0.008])
    assert spans[2].end - spans[2].start == pytest.approx(0.008)
    # without a backlog rate every tensor takes one alone's time, and the stripe window
    # (one tensor) makes each wait for the round trip of the one before
    plain = _window_spec(1_000_000)
    plain.resources = {k: Resource(2e8, "exclusive") for k in plain.resources}
    slow = simulate(plain)
    assert slow.transfer(TransferKey(0, 0, 2, "fwd")).start - slow.transfer(TransferKey(0, 0, 1, "fwd")).start \
        == pytest.approx(0.08)
    assert slow.makespan > res.makespan + 0.1


def test_a_one_stream_window_frees_byte_by_byte_where_whole_transfers_wait_for_room() -> None:
    """A window of 2.5 tensors (2.5 MB, 80 ms round trip, 1 Gbit/s: 8 ms a tensor): a
    channel handing its streams whole tensors sends two, then waits a round trip for the
    room the third needs; one TCP stream (`fluid_window`) sends the half of the third its
    window has room for at once, then each of its bytes as the acknowledgement of the byte
    a window before it comes back: the first tensor's first half, a round trip after it
    left (81-85 ms), so the third ends 4 ms before the whole-window wait's."""
    def run(fluid: bool, window: float = 2_500_000) -> list:
        spec = _window_spec(window)
        spec.paths = {k: NetPath(p.resources, p.latency_s, window_bits=p.window_bits, fluid_window=fluid)
                      for k, p in spec.paths.items()}
        res = simulate(spec)
        return [res.transfer(TransferKey(0, 0, m, "fwd")) for m in range(3)]

    whole, fluid = run(False), run(True)
    assert whole[2].start == pytest.approx(whole[0].start + 0.08)  # two fit; the third waits for the first's ACKs
    assert whole[2].end == pytest.approx(0.089)
    assert fluid[2].start == pytest.approx(fluid[1].end)  # the channel's FIFO, not the window, sets its start
    assert fluid[2].end == pytest.approx(0.085)  # the first tensor's first half acknowledged at 81-85 ms
    assert [s.end for s in fluid[:2]] == pytest.approx([s.end for s in whole[:2]])
    # a window that fits all three holds nothing back either way
    assert [s.end for s in run(True, 3_000_000)] == pytest.approx([s.end for s in run(False, 3_000_000)])
    # shared links only: a planned (exclusive) link keeps whole transfers
    spec = _window_spec(2_500_000)
    spec.paths = {k: NetPath((*p.resources, f"l-{k[2]}"), p.latency_s, window_bits=p.window_bits, fluid_window=True)
                  for k, p in spec.paths.items()}
    spec.resources.update({f"l-{d}": Resource(1e9, "exclusive") for d in ("fwd", "bwd")})
    planned = simulate(spec)
    assert planned.transfer(TransferKey(0, 0, 2, "fwd")).start == pytest.approx(whole[2].start)


def test_a_one_stream_burst_lands_a_window_a_round_trip() -> None:
    """GPipe hands eight 1 MB forwards to one TCP stream 1 ms apart (1 Gbit/s: 8 ms
    each, 80 ms round trip, a 2.5 MB window): they land in groups a round trip apart,
    2, 3, 2 and 1 tensors (ends at 9, 17 | 85, 93, 101 | 169, 177 | 245 ms), as a
    held-back GPipe run's one-stream bursts did (docs/results/fidelity.md, "The one-stream
    burst, bit by bit"): each bit leaves as the one a window before it is acknowledged,
    so the burst's last tensor waits for the third tensor's second half, which itself
    waited a round trip. An even pace of a window a round trip would end it at 209 ms."""
    s = build_schedule("gpipe", 2, 8)
    paths = {(0, 0, d): NetPath((f"c-{d}",), 0.04, window_bits=2_500_000 * 8, fluid_window=True)
             for d in ("fwd", "bwd")}
    res = {f"c-{d}": Resource(1e9, "exclusive") for d in ("fwd", "bwd")}
    out = simulate(SimSpec(s, 1, [0.001, 0.001], [0.001, 0.001], [1_000_000], [1_000_000], paths, res))
    ends = [out.transfer(TransferKey(0, 0, m, "fwd")).end for m in range(8)]
    assert ends == pytest.approx([0.009, 0.017, 0.085, 0.093, 0.101, 0.169, 0.177, 0.245], abs=1e-6)


@pytest.mark.parametrize("offset", [0.0, 0.03, 0.09])
def test_a_one_stream_window_above_the_path_s_bdp_holds_nothing_back(offset: float) -> None:
    """Bits a window apart leave a round trip apart at least, which a stream whose window
    holds more than its path's bandwidth-delay product (100 Mbit/s x 20 ms: 250 kB) never
    reaches: two pipelines' GPipe forwards (1 MB each) sharing the link, the second
    starting later, cross with 300 kB or 2 MB windows as they do with none, at whatever
    share the other pipeline leaves them (a window's wait taken as the pace of the bits
    before it slowed each tensor to the last one's share, and the next to that: 8-20%
    slower iterations with 300 kB)."""
    def run(window: float) -> float:
        s = build_schedule("gpipe", 2, 4)
        paths = {(d, 0, k): NetPath((f"c{d}-{k}", f"l-{k}"), 0.01, window_bits=window, fluid_window=True)
                 for d in range(2) for k in ("fwd", "bwd")}
        res = {f"c{d}-{k}": Resource(1e8, "exclusive", backlog_bps=1e8) for d in range(2) for k in ("fwd", "bwd")}
        res.update({f"l-{k}": Resource(1e8) for k in ("fwd", "bwd")})
        spec = SimSpec(s, 2, [0.001, 0.001], [0.001, 0.001], [1_000_000], [1_000_000], paths, res,
                       offsets=[0.0, offset])
        return simulate(spec).makespan

    free = run(INF)
    assert run(300_000 * 8) == pytest.approx(free, rel=1e-9)
    assert run(2_000_000 * 8) == pytest.approx(free, rel=1e-9)


def test_a_one_stream_tensor_beyond_its_window_keeps_the_channel_s_pace_in_a_backlog() -> None:
    """One stream, 4 MB tensors handed back to back (GPipe), a 0.5 MB window over 50 ms
    (8 ms of it at the link's 1 Gbit/s), the channel's measured rate 100 Mbit/s: the
    second tensor's bits beyond its first window follow its own acknowledgements, at the
    channel's measured pace (above the window's 80 Mbit/s: the window is the model's
    figure), not at the link's rate that a backlog would give a tensor within its window:
    about 320 ms each, not 32."""
    s = build_schedule("gpipe", 2, 2)
    paths = {(0, 0, d): NetPath((f"c-{d}", f"l-{d}"), 0.025, window_bits=500_000 * 8, fluid_window=True)
             for d in ("fwd", "bwd")}
    res = {f"c-{d}": Resource(1e8, "exclusive", backlog_bps=1e9) for d in ("fwd", "bwd")}
    res.update({f"l-{d}": Resource(1e9) for d in ("fwd", "bwd")})
    out = simulate(SimSpec(s, 1, [0.001, 0.001], [0.001, 0.001], [4_000_000], [4_000_000], paths, res))
    first, second = (out.transfer(TransferKey(0, 0, m, "fwd")) for m in range(2))
    assert first.end - first.start == pytest.approx(0.32)
    assert 0.3 < second.end - second.start < 0.34


def test_a_channel_inside_a_dc_moves_at_its_loaded_rate_while_its_ranks_use_the_wan() -> None:
    """Three stages, the first boundary inside a DC (1 MB: 8 ms at 1 Gbit/s), the second
    over the WAN (10 MB at 100 Mbit/s: 0.8 s). The first micro-batch's LAN transfer finds
    the WAN idle and moves at its own rate; the second starts while the first's WAN
    transfer moves and, its path loaded by the WAN channels (`Path.loaded_by`), moves at
    the loaded rate (250 Mbit/s: 32 ms). Without `loaded_bps`, both at their own rate."""
    def run(loaded: float | None) -> list[float]:
        s = build_schedule("gpipe", 3, 2)
        wan = ("w-fwd", "w-bwd")
        paths = {(0, 0, d): NetPath((f"l-{d}",), 0.0, loaded_by=wan, loaded_bps=loaded) for d in ("fwd", "bwd")}
        paths.update({(0, 1, d): NetPath((f"w-{d}",), 0.01) for d in ("fwd", "bwd")})
        res = {f"l-{d}": Resource(1e9, "exclusive") for d in ("fwd", "bwd")}
        res.update({f"w-{d}": Resource(1e8, "exclusive") for d in ("fwd", "bwd")})
        spec = SimSpec(s, 1, [0.1, 0.01, 0.01], [0.01, 0.01, 0.01], [1_000_000, 10_000_000],
                       [1_000_000, 10_000_000], paths, res)
        got = simulate(spec)
        return [got.transfer(TransferKey(0, 0, m, "fwd")).end - got.transfer(TransferKey(0, 0, m, "fwd")).start
                for m in range(2)]

    assert run(2.5e8) == pytest.approx([0.008, 0.032])
    assert run(None) == pytest.approx([0.008, 0.008])


def test_a_tensor_that_finds_its_channel_idle_is_not_backlogged() -> None:
    """1F1B's steady state: each tensor is handed over after the one before has left, so
    the backlog rate never applies (each takes one alone's time)."""
    s = build_schedule("1f1b", 2, 3)
    paths = {(0, 0, d): NetPath((f"c-{d}",), 0.04) for d in ("fwd", "bwd")}
    res = {f"c-{d}": Resource(1e9, "exclusive", backlog_bps=1e10) for d in ("fwd", "bwd")}
    spec = SimSpec(s, 1, [0.05, 0.05], [0.1, 0.1], [1_000_000], [1_000_000], paths, res)
    got = simulate(spec)
    for t in got.transfers:
        assert t.end - t.start == pytest.approx(0.008)


def test_contradictory_plan_is_reported() -> None:
    # 1F1B, p=2, m=3: stage 0 sends activation 2 only after backward 0, which needs
    # activation 0 to have crossed; a plan putting activation 2 first cannot run.
    s = build_schedule("1f1b", 2, 3)
    nbytes = 1000
    paths = {(0, 0, dr): NetPath((f"l-{dr}",), 0.0) for dr in ("fwd", "bwd")}
    order = tuple(TransferKey(0, 0, mb, "fwd") for mb in (2, 0, 1))
    resources = {"l-fwd": Resource(1e9, "exclusive", order), "l-bwd": Resource(1e9)}
    spec = SimSpec(s, 1, [0.1, 0.1], [0.1, 0.1], [nbytes], [nbytes], paths, resources)
    with pytest.raises(SimulationError, match=r"cannot finish; waiting: .*transfers not started: p0.b0.fwd0"):
        simulate(spec)


def test_max_min_fairness() -> None:
    # three flows on a 10-unit link, one capped at 2: 2, 4, 4
    assert max_min_rates([(2, ("a",)), (100, ("a",)), (100, ("a",))], {"a": 10}) == pytest.approx([2, 4, 4])
    # flow 0 crosses a and b; b is shared with flow 1: b is the bottleneck (3 each), flow 2 gets the rest of a
    rates = max_min_rates([(100, ("a", "b")), (100, ("b",)), (100, ("a",))], {"a": 10, "b": 6})
    assert rates == pytest.approx([3, 3, 7])
    assert max_min_rates([(float("inf"), ())], {}) == [float("inf")]


def test_idle_slots_and_offsets() -> None:
    spec = uniform_spec(build_schedule("gpipe", 2, 2), 2, 1.0, 1.0)
    spec.offsets = [0.0, 0.5]
    res = simulate(spec)
    assert res.makespan == pytest.approx(6.5)
    assert res.idle_slots(1, 0)[0] == pytest.approx((0.0, 0.5))
    assert res.idle_slots(0, 1, min_s=0.1)[0] == pytest.approx((0.0, 1.0))


# ---------------------------------------------------------- property checks

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 100), st.sets(st.sampled_from("abc"), min_size=1)), min_size=1, max_size=6),
       st.fixed_dictionaries({r: st.floats(1, 50) for r in "abc"}))
def test_max_min_rates_are_feasible_and_fair(flows, caps) -> None:
    flows = [(cap, tuple(sorted(res))) for cap, res in flows]
    rates = max_min_rates(flows, caps)
    for r, c in caps.items():
        assert sum(x for x, (_, res) in zip(rates, flows, strict=True) if r in res) <= c * (1 + 1e-9)
    for x, (cap, res) in zip(rates, flows, strict=True):
        assert x <= cap * (1 + 1e-9)
        # max-min: each flow is at its cap or on a full link where nobody gets more
        saturated = [r for r in res
                     if sum(y for y, (_, rs) in zip(rates, flows, strict=True) if r in rs) >= caps[r] * (1 - 1e-9)]
        assert x >= cap * (1 - 1e-9) or any(
            all(y <= x * (1 + 1e-9) for y, (_, rs) in zip(rates, flows, strict=True) if r in rs) for r in saturated
        )


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 5), st.integers(1, 8),
       st.floats(0.01, 1), st.floats(0.01, 1), st.floats(0, 0.2), st.floats(1e3, 1e6))
def test_network_costs_only_add_time(name, p, m, tf, tb, latency, nbytes) -> None:
    s = build_schedule(name, p, m)
    free = simulate(uniform_spec(s, 1, tf, tb))
    assert free.bubble_fraction() == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)
    paths = {(0, b, d): NetPath((f"{b}{d}",), latency) for b in range(p - 1) for d in ("fwd", "bwd")}
    res = {f"{b}{d}": Resource(1e8) for b in range(p - 1) for d in ("fwd", "bwd")}
    spec = SimSpec(s, 1, [tf] * p, [tb] * p, [nbytes] * (p - 1), [nbytes] * (p - 1), paths, res)
    slow = simulate(spec)
    assert slow.makespan >= free.makespan * (1 - 1e-9)
    # micro-batch 0 goes down the pipeline and back: all compute plus every hop twice
    first_round_trip = p * (tf + tb) + 2 * (p - 1) * (latency + nbytes * 8 / 1e8)
    assert slow.makespan >= first_round_trip * (1 - 1e-9)


def _busy_spec(forward_s: float) -> SimSpec:
    """GPipe, 3 micro-batches over one channel and one shaped link direction: 1 MB
    tensors, 8 ms at the channel's 1 Gbit/s; the link sustains 0.9 Gbit/s once busy,
    its bucket refilling in 1 ms."""
    s = build_schedule("gpipe", 2, 3)
    paths = {(0, 0, d): NetPath((f"c-{d}", f"l-{d}"), 0.0) for d in ("fwd", "bwd")}
    res = {**{f"c-{d}": Resource(1e9, "exclusive") for d in ("fwd", "bwd")},
           **{f"l-{d}": Resource(1e9, busy_bps=0.9e9, refill_s=0.001) for d in ("fwd", "bwd")}}
    return SimSpec(s, 1, [forward_s, 0.001], [0.001, 0.001], [1_000_000], [1_000_000], paths, res)


def test_a_busy_link_moves_the_next_transfer_at_its_sustained_rate() -> None:
    """Queued behind another (or less than the bucket's refill after it), a transfer
    gets the link's sustained rate; onto an idle link, the full rate (the burst)."""
    def wire(forward_s: float) -> list[float]:
        res = simulate(_busy_spec(forward_s))
        return [(t := res.transfer(TransferKey(0, 0, m, "fwd"))).end - t.start for m in range(3)]

    assert wire(0.001) == pytest.approx([0.008, 0.008 / 0.9, 0.008 / 0.9])  # handed over back to back
    assert wire(0.0085) == pytest.approx([0.008, 0.008 / 0.9, 0.008 / 0.9])  # 0.5 ms idle: bucket not full
    assert wire(0.02) == pytest.approx([0.008] * 3)  # 12 ms idle between them: each gets the burst
    spec = _busy_spec(0.001)
    spec.resources = {k: Resource(r.capacity_bps, r.policy) for k, r in spec.resources.items()}
    assert [t.end - t.start for t in simulate(spec).transfers if t.key.direction == "fwd"] == pytest.approx(
        [0.008] * 3)  # no busy_bps: every transfer at the channel's rate, as before


def test_a_compute_ops_label_reads_back() -> None:
    """`Op.parse_compute` is the inverse of a compute op's str (the devices' timeline labels)."""
    for op in (Op("F", 3, 1), Op("B", 12, 0)):
        assert Op.parse_compute(str(op)) == op
    for bad in ("F3", "X3@s1", "B@s1", "F3@s", "SEND_F0@s0->s1", ""):
        with pytest.raises(ValueError, match="is not a compute op's label"):
            Op.parse_compute(bad)
