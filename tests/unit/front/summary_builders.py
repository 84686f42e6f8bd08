"""Run summaries for tests, built through the summary.json model
(testbed_core/contracts/summary.py) rather than as hand-made dicts: a test states the
figures it is about, the builders fill in the rest with plausible values, and the
model checks that the result is a summary `testbed run` could have written."""

from __future__ import annotations

from typing import Any

from testbed_core.contracts.summary import (
    AgentCounters,
    Crossing,
    DelayLineDirection,
    DelayLineWindow,
    Parallelism,
    Placement,
    Prediction,
    PrefillRequests,
    Summary,
    Ttft,
    VariantEntry,
    VariantFailure,
    VariantResult,
    WanDirection,
    WanLink,
)


def prediction(iteration_time_s: float, measured_s: float) -> Prediction:
    return Prediction(
        rates_from="calibration probe", warmup_channel_rate_mbps=None, warmup_transfers_counted=None,
        with_warmup_rates_iteration_time_s=None, calibrated_channel_rate_mbps=None,
        calibrated_colliding_aggregate_mbps=None, warmup_colliding_aggregate_mbps=None,
        warmup_colliding_transfers=None, a_priori_iteration_time_s=iteration_time_s,
        a_priori_error=(measured_s - iteration_time_s) / iteration_time_s, measured_stage_forward_s=None,
        measured_stage_backward_s=None, measured_overhead_s=None,
    )


def placement(strategy: str = "even") -> Placement:
    return Placement(
        strategy=strategy, pp=2, dp=1, tp=1, free_gpus={"dc1": 2, "dc2": 2}, used_gpus={"dc1": 1, "dc2": 1},
        stage_dc=[["dc1", "dc2"]], hosts={"p0s0": ["dc1-h1"], "p0s1": ["dc2-h1"]},
        wan_crossings=[Crossing(boundary=0, src="dc1", dst="dc2", path=["dc1", "dc2"], pipelines=[0])],
    )


def wan_link(nbytes: int, goodput_mbps: float | None, busy_s: float = 1.0) -> WanLink:
    return WanLink(bytes=nbytes, transfers=8, busy_s=busy_s, goodput_mbps=goodput_mbps, mean_throughput_mbps=None,
                   directions=["dc1->dc2", "dc2->dc1"])


def delay_line(queue_drops: int, link: str = "dc1-dc2") -> dict[str, DelayLineWindow]:
    """A relay's counters over a variant with `queue_drops` tail drops one way."""
    def direction(drops: int) -> DelayLineDirection:
        counters = dict.fromkeys(DelayLineDirection.model_fields, 0)
        return DelayLineDirection(**{**counters, "rx_frames": 1000, "send_drops": drops, "queue_drops": drops})

    return {link: DelayLineWindow.of({"dc1->dc2": direction(queue_drops), "dc2->dc1": direction(0)}, 0)}


def variant(name: str = "atlas", iteration_time_s: float = 1.0, *, predicted_s: float | None = None,
            device_utilization: float = 0.5, streams: int = 1, wan: dict[str, WanLink] | None = None,
            **fields: Any) -> VariantResult:
    """A variant that ran; `fields` set or override any key of its summary entry."""
    predicted = iteration_time_s if predicted_s is None else predicted_s
    data: dict[str, Any] = dict(
        iteration_time_s=iteration_time_s, predicted_iteration_time_s=predicted,
        prediction_error=(iteration_time_s - predicted) / predicted,
        prediction=prediction(predicted, iteration_time_s),
        device_utilization=device_utilization, device_utilization_training=device_utilization,
        bubble_fraction=1 - device_utilization, predicted_bubble_fraction=1 - device_utilization,
        wan_links=wan if wan is not None else {"dc1-dc2": wan_link(8 << 20, 100.0)},
        wan_directions={"dc1->dc2": WanDirection(bytes=4 << 20, transfers=4, busy_s=0.5, goodput_mbps=100.0,
                                                 mean_throughput_mbps=None)},
        predicted_wan_bytes_per_iteration={"wan:dc1->dc2": float(4 << 20)},
        iteration_times_s=[iteration_time_s], warmup_iteration_times_s=[iteration_time_s],
        iteration_time_stdev_s=0.0, per_device_utilization={"dc1-h1-p0r0": device_utilization},
        mean_plan_wait_s=0.0, mean_wan_transfer_s=0.1, streams=streams,
        sharing="temporal" if name.startswith("atlas") else "shared",
        sharing_requested="auto" if name.startswith("atlas") else "shared", sharing_alternatives_s=None,
        placement=placement("atlas" if name.startswith("atlas") else "even"), temporal_plan=None,
        compute_only_s=0.5 * iteration_time_s, delay_line=None,
        timeline_csv=f"{name}/timeline.csv", transfers_csv=f"{name}/transfers.csv", gantt_png=f"{name}/gantt.png",
    )
    data.update(fields)
    return VariantResult(**data)


def with_bubbletea(plain: VariantResult, name: str, *, iteration_time_s: float, device_utilization: float,
                   training_slowdown: float | None, served: int = 28, arrived: int | None = None,
                   rejected: int = 0, ttft_p50: float | None = 0.075, ttft_p95: float | None = 0.85,
                   **fields: Any) -> VariantResult:
    """The +bubbletea twin of `plain`: its training utilization is the plain one's, and
    the agents' metrics are set (`fields` override any key)."""
    data = plain.model_dump(exclude_unset=True)
    data.update(
        iteration_time_s=iteration_time_s, device_utilization=device_utilization,
        device_utilization_training=plain.device_utilization, timeline_csv=f"{name}/timeline.csv",
        transfers_csv=f"{name}/transfers.csv", gantt_png=f"{name}/gantt.png",
        prefill_requests=PrefillRequests(arrived=served + rejected if arrived is None else arrived, served=served,
                                         rejected=rejected,
                                         rejected_by_reason={"deadline": rejected} if rejected else {}),
        ttft_s=Ttft(p50=ttft_p50, p95=ttft_p95, p99=ttft_p95, mean=ttft_p50), prefill_tokens_served=512 * served,
        guard_violations=0, guard_violations_all_iterations=0, training_wait_on_prefill_s=0.0,
        training_slowdown=training_slowdown, compared_with_iteration_time_s=plain.iteration_time_s,
        bubbletea_agents=AgentCounters(engine_mode=["modelled"], not_arrived=0, chunks_run=served, late_starts=0,
                                       device_busy_retries=0),
    )
    data.update(fields)
    return VariantResult(**data)


def failure(error: str) -> VariantFailure:
    return VariantFailure(error=error)


def summary(variants: dict[str, VariantEntry], *, scenario: str = "quickstart", delay_backend: str = "relay",
            seed: int = 1, **fields: Any) -> Summary:
    """A run summary holding `variants` (in the order given)."""
    data: dict[str, Any] = dict(
        scenario=scenario, topology="2dc", workload="tiny", delay_backend=delay_backend, scale=1.0,
        scale_note="scale 1: tensors are sent at their real size", seed=seed, schedule="1f1b",
        parallelism=Parallelism(dp=1, pp=2, tp=1, micro_batch=1, num_micro_batches=4), iterations=3, warmup=2,
        wire_activation_bytes=1 << 20, stage_forward_s=[0.1, 0.1], stage_backward_s=[0.2, 0.2],
        runner={"local": False}, variants=variants, calibration=None, duration_s=60.0,
    )
    data.update(fields)
    return Summary(**data)
