"""`TransportConfig`: every knob of a channel, validated once at the edge."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from .errors import ConfigError
from .protocol import CHECKSUMS, MAX_STREAMS, MIN_CHUNK, Limits

SECRET_ENV = "ATLAS_SECRET"

# Chosen by measurement with `testbed bench transport --chunk-size ...` on loopback and
# on the emulated 2dc WAN: larger chunks cost fewer frames and system calls, smaller
# ones shorten the tail, where streams finish their last chunks unevenly; 1 MiB did
# best on loopback and about as well as the others across the WAN.
DEFAULT_CHUNK_BYTES = 1 << 20
# Smallest chunk used when cutting a small tensor across streams.
MIN_SPLIT_CHUNK = 256 << 10
# Chunks grow with the measured per-stream rate so that one takes about this long on
# its stream (see TransportConfig.chunk_target_s), up to DEFAULT_CHUNK_MAX_BYTES.
# Measured with `testbed bench transport --no-wan` and CPU time per GiB on loopback:
# 8-16 MiB frames cost about a fifth less CPU than 1 MiB ones, since each frame costs
# a header read, a system call on each side and Python bookkeeping; on a 100 Mbit/s
# stream 10 ms is 125 KB, so WAN streams keep chunk_bytes.
DEFAULT_CHUNK_TARGET_S = 0.01
DEFAULT_CHUNK_MAX_BYTES = 16 << 20
# Smallest window_clamp accepted: Linux raises a smaller clamp to half its minimum receive
# buffer (SOCK_MIN_RCVBUF / 2, about 2 KB); below a few segments a stream barely moves.
MIN_WINDOW_CLAMP = 16 << 10


@dataclass(frozen=True)
class TransportConfig:
    """Settings of one endpoint. Both ends need the same `secret`; the rest may differ
    (each side tunes its own sockets and picks its own chunk size when sending).

    streams: number of TCP streams per channel, or "auto" to probe (connector side).
    chunk_bytes: chunk size a tensor is cut into (each chunk is one frame), until the
        channel has measured its streams; then the smallest chunk it uses.
    chunk_target_s: grow chunks, on a channel whose transfers showed a fast
        per-stream rate, so that one chunk takes about this long on a stream (up to
        chunk_max_bytes): fewer frames and system calls on fast paths, while any
        chunk still leaves its stream within about chunk_target_s (which bounds how
        long a control frame such as DONE waits behind it, and how unevenly streams
        finish a transfer). None: always chunk_bytes.
    chunk_max_bytes: largest chunk chunk_target_s may grow to (never below
        chunk_bytes, never above max_chunk_bytes; the peer must accept it too: its
        max_chunk_bytes).
    secret: shared secret for the HMAC handshake; default: environment ATLAS_SECRET.
    congestion: TCP congestion control per stream (cubic, bbr, reno); None = system default.
    sndbuf / rcvbuf: SO_SNDBUF / SO_RCVBUF in bytes; None = kernel autotuning.
    pacing_rate_mbps: per-stream cap via SO_MAX_PACING_RATE; None = unpaced.
    window_clamp: TCP_WINDOW_CLAMP in bytes per stream: the most this end advertises as
        its receive window, so the most its peer may have in flight on the stream; sets
        SO_RCVBUF to twice it where rcvbuf is None (Linux's autotuning raises the clamp
        with the buffer it grows); None = what the receive buffer allows.
    connect_timeout_s: to open all streams and finish the handshake.
    idle_timeout_s: a stream that neither sends nor receives anything (heartbeats
        included) for this long is declared dead; bounds failure detection.
    checksum: per-chunk checksum added by the sender: none, xxh3, xxh64, crc32.
    zero_copy: send chunk payloads with vmsplice + splice instead of copying them into
        the kernel (Linux; see `splice`); off or unavailable: one gathered sendmsg.
    restart_cut_slow_start: on a paced channel (pacing_rate_mbps set), after each
        confirmed send of at least 128 KiB, put every stream that carried it and left
        slow start below the window its peer allows without ever losing a segment
        (cubic's HyStart reacting to a delay: another channel's queue, a loaded host)
        back into slow start (`sockets.WindowState`, `sockets.restart_slow_start`); off,
        or unpaced: such a stream stays slow until congestion avoidance has grown its
        window, dozens of bursts on a bursty channel. Unpaced channels are left alone
        because the restart passes through BBR, which turns the kernel's pacing on for
        the stream for good: an unpaced channel would silently become a paced one.
    auto_*: stream-count probe: candidates tried in order, stop when goodput grows by
        less than auto_margin; each candidate sends for at least auto_probe_s.
    """

    streams: int | Literal["auto"] = 8
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    chunk_target_s: float | None = DEFAULT_CHUNK_TARGET_S
    chunk_max_bytes: int = DEFAULT_CHUNK_MAX_BYTES
    secret: bytes | str | None = None
    congestion: str | None = None
    sndbuf: int | None = None
    rcvbuf: int | None = None
    pacing_rate_mbps: float | None = None
    window_clamp: int | None = None
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    checksum: str = "none"
    zero_copy: bool = True
    restart_cut_slow_start: bool = True
    auto_candidates: tuple[int, ...] = (1, 2, 4, 8, 16)
    auto_margin: float = 0.10
    auto_probe_bytes: int = 16 << 20
    auto_probe_s: float = 0.5
    max_chunk_bytes: int = 256 << 20
    max_tensor_bytes: int = 16 << 30
    max_ndim: int = 32
    _limits: Limits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = self.streams
        if s != "auto" and (isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_STREAMS):
            raise ConfigError(f"streams={s!r}: use an integer 1..{MAX_STREAMS} or 'auto'")
        if not isinstance(self.chunk_bytes, int) or not MIN_CHUNK <= self.chunk_bytes <= self.max_chunk_bytes:
            raise ConfigError(
                f"chunk_bytes={self.chunk_bytes!r}: use {MIN_CHUNK}..{self.max_chunk_bytes} bytes "
                f"(default {DEFAULT_CHUNK_BYTES})"
            )
        if self.chunk_target_s is not None and (
                isinstance(self.chunk_target_s, bool) or not isinstance(self.chunk_target_s, (int, float))
                or not 0 < self.chunk_target_s <= 10):
            raise ConfigError(f"chunk_target_s={self.chunk_target_s!r}: use seconds in (0, 10], "
                              f"or None for fixed chunks of chunk_bytes (default {DEFAULT_CHUNK_TARGET_S})")
        if not isinstance(self.chunk_max_bytes, int) or isinstance(self.chunk_max_bytes, bool) \
                or self.chunk_max_bytes < MIN_CHUNK:
            raise ConfigError(
                f"chunk_max_bytes={self.chunk_max_bytes!r}: use at least {MIN_CHUNK} bytes "
                f"(default {DEFAULT_CHUNK_MAX_BYTES}; chunks never exceed max_chunk_bytes either)"
            )
        if self.checksum not in CHECKSUMS:
            hint = " (no fast CRC32C implementation is installed; xxh3 is the fastest)" if self.checksum == "crc32c" else ""
            raise ConfigError(f"checksum={self.checksum!r}: choose one of {', '.join(CHECKSUMS)}{hint}")
        if not isinstance(self.zero_copy, bool):
            raise ConfigError(f"zero_copy={self.zero_copy!r}: use True (vmsplice + splice where the "
                              "kernel offers them) or False (always copy with sendmsg)")
        for name in ("sndbuf", "rcvbuf"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ConfigError(f"{name}={v!r}: use a positive number of bytes, or None for autotuning")
        if self.window_clamp is not None and (isinstance(self.window_clamp, bool) or not isinstance(
                self.window_clamp, int) or self.window_clamp < MIN_WINDOW_CLAMP):
            raise ConfigError(f"window_clamp={self.window_clamp!r}: use at least {MIN_WINDOW_CLAMP} bytes "
                              "(the most a stream's peer may have in flight), or None for what the buffer allows")
        if self.pacing_rate_mbps is not None and not self.pacing_rate_mbps > 0:
            raise ConfigError(f"pacing_rate_mbps={self.pacing_rate_mbps!r}: use a positive rate or None")
        for name in ("connect_timeout_s", "idle_timeout_s", "auto_probe_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"{name}={v!r}: use a positive number of seconds")
        if self.congestion is not None and (not self.congestion or not self.congestion.isascii()):
            raise ConfigError(f"congestion={self.congestion!r}: name an algorithm such as 'cubic' or 'bbr'")
        cands = self.auto_candidates
        if not cands or any(not isinstance(c, int) or not 1 <= c <= MAX_STREAMS for c in cands) \
                or list(cands) != sorted(set(cands)):
            raise ConfigError(f"auto_candidates={cands!r}: use increasing stream counts in 1..{MAX_STREAMS}")
        if not 0 <= self.auto_margin < 10:
            raise ConfigError(f"auto_margin={self.auto_margin!r}: use a fraction such as 0.10")
        if self.auto_probe_bytes < MIN_CHUNK:
            raise ConfigError(f"auto_probe_bytes={self.auto_probe_bytes!r}: use at least {MIN_CHUNK} bytes")
        if self.max_tensor_bytes <= 0 or not 0 < self.max_ndim <= 255:
            raise ConfigError("max_tensor_bytes must be positive and max_ndim in 1..255")
        object.__setattr__(self, "_limits", Limits(self.max_chunk_bytes, self.max_tensor_bytes, self.max_ndim))

    @property
    def limits(self) -> Limits:
        return self._limits

    def resolved_secret(self) -> bytes:
        """The secret as bytes, from the config or ATLAS_SECRET; a clear error without one."""
        secret = self.secret if self.secret is not None else os.environ.get(SECRET_ENV)
        if secret is None or secret in ("", b""):
            raise ConfigError(
                f"no shared secret: pass TransportConfig(secret=...) or set the environment variable "
                f"{SECRET_ENV} (both endpoints must use the same value)"
            )
        return secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)

    def chunk_for(self, total_bytes: int, streams: int, stream_rate_Bps: float | None = None) -> int:
        """Chunk size for one tensor: chunk_bytes, grown to about chunk_target_s at
        the measured per-stream rate (bytes/s; None: not measured yet), but cut small
        tensors so that every stream gets about two chunks (a 16 MiB activation still
        uses 8 streams)."""
        base = self.chunk_bytes
        if self.chunk_target_s is not None and stream_rate_Bps:
            grown = int(stream_rate_Bps * self.chunk_target_s) // MIN_CHUNK * MIN_CHUNK
            base = max(base, min(self.chunk_max_bytes, self.max_chunk_bytes, grown))
        share = -(-total_bytes // max(1, 2 * streams))
        share = -(-share // MIN_CHUNK) * MIN_CHUNK
        return max(MIN_CHUNK, min(base, max(MIN_SPLIT_CHUNK, share)))

    @property
    def heartbeat_s(self) -> float:
        return self.idle_timeout_s / 4
