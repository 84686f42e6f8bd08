"""Property: whatever bytes arrive, the decoders return frames or raise ProtocolError,
never anything else, and never buffer more than the limits allow."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlas_transport import protocol as P
from atlas_transport.errors import ProtocolError

LIM = P.Limits(max_chunk_bytes=1 << 16, max_tensor_bytes=1 << 20, max_ndim=6)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_stream() -> bytes:
    m = P.make_meta(4, 0, "float16", (2, 3000), 4096, LIM)
    out = b""
    for off in range(0, m.total_bytes, m.chunk_bytes):
        n = m.chunk_length(off)
        payload = bytes((off + i) & 0xFF for i in range(n))
        out += P.encode_data_header(11, off, n, m if off == 0 else None, P.CK_XXH64,
                                    P.checksum(P.CK_XXH64, payload)) + payload
    return out + P.encode_control(P.DONE, 11) + P.encode_control(P.QUERY, 2) + P.encode_control(P.PING) \
        + P.encode_control(P.CLOSE, reason="done")


VALID = _valid_stream()


def _decode_all(data: bytes, split: int) -> list[P.Frame]:
    dec = P.Decoder(LIM)
    frames = []
    try:
        frames += dec.feed(data[:split])
        frames += dec.feed(data[split:])
    except ProtocolError:
        pass
    assert len(dec._buf) <= P.HEADER_SIZE + P.META_SIZE + 8 * LIM.max_ndim + LIM.max_chunk_bytes + len(data)
    for f in frames:
        assert isinstance(f, P.Frame)
        assert f.header.type in P.FRAME_NAMES
        assert len(f.payload) == f.header.length <= LIM.max_chunk_bytes
    return frames


def test_valid_stream_decodes_completely() -> None:
    frames = _decode_all(VALID, 1000)
    assert [f.header.type for f in frames][-4:] == [P.DONE, P.QUERY, P.PING, P.CLOSE]
    assert sum(len(f.payload) for f in frames if f.header.type == P.DATA) == 12000


@FUZZ
@given(st.binary(max_size=2048), st.integers(min_value=0, max_value=2048))
def test_arbitrary_bytes(data: bytes, split: int) -> None:
    _decode_all(data, split)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(VALID)), st.integers(0, len(VALID)))
def test_mutated_valid_bytes(flips: list[tuple[int, int]], cut: int, split: int) -> None:
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos] = value
    _decode_all(bytes(data[:cut] if cut else data), split)


@FUZZ
@given(st.binary(min_size=P.HELLO_SIZE, max_size=P.HELLO_SIZE), st.booleans())
def test_handshake_decoders_on_arbitrary_bytes(data: bytes, magic: bool) -> None:
    """Random bytes, half of them behind the right magic so the field checks run too:
    a decoder either refuses with ProtocolError or returns fields within the limits."""
    if magic:
        data = P.MAGIC + data[len(P.MAGIC):]
    try:
        hello = P.decode_hello(data[:P.HELLO_SIZE])
    except ProtocolError:
        pass
    else:
        assert 1 <= hello.stream_count <= P.MAX_STREAMS and hello.stream_index < hello.stream_count
        assert hello.flags & ~P.FLAG_PROBE == 0
    for fn, size in ((P.decode_challenge, P.CHALLENGE_SIZE), (P.decode_result, P.RESULT_SIZE)):
        try:
            reply = fn(data[:size])
        except ProtocolError:
            continue
        assert reply.reason_length <= P.MAX_REASON
        assert P.status_name(reply.status) != f"status {reply.status}"  # a known status


@FUZZ
@given(st.binary(min_size=P.META_SIZE, max_size=P.META_SIZE), st.binary(max_size=64))
def test_meta_decoders_on_arbitrary_bytes(prefix: bytes, dims: bytes) -> None:
    try:
        pre = P.decode_meta_prefix(prefix, LIM)
        m = P.decode_meta_dims(dims[:pre.dims_size].ljust(pre.dims_size, b"\0"), pre)
    except ProtocolError:
        return
    assert m.total_bytes <= LIM.max_tensor_bytes and len(m.shape) <= LIM.max_ndim
