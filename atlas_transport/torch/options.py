"""Settings of the `atlas` torch.distributed backend: `AtlasOptions` (pass it as
`pg_options`) or the ATLAS_* environment variables, validated once when a group is
created so that a bad value fails at `init_process_group`, naming the variable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from ..protocol import MAX_STREAMS

STREAMS_ENV = "ATLAS_STREAMS"
PACING_ENV = "ATLAS_PACING_MBPS"
CONGESTION_ENV = "ATLAS_CONGESTION"
BIND_ENV = "ATLAS_BIND_ADDR"
IDLE_ENV = "ATLAS_IDLE_TIMEOUT_S"
INTRA_SITE_ENV = "ATLAS_INTRA_SITE"
INTRA_SITE_CHOICES = ("gloo", "atlas")

# Default stream count when neither ATLAS_STREAMS nor pg_options set one: measured RTT
# to the peer (three TCP connects, one round trip each) below LAN_RTT_S means a LAN,
# where one flow fills the path and extra streams only cost CPU; otherwise
# WAN_STREAMS, the testbed's own default before calibration (DEFAULT_AUTO_STREAMS).
LAN_RTT_S = 0.002
WAN_STREAMS = 8

Streams = int | Literal["auto"] | None


@dataclass(frozen=True)
class AtlasOptions:
    """Per-group settings; None fields fall back to the environment, then defaults.

    streams: TCP streams per peer pair: an integer, "auto" (the transport's probe,
        once per peer), or None (ATLAS_STREAMS, else 1 on a path under 2 ms RTT and
        8 otherwise).
    pacing_rate_mbps: per-stream cap (SO_MAX_PACING_RATE); env ATLAS_PACING_MBPS.
    congestion: TCP congestion control of every stream; env ATLAS_CONGESTION.
    bind_addr: address this rank listens on and publishes; env ATLAS_BIND_ADDR, else
        the local address that routes to MASTER_ADDR (the store's host).
    idle_timeout_s: a stream silent for this long (no data, no heartbeat) is dead;
        env ATLAS_IDLE_TIMEOUT_S; None: the group's timeout / 2, at most 30 s.
    intra_site: what carries collectives between ranks of one site: "gloo" (a gloo
        group per site, built by the atlas group at its first collective; atlas
        channels only cross between sites) or "atlas" (atlas channels everywhere);
        env ATLAS_INTRA_SITE; None: "gloo".
    """

    streams: Streams = None
    pacing_rate_mbps: float | None = None
    congestion: str | None = None
    bind_addr: str | None = None
    idle_timeout_s: float | None = None
    intra_site: str | None = None


def parse_streams(value: object, source: str) -> int | Literal["auto"]:
    """An integer 1..MAX_STREAMS or "auto"; anything else is refused naming `source`."""
    n = value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit():
            n = int(text)
    if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_STREAMS:
        return n
    raise ValueError(
        f"{source}={value!r}: use an integer 1..{MAX_STREAMS} (TCP streams per peer pair) or 'auto' "
        f"(probe each peer once); leave it unset for 1 stream on a path under {LAN_RTT_S * 1000:g} ms RTT "
        f"and {WAN_STREAMS} otherwise"
    )


def parse_intra_site(value: object, source: str) -> str:
    """"gloo" or "atlas" (any case); anything else is refused naming `source`."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text in INTRA_SITE_CHOICES:
        return text
    raise ValueError(
        f"{source}={value!r}: use 'gloo' (collectives inside a site run on a gloo group of the site's ranks; "
        f"atlas channels cross between sites) or 'atlas' (atlas channels everywhere); unset means 'gloo'")


def _positive_float(value: str, source: str, what: str) -> float:
    try:
        f = float(value)
    except ValueError:
        f = -1.0
    if not f > 0:
        raise ValueError(f"{source}={value!r}: use a positive {what}, or unset it")
    return f


def resolve(pg_options: object, env: dict[str, str] | None = None) -> AtlasOptions:
    """The group's effective options: `pg_options` fields first, then the environment."""
    env = dict(os.environ) if env is None else env
    if pg_options is None:
        pg_options = AtlasOptions()
    if not isinstance(pg_options, AtlasOptions):
        raise TypeError(f"pg_options for backend 'atlas' must be atlas_transport.torch.AtlasOptions or None, "
                        f"got {type(pg_options).__name__}")
    o = pg_options
    if o.streams is not None:
        streams: Streams = parse_streams(o.streams, "AtlasOptions.streams")
    elif env.get(STREAMS_ENV, "").strip():
        streams = parse_streams(env[STREAMS_ENV], STREAMS_ENV)
    else:
        streams = None
    pacing = o.pacing_rate_mbps
    if pacing is None and env.get(PACING_ENV, "").strip():
        pacing = _positive_float(env[PACING_ENV], PACING_ENV, "rate in Mbit/s per stream")
    if pacing is not None and not pacing > 0:
        raise ValueError(f"AtlasOptions.pacing_rate_mbps={pacing!r}: use a positive rate or None")
    congestion = o.congestion or env.get(CONGESTION_ENV, "").strip() or None
    bind = o.bind_addr or env.get(BIND_ENV, "").strip() or None
    idle = o.idle_timeout_s
    if idle is None and env.get(IDLE_ENV, "").strip():
        idle = _positive_float(env[IDLE_ENV], IDLE_ENV, "number of seconds")
    if idle is not None and not idle > 0:
        raise ValueError(f"AtlasOptions.idle_timeout_s={idle!r}: use a positive number of seconds")
    if o.intra_site is not None:
        intra = parse_intra_site(o.intra_site, "AtlasOptions.intra_site")
    elif env.get(INTRA_SITE_ENV, "").strip():
        intra = parse_intra_site(env[INTRA_SITE_ENV], INTRA_SITE_ENV)
    else:
        intra = "gloo"
    return AtlasOptions(streams, pacing, congestion, bind, idle, intra)
