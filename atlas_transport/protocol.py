"""The Atlas wire protocol, version 1: encoders and decoders on bytes, no I/O.

Everything that crosses a socket is defined here so it can be tested on bytes alone
(and fuzzed). The I/O layer reads exactly the number of bytes a decoder asks for and
writes chunk payloads straight into tensor memory; this module never sees payloads
except in the convenience `Decoder` used by tests and tools.

Handshake, per TCP stream (all integers big-endian):

    client -> server  HELLO      magic "ATLS", version u16, flags u16, stream index u16,
                                 stream count u16, channel id 16 B, client nonce 16 B
    server -> client  CHALLENGE  magic, version u16, status u16, reason length u16,
                                 server nonce 16 B, reason (status != OK only)
    client -> server  AUTH       HMAC-SHA256(secret, "atlas-client" | HELLO | server nonce)
    server -> client  RESULT     magic, status u16, reason length u16,
                                 HMAC-SHA256(secret, "atlas-server" | HELLO | nonce | AUTH),
                                 reason

Both sides prove knowledge of the secret without sending it; the nonces make replays
useless. After the handshake every message is a frame with a fixed 32-byte header:

    type u8, flags u8, checksum algorithm u8, reserved u8, length u32,
    transfer id u64, offset u64, checksum u64

A DATA frame is followed, when flag HAS_META is set, by the tensor description
(tag u64, per-tag sequence u64, total bytes u64, chunk size u32, dtype u8, ndim u8,
ndim x u64 dims), then by `length` payload bytes. The sender sets HAS_META on the
first frame of a transfer it sends on each stream, so whichever stream delivers a
chunk first, the receiver can size the destination. Chunks sit at multiples of the
announced chunk size; a chunk re-sent after a stream loss repeats offset and length,
so the receiver can drop duplicates with a bitmap.

Control frames: DONE (receiver has the whole transfer), QUERY (sender asks whether a
transfer completed, after losing the stream that may have carried DONE), PING
(heartbeat), CLOSE (graceful end of a stream; payload is a UTF-8 reason).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from .errors import AuthenticationError, ProtocolError

__all__ = [
    "MAGIC", "VERSION", "ProtocolError", "Limits", "TensorMeta", "Hello", "Challenge",
    "Result", "FrameHeader", "Frame", "Decoder", "DTYPES", "CHECKSUMS",
]

MAGIC = b"ATLS"
VERSION = 1

# --- handshake -------------------------------------------------------------------

FLAG_PROBE = 0x0001  # channel opened by the stream-count prober, not for accept()
_HELLO_FLAGS = FLAG_PROBE

STATUS_OK = 0
STATUS_BAD_VERSION = 1
STATUS_AUTH_FAILED = 2
STATUS_BAD_REQUEST = 3
_STATUS_NAMES = {
    STATUS_OK: "ok", STATUS_BAD_VERSION: "unsupported protocol version",
    STATUS_AUTH_FAILED: "authentication failed", STATUS_BAD_REQUEST: "bad request",
}

MAX_STREAMS = 256
MAX_REASON = 512
NONCE_BYTES = 16
CHANNEL_ID_BYTES = 16
MAC_BYTES = 32

_HELLO = struct.Struct("!4sHHHH16s16s")
_CHALLENGE = struct.Struct("!4sHHH16s")
_RESULT = struct.Struct("!4sHH32s")

HELLO_SIZE = _HELLO.size
CHALLENGE_SIZE = _CHALLENGE.size
AUTH_SIZE = MAC_BYTES
RESULT_SIZE = _RESULT.size


@dataclass(frozen=True)
class Hello:
    version: int
    flags: int
    stream_index: int
    stream_count: int
    channel_id: bytes
    nonce: bytes

    @property
    def probe(self) -> bool:
        return bool(self.flags & FLAG_PROBE)


@dataclass(frozen=True)
class Challenge:
    version: int
    status: int
    nonce: bytes
    reason_length: int


@dataclass(frozen=True)
class Result:
    status: int
    mac: bytes
    reason_length: int


def encode_hello(h: Hello) -> bytes:
    return _HELLO.pack(MAGIC, h.version, h.flags, h.stream_index, h.stream_count, h.channel_id, h.nonce)


def decode_hello(data: bytes) -> Hello:
    """Parse a HELLO. Version is returned, not checked: the server answers a wrong
    version with a readable refusal instead of hanging up."""
    _need(data, _HELLO.size, "HELLO")
    magic, version, flags, index, count, cid, nonce = _HELLO.unpack(data)
    _check_magic(magic, "HELLO")
    if flags & ~_HELLO_FLAGS:
        raise ProtocolError(f"HELLO carries unknown flags 0x{flags:04x}")
    if not 1 <= count <= MAX_STREAMS:
        raise ProtocolError(f"HELLO announces {count} streams (allowed 1..{MAX_STREAMS})")
    if index >= count:
        raise ProtocolError(f"HELLO stream index {index} is outside 0..{count - 1}")
    return Hello(version, flags, index, count, cid, nonce)


def encode_challenge(status: int, nonce: bytes, reason: str = "") -> bytes:
    r = _reason_bytes(reason)
    return _CHALLENGE.pack(MAGIC, VERSION, status, len(r), nonce) + r


def decode_challenge(data: bytes) -> Challenge:
    _need(data, _CHALLENGE.size, "CHALLENGE")
    magic, version, status, rlen, nonce = _CHALLENGE.unpack(data)
    _check_magic(magic, "CHALLENGE")
    _check_status(status, "CHALLENGE")
    if rlen > MAX_REASON:
        raise ProtocolError(f"CHALLENGE reason of {rlen} bytes exceeds {MAX_REASON}")
    return Challenge(version, status, nonce, rlen)


def encode_result(status: int, mac: bytes, reason: str = "") -> bytes:
    r = _reason_bytes(reason)
    return _RESULT.pack(MAGIC, status, len(r), mac.ljust(MAC_BYTES, b"\0")) + r


def decode_result(data: bytes) -> Result:
    _need(data, _RESULT.size, "RESULT")
    magic, status, rlen, mac = _RESULT.unpack(data)
    _check_magic(magic, "RESULT")
    _check_status(status, "RESULT")
    if rlen > MAX_REASON:
        raise ProtocolError(f"RESULT reason of {rlen} bytes exceeds {MAX_REASON}")
    return Result(status, mac, rlen)


def decode_reason(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def status_name(status: int) -> str:
    return _STATUS_NAMES.get(status, f"status {status}")


def client_mac(secret: bytes, hello: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, b"atlas-client\0" + hello + server_nonce, hashlib.sha256).digest()


def server_mac(secret: bytes, hello: bytes, server_nonce: bytes, auth: bytes) -> bytes:
    return hmac.new(secret, b"atlas-server\0" + hello + server_nonce + auth, hashlib.sha256).digest()


def verify_mac(expected: bytes, got: bytes, who: str) -> None:
    if not hmac.compare_digest(expected, got):
        raise AuthenticationError(f"{who} failed the HMAC challenge: the shared secrets differ")


def _reason_bytes(reason: str) -> bytes:
    return reason.encode("utf-8")[:MAX_REASON]


def _need(data: bytes, n: int, what: str) -> None:
    if len(data) != n:
        raise ProtocolError(f"{what} must be {n} bytes, got {len(data)}")


def _check_magic(magic: bytes, what: str) -> None:
    if magic != MAGIC:
        raise ProtocolError(
            f"{what} starts with {magic!r}, not {MAGIC!r}: the peer is not an Atlas transport endpoint"
        )


def _check_status(status: int, what: str) -> None:
    if status not in _STATUS_NAMES:
        raise ProtocolError(f"{what} carries unknown status {status}")


# --- dtypes and checksums ----------------------------------------------------------

# wire code -> (torch dtype name, item size). Codes are part of the protocol: append only.
DTYPES: dict[int, tuple[str, int]] = {
    1: ("float32", 4), 2: ("float64", 8), 3: ("float16", 2), 4: ("bfloat16", 2),
    5: ("int8", 1), 6: ("int16", 2), 7: ("int32", 4), 8: ("int64", 8),
    9: ("uint8", 1), 10: ("bool", 1), 11: ("complex64", 8), 12: ("complex128", 16),
    13: ("uint16", 2), 14: ("uint32", 4), 15: ("uint64", 8),
    16: ("float8_e4m3fn", 1), 17: ("float8_e5m2", 1), 18: ("complex32", 4),
}
DTYPE_CODES: dict[str, int] = {name: code for code, (name, _) in DTYPES.items()}

CK_NONE, CK_XXH3, CK_XXH64, CK_CRC32 = 0, 1, 2, 3
# name -> (wire code, function over a buffer returning an int < 2**64)
CHECKSUMS: dict[str, tuple[int, Callable[[memoryview], int] | None]] = {
    "none": (CK_NONE, None),
    "xxh3": (CK_XXH3, xxhash.xxh3_64_intdigest),
    "xxh64": (CK_XXH64, xxhash.xxh64_intdigest),
    "crc32": (CK_CRC32, zlib.crc32),
}
_CHECKSUM_BY_CODE = {code: fn for code, fn in CHECKSUMS.values()}


def checksum(code: int, data: memoryview | bytes) -> int:
    fn = _CHECKSUM_BY_CODE[code]
    return 0 if fn is None else fn(data)


# --- frames ------------------------------------------------------------------------

DATA, DONE, QUERY, PING, CLOSE = 1, 2, 3, 4, 5
FRAME_NAMES = {DATA: "DATA", DONE: "DONE", QUERY: "QUERY", PING: "PING", CLOSE: "CLOSE"}
HAS_META = 0x01

_HEADER = struct.Struct("!BBBBIQQQ")
_META = struct.Struct("!QQQIBB")
HEADER_SIZE = _HEADER.size  # 32
META_SIZE = _META.size  # 30
MIN_CHUNK = 4096
MAX_U63 = (1 << 63) - 1


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts; anything larger is a ProtocolError before allocation."""

    max_chunk_bytes: int = 256 << 20
    max_tensor_bytes: int = 16 << 30
    max_ndim: int = 32


