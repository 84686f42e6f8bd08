"""The WAN calibration of `testbed run`: what the probes measured, and the block of
``summary.json`` that reports it.

`Calibration` is the measurement the run works with (stream count -> channel rate in
bits/s, as the variants' predictions need it); `CalibrationReport` is its form in
``summary.json`` (Mbit/s, stream counts as JSON keys, the method spelled out), made by
`Calibration.report` and read back by whoever reads a summary.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PROBE_WARMUP = 2
"""Calibration tensors sent first and not timed (connection set-up, window growth)."""


class CalibrationReport(BaseModel):
    """``summary.json`` ``calibration``: the measured speed of the WAN path."""

    model_config = ConfigDict(extra="forbid")

    method: str
    src: str
    dst: str
    nbytes: int
    one_way_delay_s: float
    channel_rate_mbps: dict[str, float]
    per_flow_rate_mbps: dict[str, float]
    transfer_s: dict[str, list[float]]
    concurrent_channels: int
    colliding_channels_aggregate_mbps: dict[str, float]
    colliding_transfer_s: dict[str, list[float]]
    # the DP all-reduce's channels inside a DC (None: no all-reduce inside a DC to predict)
    lan_pairs: list[tuple[str, str]] | None = None
    lan_nbytes: int | None = None
    lan_channel_rate_mbps: float | None = None
    lan_transfer_s: list[float] | None = None

    def rate_mbps(self, streams: int) -> float | None:
        return self.channel_rate_mbps.get(str(streams))


class Calibration(BaseModel):
    """Measured speed of the WAN path for tensors of the workload's wire size: per
    stream count, each timed transfer (hand-over to arrival) and the channel rate they
    give; apart, the aggregate of `concurrent` channels colliding on the link (all
    sending at once), per direction. The calibration fills it in stream count by
    stream count (testbed/run/calibration.py)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    src: str
    dst: str
    nbytes: int
    latency_s: float
    transfer_s: dict[int, list[float]] = Field(default_factory=dict)
    rates_bps: dict[int, float] = Field(default_factory=dict)
    concurrent: int = 0
    colliding_bps: dict[int, float] = Field(default_factory=dict)
    colliding_s: dict[int, list[float]] = Field(default_factory=dict)
    lan_pairs: list[tuple[str, str]] | None = None
    lan_nbytes: int | None = None
    lan_rate_bps: float | None = None
    lan_transfer_s: list[float] | None = None

    def rate(self, streams: int) -> float:
        return self.rates_bps[streams]

    def report(self) -> CalibrationReport:
        """The ``summary.json`` block of this calibration."""
        return CalibrationReport(
            method=("tensors of the workload's wire size timed over one atlas_transport channel from "
                    f"{self.src} to {self.dst} while another sends the other way, the first {PROBE_WARMUP} "
                    "not timed; channel rate = bytes / (median hand-over-to-arrival time - one-way delay); "
                    f"apart: {self.concurrent} channels colliding (sending at once) each way, their aggregate = "
                    "channels x bytes / (mean hand-over-to-arrival time - one-way delay)"
                    + ("; inside the DCs: the workers' DP ring all-reduce of the largest stage's gradients "
                       "(lan_nbytes) between DP neighbours, all rings at once, rate = bytes each replica sends / "
                       "median ring time (the first not timed)"
                       if self.lan_rate_bps is not None else "")),
            src=self.src, dst=self.dst, nbytes=self.nbytes, one_way_delay_s=self.latency_s,
            channel_rate_mbps={str(n): r / 1e6 for n, r in sorted(self.rates_bps.items())},
            per_flow_rate_mbps={str(n): r / n / 1e6 for n, r in sorted(self.rates_bps.items())},
            transfer_s={str(n): v for n, v in sorted(self.transfer_s.items())},
            concurrent_channels=self.concurrent,
            colliding_channels_aggregate_mbps={str(n): r / 1e6 for n, r in sorted(self.colliding_bps.items())},
            colliding_transfer_s={str(n): v for n, v in sorted(self.colliding_s.items())},
            lan_pairs=self.lan_pairs, lan_nbytes=self.lan_nbytes,
            lan_channel_rate_mbps=None if self.lan_rate_bps is None else self.lan_rate_bps / 1e6,
            lan_transfer_s=self.lan_transfer_s,
        )

    def to_json(self) -> dict:
        """`report` as plain JSON data."""
        return self.report().model_dump(mode="json")
