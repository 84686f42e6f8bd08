"""streams="auto": find how many streams a path rewards, once per peer.

The prober opens one channel with the largest candidate count, marked as a probe so
the listener answers it itself, and sends back-to-back tensors restricted to the
first n streams for n = 1, 2, 4, ... (each for `auto_probe_s` of warm-up, then
`auto_probe_s` measured); it keeps raising n while goodput grows by more than
`auto_margin`. The answer is cached in-process per (host, port).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from .channel import Channel
from .config import TransportConfig
from .connector import open_channel
from .errors import TransportError

log = logging.getLogger("atlas_transport")

PROBE_TAG = 0
_cache: dict[tuple[str, int], ProbeResult] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class ProbeResult:
    streams: int
    goodput_mbps: dict[int, float]  # candidate -> measured goodput, in probe order


def choose(goodput: dict[int, float], margin: float) -> int:
    """The stream count to keep: raise n while each step beats the kept one by `margin`."""
    chosen = None
    for n, gp in goodput.items():
        if chosen is None or gp >= goodput[chosen] * (1 + margin):
            chosen = n
        else:
            break
    if chosen is None:
        raise ValueError("no goodput measured")
    return chosen


def probe_streams(host: str, port: int, cfg: TransportConfig) -> ProbeResult:
    """Measure goodput to a listener for each candidate stream count (no caching)."""
    ch = open_channel(host, port, cfg, max(cfg.auto_candidates), probe=True)
    try:
        payload = torch.zeros(cfg.auto_probe_bytes, dtype=torch.uint8)
        goodput: dict[int, float] = {}
        for n in cfg.auto_candidates:
            goodput[n] = _measure(ch, payload, n, cfg.auto_probe_s)
            if choose(goodput, cfg.auto_margin) != n:
                break
        result = ProbeResult(choose(goodput, cfg.auto_margin), goodput)
    finally:
        ch.close()
    log.info("auto streams to %s:%d: %d (goodput Mbit/s by streams: %s)", host, port, result.streams,
             ", ".join(f"{n}: {g:.0f}" for n, g in result.goodput_mbps.items()))
    return result


def _measure(ch: Channel, payload: torch.Tensor, lanes: int, seconds: float) -> float:
    """Goodput of back-to-back transfers (two in flight, so no idle round trip between
    them) over `seconds`, after `seconds` of warm-up: streams that just joined must
    leave slow start first (about 6 RTTs to a 1 MB window), or large N looks worse
    than it is."""
    limit = 4 * ch.cfg.idle_timeout_s  # a probe transfer stuck behind dead streams
    start = time.monotonic()
    warm_end = start + seconds
    stop = warm_end + seconds
    inflight = deque([ch._isend(payload, PROBE_TAG, lanes=lanes) for _ in range(2)])
    mark = None  # completion time of the last transfer of the warm-up
    counted = 0
    while inflight:
        h = inflight.popleft()
        h.wait(limit)
        if mark is not None:
            counted += payload.numel()
        elif h.completed_at >= warm_end:
            mark = h.completed_at
        if time.monotonic() < stop or (mark is not None and not counted):
            inflight.append(ch._isend(payload, PROBE_TAG, lanes=lanes))
    if mark is None or not counted:  # cannot happen with the loop above; never divide by zero
        raise RuntimeError("stream probe measured nothing")
    return counted * 8 / max(1e-9, time.monotonic() - mark) / 1e6


def serve_probe(ch: Channel) -> None:
    """Listener side of a probe channel: receive and drop, into two reused buffers."""
    try:
        first = ch.recv(PROBE_TAG)
        bufs = deque([ch.irecv_into(first, PROBE_TAG), ch.irecv_into(torch.empty_like(first), PROBE_TAG)])
        while True:
            buf = bufs.popleft().wait()
            bufs.append(ch.irecv_into(buf, PROBE_TAG))
    except TransportError:
        pass
    finally:
        ch.close(timeout=1.0)


def streams_for(host: str, port: int, cfg: TransportConfig) -> int:
    """The cached stream count for this peer, probing it the first time."""
    key = (host, port)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None:
        hit = probe_streams(host, port, cfg)
        with _cache_lock:
            _cache[key] = hit
    return hit.streams


def cached_streams(host: str, port: int) -> ProbeResult | None:
    with _cache_lock:
        return _cache.get((host, port))


def forget_streams(host: str | None = None, port: int | None = None) -> None:
    """Drop the cached answer for one peer, or for all peers."""
    with _cache_lock:
        if host is None:
            _cache.clear()
        else:
            _cache.pop((host, port), None)
