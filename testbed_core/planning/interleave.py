"""Tensors handed to one multi-stream channel back to back travel side by side.

A channel stripes each tensor over its streams in chunks, each stream taking the next
chunk as soon as its socket's send buffer has room (atlas_transport's work stealing).
Where a tensor is smaller than the streams' send buffers together, the first streams
to wake take all of its chunks into their kernel buffers (about ``ceil(tensor /
tcp_wmem max)`` streams of the channel), and a tensor handed over while it is on its
way lands on the other streams: the two then cross side by side and arrive together,
not one after the other. Measured on dp-2dc (4 MiB tensors, 8 streams of 1 MB send
buffers, handed 2-4 ms apart): the first of two tensors arrived after 0.89-0.94 of
the pair's time, where one after the other gives 0.5; with 8 MiB tensors, which fill
every stream's buffer, 0.57-0.70.

So, in the planner's simulation, such a channel shares its rate among its tensors
(``shared``) instead of sending them in turn (``exclusive``), where the simulation
itself hands it tensors this close together (`interleave`: within `CLOSE` of a
transfer's time, at a fixed point, since tensors that arrive together are answered
together). Its link, where colliding channels were measured to lose part of it
(``Resource.crowded_bps``, the calibration's collision of one tensor per channel),
gets back the rest as more tensors than channels cross it at once (`Filling`): each
tensor adds streams, and the link's goodput bounds the total (dp-2dc: four 4 MiB
tensors one way at 900-956 Mbit/s where two colliding channels moved 716).

That was atlas_transport before its even spread (1745c66): since then each stream takes
at most its share of a tensor's chunks while the other writers wake, so a tensor handed
over behind another lands behind it on every stream and the two go one after the other.
Since 80ce329 only tensors of at most one chunk per stream (128 KiB a stream) are spread
so, since 639fd19 of at most two (`Calibration.even_spread_chunks`); larger ones are
taken greedily. The prediction applies this model to every tensor where the calibration
says the channels took chunks greedily (`Calibration.even_spread` false: kept runs from
before 1745c66), to none where they spread every tensor (even_spread without a size:
runs at 1745c66), and else to the tensors above `even_spread_chunks` x
`even_spread_stream_bytes` per stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

from testbed_core.planning.network import WanPath
from testbed_core.simulate import Resource, SimResult, SimSpec, TransferSpan

CLOSE = 0.1
"""A tensor handed to a channel within this fraction of the previous tensor's time on
the wire (and before it left) goes side by side with it: its chunks come while the
previous one's are still being written to the streams' buffers."""


@dataclass(frozen=True)
class Filling(Resource):
    """A WAN link direction whose colliding channels get ``crowded_bps`` in all (one
    tensor each, as the calibration collides them), and more as more tensors than its
    `channels` cross it at once, up to ``capacity_bps``."""

    channels: int = 2

    def capacity(self, users: int) -> float:
        if users < 2 or self.crowded_bps is None:
            return self.capacity_bps
        return min(self.capacity_bps, self.crowded_bps * max(1.0, users / max(1, self.channels)))


def streams_taken(nbytes: float, send_buffer: float) -> int:
    """How many streams' send buffers one tensor of `nbytes` fills (at least one)."""
    if send_buffer <= 0:
        return 1
    return max(1, math.ceil(nbytes / send_buffer))


def close_pairs(spans: list[TransferSpan], close: float = CLOSE) -> int:
    """How many tensors of one channel (its `spans`) were handed over while the one
    before was still leaving and within `close` of that one's time on the wire."""
    spans = sorted(spans, key=lambda s: s.ready)
    return sum(1 for a, b in zip(spans, spans[1:], strict=False)
               if b.ready < a.end and b.ready - a.ready < close * (a.end - a.start))


def interleave(spec: SimSpec, wan: Mapping[tuple[str, str], WanPath], send_buffer: Callable[[str], float],
               simulate: Callable[[SimSpec], SimResult], close: float = CLOSE,
               even_stream_bytes: float | None = None) -> SimSpec:
    """`spec` with each multi-stream WAN channel whose tensors fill some but not all of
    its streams' send buffers (`send_buffer(dc)`: the sending hosts' tcp_wmem max) and
    which the simulation hands tensors `close` together made ``shared``, and the links
    it crosses `Filling` (module docstring). Channels are added until none is left
    (tensors that arrive together are answered together); `spec` itself is unchanged.
    A channel whose tensors are at most `even_stream_bytes` per stream is left in turn:
    the transport spreads such a tensor one chunk per stream (module docstring).
    Only channels whose rate was measured (a run's calibration: one tensor's time on as
    many streams as it fills): the window model's what-ifs give every tensor all of a
    channel's streams, one tensor after another, as the fast predictor
    (testbed_core/whatif/predict.py) does."""
    candidates: dict[str, WanPath] = {}
    for (_, b, direction), path in spec.paths.items():
        if len(path.resources) < 2:
            continue
        wp = next((w for w in wan.values() if path.resources[1:] == w.resources), None)
        if wp is None or wp.streams < 2 or not wp.measured:
            continue
        nbytes = (spec.bytes_fwd if direction == "fwd" else spec.bytes_bwd)[b]
        if even_stream_bytes is not None and nbytes <= wp.streams * even_stream_bytes:
            continue  # spread one chunk per stream: one tensor after another
        if 2 <= streams_taken(nbytes, send_buffer(wp.src)) < wp.streams:
            candidates[path.resources[0]] = wp
    if not candidates:
        return spec
    resources = dict(spec.resources)
    out = replace(spec, resources=resources)
    shared: set[str] = set()
    for _ in range(len(candidates)):
        by_channel: dict[str, list[TransferSpan]] = {}
        for t in simulate(out).transfers:
            if t.resources and t.resources[0] in candidates and t.resources[0] not in shared:
                by_channel.setdefault(t.resources[0], []).append(t)
        new = {chan for chan, spans in by_channel.items() if close_pairs(spans, close)}
        if not new:
            break
        shared |= new
        for chan in new:
            resources[chan] = replace(resources[chan], policy="shared")
    for chan in shared:
        for link in candidates[chan].resources:
            res = resources[link]
            if res.crowded_bps is not None and not isinstance(res, Filling):
                channels = sum(1 for p in spec.paths.values() if link in p.resources)
                resources[link] = Filling(**{f.name: getattr(res, f.name) for f in fields(Resource)},
                                          channels=channels)
    return out
