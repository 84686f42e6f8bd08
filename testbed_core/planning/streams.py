"""How many TCP streams a variant's WAN channels use, and how it asks to share a link.

Every decision dispatches on the variant's policies in the registry
(testbed_core/variants.py), never on its name: the stream policy (``one``,
``configured``, ``fill-link``) gives the count, the sharing policy whether the
temporal plan is weighed. The inputs are the scenario's settings
(``transport.streams``, ``runner.atlas_sharing``) and, once the run is calibrated, its
`Calibration` (testbed_core/contracts/calibration.py): pure functions, the run's
planning step (testbed/run/variants.py) and calibration (testbed/run/calibration.py)
both call them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from testbed_core.contracts.calibration import Calibration
from testbed_core.planning.prediction import Sharing
from testbed_core.variants import VariantDef

StreamsSetting = int | Literal["auto"]  # transport.streams
# Share of a WAN link's nominal rate that TCP goodput reaches through the shaper
# (headers, HTB, window dynamics). The fill-the-link stream count fills this much.
FILL_GOODPUT = 0.85
STREAMS_MARGIN = 0.05  # fill-link takes the fewest streams timed within this much of the fastest count
MAX_STREAMS = 64
DEFAULT_AUTO_STREAMS = 8  # transport.streams: auto before (or without) a calibration


def configured_streams(setting: StreamsSetting, auto: int | None) -> int:
    """transport.streams (`setting`), or for 'auto' the calibrated best (`auto`)."""
    return (auto or DEFAULT_AUTO_STREAMS) if setting == "auto" else int(setting)


def choose_streams(definition: VariantDef, setting: StreamsSetting, flow_bps: float | None,
                   link_bps: float | None, auto: int | None) -> int:
    """TCP streams per WAN channel by the variant's stream policy: ``one``: 1;
    ``configured``: transport.streams (or the calibrated best for 'auto'); ``fill-link``:
    at least enough streams to fill the link (the planner's rule), counted against the
    goodput a shaped link gives TCP (FILL_GOODPUT of its nominal rate)."""
    if definition.streams == "one":
        return 1
    n = configured_streams(setting, auto)
    if definition.streams == "fill-link" and flow_bps and link_bps:
        n = max(n, min(MAX_STREAMS, math.ceil(FILL_GOODPUT * link_bps / flow_bps - 1e-9)))
    return n


def mean_rate(nbytes: int, durations: Sequence[float], channels: int, latency_s: float) -> float:
    """`channels` x `nbytes` over (the mean of the transfers' `durations` - the one-way
    delay), in bit/s (`durations` not empty)."""
    mean = sum(durations) / len(durations)
    return channels * nbytes * 8 / max(1e-6, mean - latency_s)


def timed_rate(cal: Calibration, streams: int) -> float:
    """A channel's rate at `streams` from the mean of its timed transfers on the
    primary path (`mean_rate` of one channel); the calibrated rate where the
    transfers were not kept."""
    times = cal.transfer_s.get(streams)
    return mean_rate(cal.nbytes, times, 1, cal.latency_s) if times else cal.rates_bps[streams]


def fill_link_streams(fill: int, setting: StreamsSetting, cal: Calibration | None, auto: int | None) -> int:
    """Streams per channel of a fill-link variant: of the counts the calibration timed
    (the formula's count `fill` to fill the link, transport.streams and the single
    stream every calibration times), the fewest within STREAMS_MARGIN of the fastest.
    On long RTTs many flows collapse together, on short ones a single flow nearly fills
    the link and more overflow its queue; where a tensor is too small to need more than
    one window, one stream is as fast as eight and has no tail of slow streams. Each
    count is judged by its mean transfer time (`timed_rate`), not the median that
    `rates_bps` holds: a count whose transfers now and then wait a round trip longer
    (the last stream of eight opening its window) is slower on average, which a median
    of a few transfers hides."""
    if cal is None:
        return fill
    plain = configured_streams(setting, auto)
    measured = {n: timed_rate(cal, n) for n in {fill, plain, 1} if n in cal.rates_bps}
    if not measured:
        return fill
    best = max(measured.values())
    return min(n for n, rate in measured.items() if rate >= (1 - STREAMS_MARGIN) * best)


def variant_streams(definition: VariantDef, setting: StreamsSetting, cal: Calibration | None,
                    auto: int | None, nominal_bps: float | None) -> int:
    """The streams a variant runs with: its policy's count, and for fill-link the
    calibration's verdict on it (`fill_link_streams`). Without a calibration, the
    policy's count before any is made (fill-link: transport.streams)."""
    flow1 = cal.rates_bps.get(1) if cal else None
    n = choose_streams(definition, setting, flow1, nominal_bps, auto)
    if definition.streams == "fill-link":
        n = fill_link_streams(n, setting, cal, auto)
    return n


def timed_counts(definition: VariantDef, setting: StreamsSetting, cal: Calibration | None, auto: int | None,
                 nominal_bps: float | None) -> list[int]:
    """The stream counts a fill-link variant may take that the calibration timed (the
    formula's count to fill the link, transport.streams, one) on the primary path and
    on every path it crosses, fewest first; none for other stream policies."""
    if cal is None or definition.streams != "fill-link":
        return []
    fill = choose_streams(definition, setting, cal.rates_bps.get(1), nominal_bps, auto)
    paths = [pc for pc in cal.paths if definition.name in pc.variants] or cal.paths
    return sorted(n for n in {fill, configured_streams(setting, auto), 1}
                  if n in cal.rates_bps and all(n in pc.rates_bps for pc in paths))


def requested_sharing(definition: VariantDef, atlas_sharing: Sharing) -> Sharing:
    """How the variant asks to use its WAN links: its sharing policy, with ``auto``
    resolved by ``runner.atlas_sharing`` (which may fix it to temporal or shared)."""
    return atlas_sharing if definition.sharing == "auto" else definition.sharing