@dataclass(frozen=True)
class TensorMeta:
    tag: int
    tag_seq: int
    dtype: str
    shape: tuple[int, ...]
    total_bytes: int
    chunk_bytes: int

    @property
    def n_chunks(self) -> int:
        return max(1, -(-self.total_bytes // self.chunk_bytes))

    def chunk_length(self, offset: int) -> int:
        return min(self.chunk_bytes, self.total_bytes - offset)

    def describe(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class FrameHeader:
    type: int
    flags: int
    checksum_algo: int
    length: int
    tid: int
    offset: int
    checksum: int

    @property
    def has_meta(self) -> bool:
        return bool(self.flags & HAS_META)


def make_meta(tag: int, tag_seq: int, dtype: str, shape: tuple[int, ...], chunk_bytes: int,
              limits: Limits | None = None) -> TensorMeta:
    """Build and validate the description of an outgoing tensor."""
    limits = limits or Limits()
    if dtype not in DTYPE_CODES:
        raise ProtocolError(f"dtype {dtype} cannot be sent (supported: {', '.join(DTYPE_CODES)})")
    total = math.prod(shape) * DTYPES[DTYPE_CODES[dtype]][1]
    meta = TensorMeta(tag, tag_seq, dtype, tuple(shape), total, chunk_bytes)
    _check_meta(meta, limits)
    return meta


def _check_meta(m: TensorMeta, limits: Limits) -> None:
    if not 0 <= m.tag <= MAX_U63:
        raise ProtocolError(f"tag {m.tag} is outside 0..2**63-1")
    if not 0 <= m.tag_seq <= MAX_U63:
        raise ProtocolError(f"tag sequence {m.tag_seq} is outside 0..2**63-1")
    if len(m.shape) > limits.max_ndim:
        raise ProtocolError(f"tensor has {len(m.shape)} dimensions, more than the limit of {limits.max_ndim}")
    if m.total_bytes > limits.max_tensor_bytes:
        raise ProtocolError(
            f"tensor of {m.total_bytes} bytes exceeds the limit of {limits.max_tensor_bytes} bytes (max_tensor_bytes)"
        )
    if not MIN_CHUNK <= m.chunk_bytes <= limits.max_chunk_bytes:
        raise ProtocolError(
            f"chunk size {m.chunk_bytes} is outside {MIN_CHUNK}..{limits.max_chunk_bytes} bytes (max_chunk_bytes)"
        )


def encode_data_header(tid: int, offset: int, length: int, meta: TensorMeta | None = None,
                       checksum_algo: int = CK_NONE, checksum_value: int = 0) -> bytes:
    flags = HAS_META if meta is not None else 0
    head = _HEADER.pack(DATA, flags, checksum_algo, 0, length, tid, offset, checksum_value)
    if meta is None:
        return head
    return head + encode_meta(meta)


def encode_meta(m: TensorMeta) -> bytes:
    fixed = _META.pack(m.tag, m.tag_seq, m.total_bytes, m.chunk_bytes, DTYPE_CODES[m.dtype], len(m.shape))
    return fixed + struct.pack(f"!{len(m.shape)}Q", *m.shape)


def encode_control(kind: int, tid: int = 0, reason: str = "") -> bytes:
    """DONE/QUERY (with a transfer id), PING, or CLOSE (with a reason)."""
    payload = _reason_bytes(reason) if kind == CLOSE else b""
    return _HEADER.pack(kind, 0, CK_NONE, 0, len(payload), tid, 0, 0) + payload


def decode_header(data: bytes | bytearray | memoryview, limits: Limits) -> FrameHeader:
    """Validate a 32-byte frame header; everything the I/O layer will act on is bounded."""
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"frame header must be {HEADER_SIZE} bytes, got {len(data)}")
    kind, flags, algo, reserved, length, tid, offset, ck = _HEADER.unpack(data)
    name = FRAME_NAMES.get(kind)
    if name is None:
        raise ProtocolError(f"unknown frame type {kind}")
    if reserved:
        raise ProtocolError(f"{name} frame has non-zero reserved byte {reserved}")
    if kind == DATA:
        if flags & ~HAS_META:
            raise ProtocolError(f"DATA frame carries unknown flags 0x{flags:02x}")
        if algo not in _CHECKSUM_BY_CODE:
            raise ProtocolError(f"DATA frame uses unknown checksum algorithm {algo}")
        if length > limits.max_chunk_bytes:
            raise ProtocolError(
                f"DATA frame announces a chunk of {length} bytes, more than the limit of "
                f"{limits.max_chunk_bytes} (max_chunk_bytes)"
            )
        if tid > MAX_U63 or offset > MAX_U63:
            raise ProtocolError(f"DATA frame has out-of-range transfer id {tid} or offset {offset}")
    else:
        if flags or algo or ck or offset:
            raise ProtocolError(f"{name} frame has unexpected flags, checksum or offset")
        if kind == CLOSE:
            if length > MAX_REASON:
                raise ProtocolError(f"CLOSE reason of {length} bytes exceeds {MAX_REASON}")
        elif length:
            raise ProtocolError(f"{name} frame announces a {length}-byte payload; it has none")
        if kind == PING and tid:
            raise ProtocolError("PING frame carries a transfer id")
    return FrameHeader(kind, flags, algo, length, tid, offset, ck)


@dataclass(frozen=True)
class MetaPrefix:
    tag: int
    tag_seq: int
    total_bytes: int
    chunk_bytes: int
    dtype: str
    ndim: int

    @property
    def dims_size(self) -> int:
        return 8 * self.ndim


def decode_meta_prefix(data: bytes | bytearray | memoryview, limits: Limits) -> MetaPrefix:
    if len(data) != META_SIZE:
        raise ProtocolError(f"tensor description must be {META_SIZE} bytes, got {len(data)}")
    tag, seq, total, chunk, code, ndim = _META.unpack(data)
    entry = DTYPES.get(code)
    if entry is None:
        raise ProtocolError(f"unknown dtype code {code}")
    if ndim > limits.max_ndim:
        raise ProtocolError(f"tensor announces {ndim} dimensions, more than the limit of {limits.max_ndim}")
    if total > limits.max_tensor_bytes:
        raise ProtocolError(
            f"tensor announces {total} bytes, more than the limit of {limits.max_tensor_bytes} (max_tensor_bytes)"
        )
    if total % entry[1]:
        raise ProtocolError(f"{total} bytes is not a whole number of {entry[0]} elements")
    if tag > MAX_U63 or seq > MAX_U63:
        raise ProtocolError(f"tag {tag} or tag sequence {seq} out of range")
    if not MIN_CHUNK <= chunk <= limits.max_chunk_bytes:
        raise ProtocolError(f"chunk size {chunk} is outside {MIN_CHUNK}..{limits.max_chunk_bytes} bytes")
    return MetaPrefix(tag, seq, total, chunk, entry[0], ndim)


def decode_meta_dims(data: bytes | bytearray | memoryview, prefix: MetaPrefix) -> TensorMeta:
    if len(data) != prefix.dims_size:
        raise ProtocolError(f"tensor dims must be {prefix.dims_size} bytes, got {len(data)}")
    shape = struct.unpack(f"!{prefix.ndim}Q", data)
    itemsize = DTYPES[DTYPE_CODES[prefix.dtype]][1]
    # At most max_ndim 64-bit factors: an exact Python int, no overflow to exploit.
    if math.prod(shape) * itemsize != prefix.total_bytes:
        raise ProtocolError(
            f"shape {list(shape)} of {prefix.dtype} does not match the announced {prefix.total_bytes} bytes"
        )
    return TensorMeta(prefix.tag, prefix.tag_seq, prefix.dtype, shape, prefix.total_bytes, prefix.chunk_bytes)


def check_chunk(meta: TensorMeta, offset: int, length: int) -> int:
    """Validate a chunk against its transfer; returns the chunk index."""
    if meta.total_bytes == 0:
        if offset or length:
            raise ProtocolError(f"chunk at {offset}+{length} of an empty tensor")
        return 0
    if offset % meta.chunk_bytes or offset >= meta.total_bytes or length != meta.chunk_length(offset):
        raise ProtocolError(
            f"chunk at offset {offset} with {length} bytes does not fit a {meta.total_bytes}-byte tensor "
            f"cut in {meta.chunk_bytes}-byte chunks"
        )
    return offset // meta.chunk_bytes


# --- streaming decoder (tests, tools) ------------------------------------------------

@dataclass(frozen=True)
class Frame:
    header: FrameHeader
    meta: TensorMeta | None
    payload: bytes


class Decoder:
    """Incremental frame decoder over a byte stream: `feed()` returns complete frames.

    The channel does not use this class (it reads payloads straight into tensors) but
    the same header/meta functions, so fuzzing this class exercises its parsing. It
    remembers the metadata of each transfer to check chunk bounds, as the channel does.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._buf = bytearray()
        self._metas: dict[int, TensorMeta] = {}
        self._failed: ProtocolError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        if self._failed is not None:
            raise self._failed
        self._buf += data
        frames: list[Frame] = []
        try:
            while True:
                frame = self._next()
                if frame is None:
                    return frames
                frames.append(frame)
        except ProtocolError as exc:
            self._failed = exc
            self._buf.clear()
            raise

    def _next(self) -> Frame | None:
        buf = self._buf
        if len(buf) < HEADER_SIZE:
            return None
        hdr = decode_header(bytes(buf[:HEADER_SIZE]), self.limits)
        pos = HEADER_SIZE
        meta = None
        if hdr.has_meta:
            if len(buf) < pos + META_SIZE:
                return None
            prefix = decode_meta_prefix(bytes(buf[pos:pos + META_SIZE]), self.limits)
            pos += META_SIZE
            if len(buf) < pos + prefix.dims_size:
                return None
            meta = decode_meta_dims(bytes(buf[pos:pos + prefix.dims_size]), prefix)
            pos += prefix.dims_size
        if hdr.type == DATA:
            known = self._metas.get(hdr.tid)
            if meta is not None:
                if known is not None and known != meta:
                    raise ProtocolError(f"transfer {hdr.tid} re-announced with a different description")
                known = meta
            if known is None:
                raise ProtocolError(f"DATA for transfer {hdr.tid} before its description")
            check_chunk(known, hdr.offset, hdr.length)
        if len(buf) < pos + hdr.length:
            return None
        payload = bytes(buf[pos:pos + hdr.length])
        if hdr.type == DATA and hdr.checksum_algo != CK_NONE:
            if checksum(hdr.checksum_algo, payload) != hdr.checksum:
                raise ProtocolError(f"checksum mismatch in transfer {hdr.tid} at offset {hdr.offset}")
        if meta is not None:
            self._metas[hdr.tid] = meta
        del buf[:pos + hdr.length]
        return Frame(hdr, meta, payload)
