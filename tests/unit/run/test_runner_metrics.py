"""Measured figures of a run from synthetic device timelines and transfer records
(testbed/run/metrics.py): iteration spans, utilization and bubbles, WAN bytes and
goodput, merging the two ends of a transfer, the summary table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testbed.run.metrics import (
    MetricsError,
    TransferRecord,
    iterations,
    merge_transfer_sides,
    summary_table,
    variant_metrics,
    wan_stats,
)
from testbed_core.device_records import WorkRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "front"))
import summary_builders as builders  # noqa: E402  (summaries built through the summary.json model)


def rec(device: str, start: float, end: float, kind: str = "forward", owner: str = "train:p0r0") -> WorkRecord:
    return WorkRecord(device, kind, owner, "F0@s0", start, start, end, "modelled")


def two_devices() -> dict[str, list[WorkRecord]]:
    # iteration 0 starts at 0 (warm-up), 1 at 10, 2 at 20
    a = [rec("a", 0, 1), rec("a", 2, 3), rec("a", 10, 11), rec("a", 12, 14), rec("a", 20, 22), rec("a", 23, 25)]
    b = [rec("b", 1, 2), rec("b", 11, 12), rec("b", 14, 16), rec("b", 22, 23), rec("b", 24, 26)]
    return {"a": a, "b": b}


def test_iteration_runs_from_common_start_to_last_training_work() -> None:
    its = iterations(two_devices(), [0.0, 10.0, 20.0])
    assert [(it.start, it.end) for it in its] == [(0, 3), (10, 16), (20, 26)]
    assert [it.duration for it in its] == [3, 6, 6]


def test_reported_ends_extend_an_iteration() -> None:
    its = iterations(two_devices(), [0.0, 10.0, 20.0], ends=[3.0, 17.5, 26.0])
    assert its[1].end == 17.5


def test_metrics_average_measured_iterations_only() -> None:
    m = variant_metrics(two_devices(), [0.0, 10.0, 20.0], warmup=1)
    assert m.iteration_time_s == pytest.approx(6.0)
    assert m.warmup_iteration_times_s == [3.0]
    # a: busy 3 of 6 in it.1 and 4 of 6 in it.2 -> 7/12; b: 3/6 and 3/6 -> 6/12
    assert m.per_device_utilization == pytest.approx({"a": 7 / 12, "b": 6 / 12})
    assert m.device_utilization == pytest.approx((7 / 12 + 6 / 12) / 2)
    assert m.bubble_fraction == pytest.approx(1 - (7 / 12 + 6 / 12) / 2)


def test_prefill_counts_for_utilization_but_not_against_bubbles() -> None:
    tl = two_devices()
    tl["a"].append(rec("a", 14, 16, kind="prefill", owner="bubbletea"))  # fills a's idle tail of it.1
    m = variant_metrics(tl, [0.0, 10.0, 20.0], warmup=1)
    assert m.per_device_utilization["a"] == pytest.approx(9 / 12)
    assert m.device_utilization_training == pytest.approx((7 / 12 + 6 / 12) / 2)
    assert m.bubble_fraction == pytest.approx(1 - m.device_utilization_training)


def test_no_measured_iteration_is_an_error_that_says_why() -> None:
    with pytest.raises(MetricsError, match="no measured iterations: 3 ran, the first 3 are warm-up"):
        variant_metrics(two_devices(), [0.0, 10.0, 20.0], warmup=3)


def test_an_iteration_without_work_is_named() -> None:
    with pytest.raises(MetricsError, match="iteration 3 .* has no training work"):
        iterations(two_devices(), [0.0, 10.0, 20.0, 30.0])


def tr(it: int, mb: int, direction: str, sent: float, arrived: float, links=("dc1->dc2",), nbytes=1_000_000,
       latency=0.025) -> TransferRecord:
    return TransferRecord(it, 0, 0, mb, direction, "p0r0", "p0r1", nbytes, tuple(links), latency,
                          posted=sent, sent=sent, arrived=arrived)


def test_wan_goodput_is_bytes_over_busy_time_without_the_flight() -> None:
    windows = [(10.0, 20.0)]
    transfers = [
        tr(1, 0, "fwd", 10.0, 10.125),  # on the wire 10.0 .. 10.1
        tr(1, 1, "fwd", 10.05, 10.175),  # overlaps: 10.05 .. 10.15 -> union 10.0 .. 10.15
        tr(1, 0, "bwd", 11.0, 11.225, links=("dc2->dc1",)),  # 11.0 .. 11.2
        tr(1, 2, "fwd", 12.0, 12.0, links=()),  # inside a DC: not a WAN transfer
        tr(0, 3, "fwd", 1.0, 1.125),  # warm-up: outside the windows
    ]
    links, dirs = wan_stats(transfers, windows, {frozenset(("dc1", "dc2")): "dc1-dc2"})
    assert dirs["dc1->dc2"].bytes == 2_000_000
    assert dirs["dc1->dc2"].busy_s == pytest.approx(0.15)
    assert dirs["dc1->dc2"].goodput_mbps == pytest.approx(16e6 / 0.15 / 1e6)
    assert dirs["dc2->dc1"].goodput_mbps == pytest.approx(8e6 / 0.2 / 1e6)
    link = links["dc1-dc2"]
    assert link.bytes == 3_000_000 and link.transfers == 3
    assert link.goodput_mbps == pytest.approx(24e6 / 0.35 / 1e6)
    assert link.mean_throughput_mbps == pytest.approx(24e6 / 10 / 1e6)
    assert link.directions == ["dc1->dc2", "dc2->dc1"]


def test_link_name_defaults_to_sorted_dcs() -> None:
    links, _ = wan_stats([tr(1, 0, "bwd", 10.0, 10.2, links=("dc2->dc1",))], [(10.0, 20.0)])
    assert list(links) == ["dc1-dc2"]


def test_both_ends_of_a_transfer_are_merged() -> None:
    key = {"iteration": 1, "pipeline": 0, "boundary": 0, "mb": 2, "direction": "fwd"}
    sends = [{**key, "src": "p0r0", "dst": "p0r1", "nbytes": 10, "links": ["dc1->dc2"], "latency_s": 0.025,
              "posted": 1.0, "not_before": 1.1, "sent": 1.1, "confirmed": 1.3, "streams": 8}]
    recvs = [{**key, "src": "p0r0", "dst": "p0r1", "nbytes": 10, "links": ["dc1->dc2"], "latency_s": 0.025,
              "arrived": 1.25, "streams": 8},
             {**key, "mb": 3, "src": "p0r0", "dst": "p0r1", "nbytes": 10, "arrived": 2.0}]
    merged = merge_transfer_sides(sends, recvs)
    assert len(merged) == 2
    first = merged[0]
    assert (first.sent, first.arrived, first.confirmed, first.not_before) == (1.1, 1.25, 1.3, 1.1)
    assert first.wire_span == pytest.approx((1.1, 1.225))
    assert merged[1].sent is None and merged[1].wire_span is None  # the sender's record was lost


def test_summary_table_lists_each_variant_with_its_error() -> None:
    table = summary_table(builders.summary({
        "baseline": builders.variant("baseline", 2.0, predicted_s=2.1, device_utilization=0.2,
                                     wan={"dc1-dc2": builders.wan_link(5_000_000, 100.0)}),
        "atlas": builders.variant("atlas", 0.8, device_utilization=0.5,
                                  wan={"dc1-dc2": builders.wan_link(5_000_000, 700.0)}),
        "multi-tcp": builders.failure("worker p0r1 exited with status 1"),
    }))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["variant", "iter", "s"]
    assert "baseline" in lines[2] and "-5%" in lines[2]
    assert "x2.50 vs baseline" in lines[3]
    assert "multi-tcp" in lines[4] and "FAILED: worker p0r1 exited with status 1" in lines[4]


def test_channel_rate_counts_transfers_alone_on_their_link() -> None:
    from testbed.run.metrics import channel_rate

    ts = [
        tr(0, 0, "fwd", 0.0, 0.125),  # alone: 1 MB in 0.1 s on the wire -> 80 Mbit/s
        tr(0, 1, "fwd", 1.0, 1.225),  # overlaps the next one: 0.2 s
        tr(0, 2, "fwd", 1.1, 1.325),
        tr(0, 3, "fwd", 2.0, 2.075),  # alone: 0.05 s -> 160 Mbit/s
        tr(0, 4, "bwd", 1.0, 1.125, links=("dc2->dc1",)),  # other direction: alone
        tr(1, 5, "fwd", 5.0, 5.025),  # not a warm-up iteration
    ]
    rate, n, which = channel_rate(ts, [0], min_solo=3)
    assert (n, which) == (3, "alone on the link") and rate == pytest.approx(80e6)
    rate, n, which = channel_rate(ts, [0], min_solo=4)  # too few alone: all of them
    assert (n, which) == (5, "all") and rate == pytest.approx(80e6)  # 40, 40, 80, 80, 160
    assert channel_rate(ts, [0], solo_only=False)[1:] == (5, "all")
    assert channel_rate(ts, [7]) is None


def test_colliding_rate_counts_transfers_that_shared_their_link() -> None:
    from testbed.run.metrics import colliding_rate

    def t(it, p, mb, sent, wire, links=("dc1->dc2",)):
        return TransferRecord(it, p, 0, mb, "fwd", f"p{p}r0", f"p{p}r1", 1_000_000, links, 0.025,
                              sent=sent, arrived=sent + wire + 0.025)

    ts = [t(1, 0, 0, 0.0, 0.2), t(1, 1, 0, 0.1, 0.3),  # these two overlap: mean 0.25 s on the wire
          t(1, 0, 1, 1.0, 0.1),  # alone: not counted
          t(1, 1, 1, 1.05, 0.1, ("dc2->dc1",)),  # the other direction: alone too
          t(5, 0, 0, 0.0, 9.0), t(5, 1, 0, 0.0, 9.0)]  # not a wanted iteration
    rate, n = colliding_rate(ts, [1], channels=2, min_count=2)
    assert n == 2 and rate == pytest.approx(2 * 8e6 / 0.25)
    assert colliding_rate(ts, [1], channels=2) is None  # fewer than 8: no estimate


def test_calibration_arithmetic() -> None:
    from testbed.run.calibration import aggregate_rate, effective_rate
    from testbed_core.planning.calibrated import calibrated_rates

    # 1 MB tensors, 25 ms one way: median 0.125 s -> 0.1 s on the wire -> 80 Mbit/s
    assert effective_rate(1_000_000, [0.125, 0.5, 0.12], 0.025) == pytest.approx(80e6)
    # colliding channels: bytes of each over the mean time on the wire (a retransmission
    # timeout in one collision of a few is part of what colliding costs)
    assert aggregate_rate(1_000_000, [0.125, 0.225, 0.125, 0.125], 2, 0.025) == pytest.approx(128e6)
    # shared channels without a collision measurement: the link's TCP goodput, shared
    # max-min (each channel capped at its own rate), so a faster channel never predicts slower
    goodput = 1e9 * 1448 / 1514
    assert calibrated_rates(False, 1, 1e8, 1e9) == (1e8, pytest.approx(goodput), None)
    assert calibrated_rates(False, 1, 5.2e8, 1e9) == (5.2e8, pytest.approx(goodput), None)
    assert calibrated_rates(False, 1, 5.2e8, None) == (5.2e8, 5.2e8, None)
    # a temporal plan holds the link alone: one channel's rate
    assert calibrated_rates(True, 8, 7e8, 1e9, 4e8) == (7e8 / 8, 7e8, None)
    assert calibrated_rates(True, 8, None, 1e9) == (None, None, None)
    # a calibrated aggregate of colliding channels is the link's total while they collide,
    # as a share of its capacity: below one channel alone too, never above the link
    assert calibrated_rates(False, 8, 7e8, 1e9, 4.78e8) == (7e8 / 8, pytest.approx(goodput),
                                                                pytest.approx(0.5, rel=1e-3))
    assert calibrated_rates(False, 8, 7e8, 1e9, 2e9)[2] == 1.0


def test_measured_stage_times_and_pipeline_overhead_for_real_devices() -> None:
    """Real devices: the warm-up iterations' median forward/backward per stage replace
    the compute model's, and the time outside the pipeline (DP exchange, optimizer
    step) is measured apart."""
    from testbed.run.metrics import pipeline_overhead, stage_compute_times

    def r(dev, kind, label, start, end):
        return WorkRecord(dev, kind, "train:x", label, start, start, end, "real")

    timelines = {
        "a": [r("a", "forward", "F0@s0", 0.1, 0.2), r("a", "forward", "F1@s0", 0.2, 0.4),
              r("a", "forward", "F2@s0", 0.4, 0.5), r("a", "backward", "B0@s0", 0.9, 1.2),
              r("a", "optimizer", "step", 1.2, 1.5),
              r("a", "forward", "F0@s0", 10.1, 19.0)],  # outside the windows: ignored
        "b": [r("b", "forward", "F0@s1", 0.3, 0.35), r("b", "backward", "B0@s1", 0.5, 0.9),
              r("b", "prefill", "p", 0.9, 0.95)],
    }
    fwd, bwd = stage_compute_times(timelines, [(0.0, 2.0)], 2)
    assert fwd == pytest.approx([0.1, 0.05]) and bwd == pytest.approx([0.3, 0.4])
    assert stage_compute_times(timelines, [(0.0, 2.0)], 3) is None  # stage 2 never ran
    # first forward 0.1 s after the start, last backward ends 0.8 s before the end
    assert pipeline_overhead(timelines, [(0.0, 2.0)]) == pytest.approx(0.9)
    assert pipeline_overhead(timelines, []) == 0.0


def test_slowdown_with_wan_loss_the_plain_twin_did_not_have_is_flagged() -> None:
    import io

    from testbed.progress import Progress
    from testbed.run.runner import _compare_wan_loss

    def plain(drops: int | None):
        return builders.variant("atlas", 1.0, delay_line=None if drops is None else builders.delay_line(drops))

    def entry(drops: int | None, slowdown: float):
        return builders.with_bubbletea(plain(drops), "atlas+bubbletea", iteration_time_s=1.0 + slowdown,
                                       device_utilization=0.6, training_slowdown=slowdown)

    assert plain(5).tail_drops() == 5 and plain(None).tail_drops() is None
    log = io.StringIO()
    bt = entry(5, 0.103)
    _compare_wan_loss(bt, plain(0), "atlas+bubbletea", Progress(stream=log, tty=False))
    assert bt.wan_tail_drops.model_dump() == {"with_bubbletea": 5, "without": 0}
    assert "dropped 5 packets in this variant and 0 without BubbleTea" in bt.training_slowdown_note
    assert "atlas+bubbletea: note:" in log.getvalue()
    calm = entry(5, -0.005)
    _compare_wan_loss(calm, plain(0), "atlas+bubbletea", Progress(stream=io.StringIO(), tty=False))
    assert "training_slowdown_note" not in calm.model_dump() and calm.wan_tail_drops.with_bubbletea == 5
    local = entry(None, 0.2)
    before = local.model_dump()
    _compare_wan_loss(local, plain(None), "x", Progress(stream=io.StringIO(), tty=False))
    assert local.model_dump() == before and "wan_tail_drops" not in before


def test_summary_table_counts_the_gradient_rings_on_the_wan() -> None:
    """dp-across-dc sends no pipeline tensor over the WAN but its rings do: the table's
    WAN MB carries them (3 measured iterations of 100 MB), and says so."""
    from testbed_core.contracts.summary import AllReduceResult

    rings = AllReduceResult(measured_s=[1.0, 1.1, 0.9], mean_s=1.0, predicted_added_s=1.0,
                            wan_bytes_per_iteration=100_000_000)
    table = summary_table(builders.summary({
        "baseline": builders.variant("baseline", 2.0, wan={"dc1-dc2": builders.wan_link(5_000_000, 100.0)}),
        "dp-across-dc": builders.variant("dp-across-dc", 4.0, wan={}, allreduce=rings),
    }))
    lines = table.splitlines()
    assert lines[3].split()[0] == "dp-across-dc" and lines[3].split()[6] == "300.0"
    assert lines[2].split()[6] == "5.0"
    assert "DP all-reduce rings' bytes" in table


def test_real_stage_times_are_each_stages_mean_hold_of_its_worker() -> None:
    """Real devices (metrics.stage_hold_times): a stage's time is the mean over the
    warm-up's micro-batches of its work, the wait from its input's arrival (or its
    worker's last work) to its start, and the hand-over of its output after it; an
    iteration's first work waits on its input only; work outside the spans is left out."""
    from testbed.run.metrics import TransferRecord, stage_hold_times

    def r(owner, kind, label, start, end):
        return WorkRecord(owner, kind, f"train:{owner}", label, start, start, end, "real")

    def t(mb, way, src, dst, posted, arrived):
        return TransferRecord(1, 0, 0, mb, way, src, dst, 16, posted=posted, sent=posted, arrived=arrived)

    timelines = {
        "a": [r("p0r0", "forward", "F0@s0", 10.0, 10.1), r("p0r0", "forward", "F1@s0", 10.1, 10.2),
              r("p0r0", "backward", "B0@s0", 10.65, 10.7), r("p0r0", "forward", "F0@s0", 99.0, 99.5)],
        "b": [r("p0r1", "forward", "F0@s1", 10.35, 10.4), r("p0r1", "backward", "B0@s1", 10.4, 10.5)],
    }
    transfers = [t(0, "fwd", "p0r0", "p0r1", 10.12, 10.3), t(1, "fwd", "p0r0", "p0r1", 10.2, 10.45),
                 t(0, "bwd", "p0r1", "p0r0", 10.5, 10.6)]
    fwd, bwd = stage_hold_times(timelines, transfers, {1: (10.0, 11.0)}, 2)
    # F0@s0 0.1 + 0.02 hand-over; F1@s0 0.1; F0@s1 0.05 + 0.05 after its tensor came
    assert fwd == pytest.approx([(0.12 + 0.1) / 2, 0.1])
    # B0@s0 0.05 + 0.05 after the gradient came (its worker was free since 10.2); B0@s1 0.1
    assert bwd == pytest.approx([0.1, 0.1])
    assert stage_hold_times(timelines, transfers, {1: (10.0, 11.0)}, 3) is None  # stage 2 never ran
