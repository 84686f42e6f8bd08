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


@dataclass(frozen=True)
class TransportConfig:
    """Settings of one endpoint. Both ends need the same `secret`; the rest may differ
    (each side tunes its own sockets and picks its own chunk size when sending).

    streams: number of TCP streams per channel, or "auto" to probe (connector side).
    chunk_bytes: largest chunk of a tensor sent as one frame.
    secret: shared secret for the HMAC handshake; default: environment ATLAS_SECRET.
    congestion: TCP congestion control per stream (cubic, bbr, reno); None = system default.
    sndbuf / rcvbuf: SO_SNDBUF / SO_RCVBUF in bytes; None = kernel autotuning.
    pacing_rate_mbps: per-stream cap via SO_MAX_PACING_RATE; None = unpaced.
    connect_timeout_s: to open all streams and finish the handshake.
    idle_timeout_s: a stream that neither sends nor receives anything (heartbeats
        included) for this long is declared dead; bounds failure detection.
    checksum: per-chunk checksum added by the sender: none, xxh3, xxh64, crc32.
    auto_*: stream-count probe: candidates tried in order, stop when goodput grows by
        less than auto_margin; each candidate sends for at least auto_probe_s.
    """

    streams: int | Literal["auto"] = 8
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    secret: bytes | str | None = None
    congestion: str | None = None
    sndbuf: int | None = None
    rcvbuf: int | None = None
    pacing_rate_mbps: float | None = None
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    checksum: str = "none"
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
        if self.checksum not in CHECKSUMS:
            hint = " (no fast CRC32C implementation is installed; xxh3 is the fastest)" if self.checksum == "crc32c" else ""
            raise ConfigError(f"checksum={self.checksum!r}: choose one of {', '.join(CHECKSUMS)}{hint}")
        for name in ("sndbuf", "rcvbuf"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ConfigError(f"{name}={v!r}: use a positive number of bytes, or None for autotuning")
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

    def chunk_for(self, total_bytes: int, streams: int) -> int:
        """Chunk size for one tensor: chunk_bytes, but cut small tensors so that every
        stream gets about two chunks (a 16 MiB activation still uses 8 streams)."""
        share = -(-total_bytes // max(1, 2 * streams))
        share = -(-share // MIN_CHUNK) * MIN_CHUNK
        return max(MIN_CHUNK, min(self.chunk_bytes, max(MIN_SPLIT_CHUNK, share)))

    @property
    def heartbeat_s(self) -> float:
        return self.idle_timeout_s / 4
