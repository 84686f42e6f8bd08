"""The WAN calibration of `testbed run`: what the probes measured, and the block of
``summary.json`` that reports it.

`Calibration` is the measurement the run works with (stream count -> channel rate in
bits/s, as the variants' predictions need it); `CalibrationReport` is its form in
``summary.json`` (Mbit/s, stream counts as JSON keys, the method spelled out), made by
`Calibration.report` and read back by whoever reads a summary.

Every WAN path the variants' placements cross is timed on its own (`PathCalibration`,
one per pair of DCs: its single-stream rate, the rates of the stream counts the
variants send with there, and, where several channels collide on it, their aggregate);
the top-level figures of `Calibration` repeat those of the primary path (the first
crossing of Atlas's placement) for the readers that want one path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, TypeVar

from pydantic import BaseModel, ConfigDict, Field

PROBE_WARMUP = 2
"""Calibration tensors sent first and not timed (connection set-up, window growth)."""

TURNS_MAX_UNTIMED = 3
"""The turns probe (`TurnsCalibration`) sends each channel at most this many untimed
tensors first (the run's warm-up iterations' tensors, capped to keep the probe short).
In the probes kept at 8 (results/prediction-errors/head-1205, fresh) the first tensor
of a channel took 1.4-4.4 x its steady time (slow start), the second up to 1.9 x, the
third on were at it within the path's spread; timed from the fourth, the holds came
out the same within that spread (docs/results/fidelity.md, "The turns probe")."""


def dc_of_host(host: str) -> str:
    """The DC of a host named `<dc>-<host>` (the emulation's naming)."""
    return host.split("-", 1)[0]


_V = TypeVar("_V", float, list[float])


def _bps(mbps: float | None) -> float | None:
    return None if mbps is None else mbps * 1e6


def _by_count(values: Mapping[str, _V], factor: float = 1.0) -> dict[int, _V]:
    """A report's per-stream-count mapping (JSON keys) back to int keys, scaled by
    `factor` (rates only: a list of times is never scaled)."""
    return {int(n): (v * factor if factor != 1.0 else v) for n, v in values.items()}  # type: ignore[operator, misc]


EVEN_SPREAD_STREAM_BYTES = 128 << 10
"""atlas_transport's smallest chunk (``atlas_transport.channel.SPLIT_MIN_BYTES``; a unit
test holds the two equal): the chunk size of the tensors it spreads evenly, what a
calibration made with this checkout records."""
EVEN_SPREAD_CHUNKS = 2
"""How many of those smallest chunks per stream a tensor atlas_transport spreads evenly
may have (``atlas_transport.channel.SPREAD_CHUNKS``; a unit test holds the two equal):
one until 639fd19, two since."""

class _Together(BaseModel):
    """What a probe with every path of a placement loaded at once is: `streams` per
    channel, the DC pairs loaded together, the colliding channels each way."""

    model_config = ConfigDict(extra="forbid")

    streams: int  # TCP streams per channel in this probe
    paths: list[tuple[str, str]]  # the DC pairs loaded at once
    channels: int  # colliding channels each way on every path


class TogetherCalibration(_Together):
    """One WAN path's figures while every path of a placement is loaded at once: the
    delay lines of all WAN links share the machine's cores, so a path gives less while
    the others are busy than timed alone. `paths`: the DC pairs loaded together (this
    one among them); `rate_bps`: one channel of `streams` each way on every path, its
    channel rate here; `colliding_bps`: the placement's `channels` colliding channels
    each way on every path, their aggregate here (None: one channel crosses here)."""

    rate_bps: float | None = None
    transfer_s: list[float] = Field(default_factory=list)
    colliding_bps: float | None = None
    colliding_s: list[float] = Field(default_factory=list)

    def loads(self, paths: list[tuple[str, str]] | set[frozenset[str]]) -> bool:
        """Whether this probe loaded exactly `paths` (DC pairs, either order)."""
        return {frozenset(p) for p in self.paths} == {frozenset(p) for p in paths}

    def report(self) -> TogetherCalibrationReport:
        return TogetherCalibrationReport(
            streams=self.streams, paths=self.paths, channels=self.channels,
            channel_rate_mbps=None if self.rate_bps is None else self.rate_bps / 1e6, transfer_s=self.transfer_s,
            colliding_aggregate_mbps=None if self.colliding_bps is None else self.colliding_bps / 1e6,
            colliding_transfer_s=self.colliding_s)

    @classmethod
    def from_report(cls, r: TogetherCalibrationReport) -> TogetherCalibration:
        """The measurement back from its ``summary.json`` form."""
        return cls(streams=r.streams, paths=r.paths, channels=r.channels, rate_bps=_bps(r.channel_rate_mbps),
                   transfer_s=r.transfer_s, colliding_bps=_bps(r.colliding_aggregate_mbps),
                   colliding_s=r.colliding_transfer_s)


class TogetherCalibrationReport(_Together):
    """``summary.json`` ``calibration.paths[].together[]``: `TogetherCalibration` in Mbit/s."""

    # one channel's rate on this path with every path loaded, Mbit/s
    channel_rate_mbps: float | None = None
    # each timed transfer of that probe, seconds
    transfer_s: list[float] = Field(default_factory=list)
    # the colliding channels' aggregate on this path with every path loaded, Mbit/s
    colliding_aggregate_mbps: float | None = None
    # each timed transfer of the colliding probe, seconds
    colliding_transfer_s: list[float] = Field(default_factory=list)


class TurnsCalibration(BaseModel):
    """One WAN path timed as a temporal plan uses it (``summary.json``
    ``calibration.paths[].turns[]``, seconds as they are): the `channels` pipelines
    crossing it each way take turns, one tensor of the workload's wire size at a time on
    each link direction, each turn two planned holds after the last (`slot_s`, the planned
    hold of one transfer: the alone probe's time on the wire, token_margin longer; two, so
    that a late transfer meets no other), both directions at once, on
    cold channels: no warm-up tensor, only the `untimed` tensors the run's own channels
    carry in its warm-up iterations before the measured ones (at most
    TURNS_MAX_UNTIMED). `transfer_s`: each timed transfer from the path's first DC to
    its second, hand-over to arrival; `return_s`: the other way."""

    model_config = ConfigDict(extra="forbid")

    streams: int  # TCP streams per channel
    channels: int  # channels taking turns each way
    slot_s: float  # the planned hold of one transfer the probe was played with, seconds
    untimed: int  # tensors each channel sent first, not timed
    transfer_s: list[float] = Field(default_factory=list)  # each timed transfer dcs[0] -> dcs[1], seconds
    return_s: list[float] = Field(default_factory=list)  # each timed transfer dcs[1] -> dcs[0], seconds


class VerifyCalibration(BaseModel):
    """The host CPU time of the tensor checks (``runner.verify_tensors``, ``summary.json``
    ``calibration.verify``, seconds as they are): a sender fills each modelled tensor
    with its own pattern before handing it over, its receiver compares every byte on
    arrival (testbed/training/transport_comm.py `TransportComm`), each in the rank's
    own thread, so both hold up the pipeline like compute. Timed with the training's
    own code on tensors of the workload's wire size sent both ways over the first WAN
    path (as a pipeline's activations and gradients cross while the checks run); the
    planner adds the means to the stages that send and receive
    (testbed_core/planning/host_cpu.py)."""

    model_config = ConfigDict(extra="forbid")

    nbytes: int  # bytes of each checked tensor (the workload's wire size)
    fill_s: list[float] = Field(min_length=1)  # each timed pattern fill on a sender, seconds
    check_s: list[float] = Field(min_length=1)  # each timed byte-for-byte check on a receiver, seconds

    @property
    def fill_mean_s(self) -> float:
        """A send's mean fill: the rank pays every one, the slow ones included."""
        return sum(self.fill_s) / len(self.fill_s)

    @property
    def check_mean_s(self) -> float:
        """A receive's mean check."""
        return sum(self.check_s) / len(self.check_s)


class PathCalibrationReport(BaseModel):
    """``summary.json`` ``calibration.paths[]``: one WAN path's measured speed."""

    model_config = ConfigDict(extra="forbid")

    dcs: tuple[str, str]  # the path's two DCs
    src: str  # the host the probe sent from
    dst: str  # the host the probe sent to
    one_way_delay_s: float  # the path's one-way delay, seconds
    nominal_rate_mbps: float | None = None  # the path's narrowest link rate as configured, Mbit/s
    channel_rate_mbps: dict[str, float]  # per stream count, one channel's measured rate, Mbit/s
    per_flow_rate_mbps: dict[str, float]  # per stream count, that rate per TCP stream, Mbit/s
    # per stream count, each timed transfer (hand-over to arrival), seconds
    transfer_s: dict[str, list[float]]
    concurrent_channels: int  # channels sent at once in the colliding probe
    # per stream count, the colliding channels' aggregate, Mbit/s
    colliding_channels_aggregate_mbps: dict[str, float]
    # per stream count, each timed transfer of the colliding probe, seconds
    colliding_transfer_s: dict[str, list[float]]
    # the variants whose placement crosses this path
    variants: list[str] = Field(default_factory=list)
    # the DP rings crossing this path (dp-across-dc), all at once: their aggregate
    ring_channels: int | None = None
    ring_streams: int | None = None  # TCP streams per ring channel
    ring_nbytes: int | None = None  # bytes per timed ring transfer
    ring_aggregate_mbps: float | None = None  # the rings' aggregate each way, Mbit/s
    ring_s: list[float] | None = None  # each timed ring transfer, seconds
    # this path's figures while every path of a placement was loaded at once (TogetherCalibration)
    together: list[TogetherCalibrationReport] | None = None
    # the path timed as a temporal plan uses it, per stream count (None: not timed, or a
    # summary written before this probe)
    turns: list[TurnsCalibration] | None = None
    # per stream count, one channel timed alone one way (no traffic the other way), Mbit/s,
    # and each of its timed transfers, seconds (None: not timed, or a summary before this probe)
    one_way_channel_rate_mbps: dict[str, float] | None = None
    one_way_transfer_s: dict[str, list[float]] | None = None  # per stream count, each one-way transfer, seconds


class _FiguresReport(TypedDict):
    """The per-stream-count figures of a calibration report (Mbit/s, counts as JSON keys)."""

    channel_rate_mbps: dict[str, float]
    per_flow_rate_mbps: dict[str, float]
    transfer_s: dict[str, list[float]]
    concurrent_channels: int
    colliding_channels_aggregate_mbps: dict[str, float]
    colliding_transfer_s: dict[str, list[float]]


class _FiguresData(TypedDict):
    """The same figures as `_Figures` holds them (bits/s, counts as ints)."""

    transfer_s: dict[int, list[float]]
    rates_bps: dict[int, float]
    concurrent: int
    colliding_bps: dict[int, float]
    colliding_s: dict[int, list[float]]


class _Figures(BaseModel):
    """What the probes measured on a path, per stream count: each timed transfer and
    the channel rate they give; apart, the aggregate of `concurrent` colliding
    channels, per stream count."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    transfer_s: dict[int, list[float]] = Field(default_factory=dict)
    rates_bps: dict[int, float] = Field(default_factory=dict)
    concurrent: int = 0
    colliding_bps: dict[int, float] = Field(default_factory=dict)
    colliding_s: dict[int, list[float]] = Field(default_factory=dict)

    def rate(self, streams: int) -> float:
        return self.rates_bps[streams]

    def figures_report(self) -> _FiguresReport:
        """These figures as a report gives them."""
        return _FiguresReport(
            channel_rate_mbps={str(n): r / 1e6 for n, r in sorted(self.rates_bps.items())},
            per_flow_rate_mbps={str(n): r / n / 1e6 for n, r in sorted(self.rates_bps.items())},
            transfer_s={str(n): v for n, v in sorted(self.transfer_s.items())},
            concurrent_channels=self.concurrent,
            colliding_channels_aggregate_mbps={str(n): r / 1e6 for n, r in sorted(self.colliding_bps.items())},
            colliding_transfer_s={str(n): v for n, v in sorted(self.colliding_s.items())},
        )

    @staticmethod
    def figures_of(r: PathCalibrationReport | CalibrationReport) -> _FiguresData:
        """The figures back from a report."""
        return _FiguresData(transfer_s=_by_count(r.transfer_s), rates_bps=_by_count(r.channel_rate_mbps, 1e6),
                            concurrent=r.concurrent_channels,
                            colliding_bps=_by_count(r.colliding_channels_aggregate_mbps, 1e6),
                            colliding_s=_by_count(r.colliding_transfer_s))


class PathCalibration(_Figures):
    """One WAN path (between two DCs, both directions at once) as the probes measured
    it: per stream count, each timed transfer and the channel rate they give; apart,
    the aggregate of `concurrent` channels colliding on it, per stream count."""

    dcs: tuple[str, str]
    src: str
    dst: str
    nbytes: int
    latency_s: float
    nominal_bps: float | None = None
    variants: list[str] = Field(default_factory=list)  # the variants whose placement crosses it
    ring_channels: int | None = None  # DP rings crossing the path, timed all at once
    ring_streams: int | None = None
    ring_nbytes: int | None = None  # gradient bytes of each ring
    ring_bps: float | None = None  # their aggregate each way: rings x bytes each replica sends / ring time
    ring_s: list[float] | None = None
    together: list[TogetherCalibration] = Field(default_factory=list)  # timed with other paths loaded at once
    turns: list[TurnsCalibration] = Field(default_factory=list)  # timed as a temporal plan uses it
    # one channel alone one way (the rate probe sends both ways at once), per stream count
    one_way_bps: dict[int, float] = Field(default_factory=dict)
    one_way_s: dict[int, list[float]] = Field(default_factory=dict)

    def turns_for(self, streams: int) -> TurnsCalibration | None:
        """This path timed as a temporal plan uses it with channels of `streams`, if it was."""
        return next((t for t in self.turns if t.streams == streams and t.transfer_s and t.return_s), None)

    def together_for(self, streams: int, paths: list[tuple[str, str]] | set[frozenset[str]]
                     ) -> TogetherCalibration | None:
        """This path's figures for `streams` while exactly `paths` were loaded at once."""
        return next((t for t in self.together if t.streams == streams and t.loads(paths)), None)

    def joins(self, a: str, b: str) -> bool:
        """Whether this is the path between DCs `a` and `b` (either order)."""
        return {a, b} == set(self.dcs)

    def report(self) -> PathCalibrationReport:
        return PathCalibrationReport(
            dcs=self.dcs, src=self.src, dst=self.dst, one_way_delay_s=self.latency_s,
            nominal_rate_mbps=None if self.nominal_bps is None else self.nominal_bps / 1e6,
            **self.figures_report(), variants=self.variants, ring_channels=self.ring_channels, ring_streams=self.ring_streams,
            ring_nbytes=self.ring_nbytes, ring_aggregate_mbps=None if self.ring_bps is None else self.ring_bps / 1e6,
            ring_s=self.ring_s, together=[t.report() for t in self.together] or None,
            turns=list(self.turns) or None,
            one_way_channel_rate_mbps={str(n): r / 1e6 for n, r in sorted(self.one_way_bps.items())} or None,
            one_way_transfer_s={str(n): v for n, v in sorted(self.one_way_s.items())} or None,
        )

    @classmethod
    def from_report(cls, r: PathCalibrationReport, nbytes: int) -> PathCalibration:
        """The measurement back from its ``summary.json`` form (`nbytes`: the
        calibration's tensor size, which the report gives once for every path)."""
        return cls(dcs=r.dcs, src=r.src, dst=r.dst, nbytes=nbytes, latency_s=r.one_way_delay_s,
                   nominal_bps=_bps(r.nominal_rate_mbps), **cls.figures_of(r), variants=r.variants,
                   ring_channels=r.ring_channels, ring_streams=r.ring_streams, ring_nbytes=r.ring_nbytes,
                   ring_bps=_bps(r.ring_aggregate_mbps), ring_s=r.ring_s,
                   together=[TogetherCalibration.from_report(t) for t in r.together or []],
                   turns=list(r.turns or []), one_way_bps=_by_count(r.one_way_channel_rate_mbps or {}, 1e6),
                   one_way_s=_by_count(r.one_way_transfer_s or {}))


class CalibrationReport(BaseModel):
    """``summary.json`` ``calibration``: the measured speed of the WAN path."""

    model_config = ConfigDict(extra="forbid")

    method: str  # how the path was measured (the probe)
    src: str  # the host the probe sent from
    dst: str  # the host the probe sent to
    nbytes: int  # bytes per timed transfer (the workload's wire size)
    one_way_delay_s: float  # the path's one-way delay, seconds
    channel_rate_mbps: dict[str, float]  # per stream count, one channel's measured rate, Mbit/s
    per_flow_rate_mbps: dict[str, float]  # per stream count, that rate per TCP stream, Mbit/s
    # per stream count, each timed transfer (hand-over to arrival), seconds
    transfer_s: dict[str, list[float]]
    concurrent_channels: int  # channels sent at once in the colliding probe
    # per stream count, the colliding channels' aggregate, Mbit/s
    colliding_channels_aggregate_mbps: dict[str, float]
    # per stream count, each timed transfer of the colliding probe, seconds
    colliding_transfer_s: dict[str, list[float]]
    # the DP all-reduce's channels inside a DC (None: no all-reduce inside a DC to predict)
    lan_pairs: list[tuple[str, str]] | None = None
    lan_nbytes: int | None = None  # bytes per timed transfer inside a DC
    lan_channel_rate_mbps: float | None = None  # one all-reduce channel's rate inside a DC, Mbit/s
    lan_transfer_s: list[float] | None = None  # each timed transfer inside a DC, seconds
    # one of those rings (the first pair) timed alone, Mbit/s per replica (None: one
    # ring only, or a summary written before this probe)
    lan_alone_channel_rate_mbps: float | None = None
    lan_alone_transfer_s: list[float] | None = None  # each timed run of that ring alone, seconds
    # a pipeline boundary inside a DC where no DP ring was timed there: one tensor of the
    # workload's wire size at a time over a one-stream channel between its two hosts, both
    # ways (None: no such boundary, a DP ring timed, or a summary written before this probe)
    lan_tensor_pair: tuple[str, str] | None = None
    lan_tensor_channel_rate_mbps: float | None = None  # bytes / median transfer time, Mbit/s
    lan_tensor_transfer_s: list[float] | None = None  # each timed transfer, seconds
    # a piece of modelled work on an emulated device past its modelled time (its lock,
    # records and sleep), seconds: the median over short holds, each worker's compute op
    # pays it (testbed/run/calibration.py `calibrate_host_ops`; None: not timed)
    op_overhead_s: float | None = None
    op_overhead_samples_s: list[float] | None = None  # each timed hold's time past its modelled time, seconds
    # a pipeline's channels inside the DCs and over the WAN at once, one each way per
    # boundary, in rounds (testbed/run/calibration.py `calibrate_lan_loaded`;
    # lan_loaded_with: the WAN boundaries' host pairs, each with its stream count; None:
    # not timed so): the tensors inside a DC then, and the WAN's beside them
    lan_loaded_with: list[tuple[str, str, int]] | None = None
    lan_loaded_channel_rate_mbps: float | None = None  # bytes / median transfer time, Mbit/s
    lan_loaded_transfer_s: list[float] | None = None  # each timed transfer inside a DC, seconds
    lan_loaded_wan_transfer_s: list[float] | None = None  # the WAN's, beside them
    # every WAN path the variants' placements cross, each timed on its own (the first: the
    # primary path above); None in summaries written before per-path calibration
    paths: list[PathCalibrationReport] | None = None
    # the tensor checks' CPU time (runner.verify_tensors on modelled devices; None: off,
    # or a summary written before this probe)
    verify: VerifyCalibration | None = None
    wall_s: float | None = None  # how long the calibration took
    # the channels spread each tensor evenly over their streams (atlas_transport's even
    # spread, since 1745c66): a tensor handed to a channel behind another goes after it
    # on every stream; false (and absent, in summaries written before): the first
    # streams to wake took a tensor's chunks, and one handed over behind it went side by
    # side on the others (testbed_core/planning/interleave.py)
    even_spread: bool = False
    # with even_spread: the largest tensor the spread applies to, per stream of the
    # channel (a tensor of at most streams x this many bytes goes one chunk per stream;
    # larger ones keep plain work stealing, since 80ce329); None: every size (1745c66)
    even_spread_stream_bytes: int | None = None
    # with even_spread_stream_bytes: how many such chunks per stream the spread covers (a
    # tensor of at most streams x this x even_spread_stream_bytes goes in even shares;
    # 1, and absent, in summaries before the two-chunk spread)
    even_spread_chunks: int = 1

    def rate_mbps(self, streams: int) -> float | None:
        return self.channel_rate_mbps.get(str(streams))


class Calibration(_Figures):
    """Measured speed of the WAN path for tensors of the workload's wire size: per
    stream count, each timed transfer (hand-over to arrival) and the channel rate they
    give; apart, the aggregate of `concurrent` channels colliding on the link (all
    sending at once), per direction. The calibration fills it in stream count by
    stream count (testbed/run/calibration.py)."""

    src: str
    dst: str
    nbytes: int
    latency_s: float
    lan_pairs: list[tuple[str, str]] | None = None
    lan_nbytes: int | None = None
    lan_rate_bps: float | None = None
    lan_transfer_s: list[float] | None = None
    lan_alone_rate_bps: float | None = None
    lan_alone_transfer_s: list[float] | None = None
    lan_tensor_pair: tuple[str, str] | None = None
    lan_tensor_rate_bps: float | None = None
    lan_tensor_transfer_s: list[float] | None = None
    op_overhead_s: float | None = None
    op_overhead_samples_s: list[float] | None = None
    lan_loaded_with: list[tuple[str, str, int]] | None = None
    lan_loaded_rate_bps: float | None = None
    lan_loaded_transfer_s: list[float] | None = None
    lan_loaded_wan_s: list[float] | None = None
    paths: list[PathCalibration] = Field(default_factory=list)
    verify: VerifyCalibration | None = None
    wall_s: float | None = None
    # measured with this checkout's transport, which spreads each tensor evenly over a
    # channel's streams (CalibrationReport.even_spread); from_report keeps a kept run's word
    even_spread: bool = True
    even_spread_stream_bytes: int | None = EVEN_SPREAD_STREAM_BYTES
    even_spread_chunks: int = EVEN_SPREAD_CHUNKS
    # how the figures were measured, as a kept run's report said (from_report); None: as
    # this checkout's probes measure them (the method `report` spells out)
    method: str | None = None

    def primary(self) -> PathCalibration:
        """The primary path: the first of `paths`, or the top-level figures as one path."""
        if self.paths:
            return self.paths[0]
        return PathCalibration(dcs=(dc_of_host(self.src), dc_of_host(self.dst)), src=self.src, dst=self.dst,
                               nbytes=self.nbytes, latency_s=self.latency_s, transfer_s=self.transfer_s,
                               rates_bps=self.rates_bps, concurrent=self.concurrent,
                               colliding_bps=self.colliding_bps, colliding_s=self.colliding_s)

    def path(self, a: str, b: str) -> PathCalibration | None:
        """The calibration of the path between DCs `a` and `b` (either order); None
        when it was not timed. Without per-path figures, the one path timed stands for
        every path (the calibration of summaries before per-path calibration)."""
        for p in self.paths:
            if p.joins(a, b):
                return p
        return None if self.paths else self.primary()

    def mirror_primary(self) -> None:
        """Copy the primary path's figures to the top level (what one-path readers read)."""
        if not self.paths:
            return
        p = self.paths[0]
        self.src, self.dst, self.nbytes, self.latency_s = p.src, p.dst, p.nbytes, p.latency_s
        self.transfer_s, self.rates_bps = dict(p.transfer_s), dict(p.rates_bps)
        self.concurrent, self.colliding_bps, self.colliding_s = p.concurrent, dict(p.colliding_bps), dict(p.colliding_s)

    def report(self) -> CalibrationReport:
        """The ``summary.json`` block of this calibration."""
        return CalibrationReport(
            method=self.method or (("every WAN path the variants' placements cross timed on its own (paths; the top level is "
                     "the first of them), each as follows: " if self.paths else "")
                    + "tensors of the workload's wire size timed over one atlas_transport channel from "
                    f"{self.src} to {self.dst} whose receiver hands each one back as it arrives (a pipeline's "
                    "boundary channel carries activations one way and gradients the other), opened as the run "
                    "opens its channels (cold on modelled devices, warmed on real ones) and clamped as the "
                    "variants it stands for clamp theirs (one stream and the auto candidates unclamped), "
                    "the tensors a run's channel carries in its warm-up iterations (at most 8) not timed; "
                    "channel rate = bytes / (median hand-over-to-arrival time - one-way delay); "
                    f"apart: {self.concurrent} channels colliding (sending at once) each way, their aggregate = "
                    "channels x bytes / (mean hand-over-to-arrival time - one-way delay)"
                    + ("; inside the DCs: the workers' DP ring all-reduce of the largest stage's gradients "
                       "(lan_nbytes) between DP neighbours, all rings at once, rate = bytes each replica sends / "
                       "median ring time (the first not timed)"
                       + ("; then the first of those rings alone, the same way (lan_alone_channel_rate_mbps)"
                          if self.lan_alone_rate_bps is not None else "")
                       if self.lan_rate_bps is not None else "")
                    + ("; inside a DC where no DP ring was timed, a pipeline boundary's two hosts "
                       "(lan_tensor_pair): tensors of the wire size over a one-stream channel, as the run's "
                       "channels inside a DC, both ways, rate = bytes / median hand-over-to-arrival time"
                       if self.lan_tensor_rate_bps is not None else "")
                    + ("; then that placement's pipeline, every boundary at once (the WAN ones: lan_loaded_with, "
                       "with their stream counts), one channel each way per boundary, a tensor of the wire size on "
                       "each in synchronised rounds: the tensors inside a DC (lan_loaded_channel_rate_mbps, bytes / "
                       "median time) and the WAN's beside them"
                       if self.lan_loaded_rate_bps is not None else "")
                    + ("; short holds of an emulated device as the workers hold theirs, one after another "
                       "(op_overhead_s: the median time each took past its modelled time)"
                       if self.op_overhead_s is not None else "")
                    + ("; a path the DP rings cross (dp-across-dc): the workers' ring all-reduce of the largest "
                       "stage's gradients between the replicas of every stage crossing it, all at once, aggregate = "
                       "rings x bytes each replica sends / (median ring time - 2 one-way delays)"
                       if any(p.ring_bps for p in self.paths) else "")
                    + ("; a path a temporal plan crosses (turns): the plan's pipelines' cold channels taking turns "
                       "each way, each transfer two planned holds after the last, both ways at once; a planned "
                       "transfer holds its link the later of its planned end and its time on the wire plus the "
                       "hand-over, the mean taken"
                       if any(p.turns for p in self.paths) else "")
                    + ("; a path shared multi-stream channels cross: one such channel alone one way too, nothing "
                       "the other way (one_way_channel_rate_mbps; the rate above carries tensors both ways)"
                       if any(p.one_way_bps for p in self.paths) else "")
                    + ("; the tensor checks (verify): each pattern fill on a sender and each byte-for-byte check "
                       "on a receiver timed with the training's code, tensors crossing the first path both ways"
                       if self.verify is not None else "")),
            src=self.src, dst=self.dst, nbytes=self.nbytes, one_way_delay_s=self.latency_s,
            **self.figures_report(), lan_pairs=self.lan_pairs, lan_nbytes=self.lan_nbytes,
            lan_channel_rate_mbps=None if self.lan_rate_bps is None else self.lan_rate_bps / 1e6,
            lan_transfer_s=self.lan_transfer_s,
            lan_alone_channel_rate_mbps=None if self.lan_alone_rate_bps is None else self.lan_alone_rate_bps / 1e6,
            lan_alone_transfer_s=self.lan_alone_transfer_s,
            lan_tensor_pair=self.lan_tensor_pair,
            lan_tensor_channel_rate_mbps=None if self.lan_tensor_rate_bps is None else self.lan_tensor_rate_bps / 1e6,
            lan_tensor_transfer_s=self.lan_tensor_transfer_s,
            op_overhead_s=self.op_overhead_s,
            op_overhead_samples_s=self.op_overhead_samples_s,
            lan_loaded_with=self.lan_loaded_with,
            lan_loaded_channel_rate_mbps=None if self.lan_loaded_rate_bps is None else self.lan_loaded_rate_bps / 1e6,
            lan_loaded_transfer_s=self.lan_loaded_transfer_s,
            lan_loaded_wan_transfer_s=self.lan_loaded_wan_s,
            paths=[p.report() for p in self.paths] or None,
            verify=self.verify,
            wall_s=self.wall_s,
            even_spread=self.even_spread,
            even_spread_stream_bytes=self.even_spread_stream_bytes,
            even_spread_chunks=self.even_spread_chunks,
        )

    @classmethod
    def from_report(cls, r: CalibrationReport) -> Calibration:
        """The measurement back from its ``summary.json`` form, as the run's
        predictions used it (what re-predicting a kept run from its own calibration needs)."""
        return cls(src=r.src, dst=r.dst, nbytes=r.nbytes, latency_s=r.one_way_delay_s, **cls.figures_of(r),
                   lan_pairs=r.lan_pairs, lan_nbytes=r.lan_nbytes,
                   lan_rate_bps=_bps(r.lan_channel_rate_mbps), lan_transfer_s=r.lan_transfer_s,
                   lan_alone_rate_bps=_bps(r.lan_alone_channel_rate_mbps), lan_alone_transfer_s=r.lan_alone_transfer_s,
                   lan_tensor_pair=r.lan_tensor_pair, lan_tensor_rate_bps=_bps(r.lan_tensor_channel_rate_mbps),
                   lan_tensor_transfer_s=r.lan_tensor_transfer_s,
                   op_overhead_s=r.op_overhead_s, op_overhead_samples_s=r.op_overhead_samples_s,
                   lan_loaded_with=r.lan_loaded_with,
                   lan_loaded_rate_bps=_bps(r.lan_loaded_channel_rate_mbps), lan_loaded_transfer_s=r.lan_loaded_transfer_s,
                   lan_loaded_wan_s=r.lan_loaded_wan_transfer_s,
                   paths=[PathCalibration.from_report(p, r.nbytes) for p in r.paths or []], verify=r.verify,
                   wall_s=r.wall_s, even_spread=r.even_spread,
                   even_spread_stream_bytes=r.even_spread_stream_bytes, even_spread_chunks=r.even_spread_chunks,
                   method=r.method)
