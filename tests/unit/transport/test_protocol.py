"""The sans-IO wire protocol: round trips on bytes and every refusal with its message."""

from __future__ import annotations

import struct

import pytest

from atlas_transport import protocol as P
from atlas_transport.errors import AuthenticationError, ProtocolError

LIM = P.Limits(max_chunk_bytes=1 << 20, max_tensor_bytes=1 << 30, max_ndim=8)


def meta(shape=(4, 8), dtype="float32", chunk=4096, tag=3, seq=0) -> P.TensorMeta:
    return P.make_meta(tag, seq, dtype, shape, chunk, LIM)


def test_hello_round_trip_and_bounds() -> None:
    h = P.Hello(P.VERSION, P.FLAG_PROBE, 2, 8, b"c" * 16, b"n" * 16)
    b = P.encode_hello(h)
    assert len(b) == P.HELLO_SIZE
    assert P.decode_hello(b) == h and P.decode_hello(b).probe
    bad_index = P.encode_hello(P.Hello(P.VERSION, 0, 8, 8, b"c" * 16, b"n" * 16))
    with pytest.raises(ProtocolError, match="stream index 8 is outside 0..7"):
        P.decode_hello(bad_index)
    with pytest.raises(ProtocolError, match="announces 0 streams"):
        P.decode_hello(P.encode_hello(P.Hello(P.VERSION, 0, 0, 0, b"c" * 16, b"n" * 16)))
    with pytest.raises(ProtocolError, match="not an Atlas transport endpoint"):
        P.decode_hello(b"GET / HTTP/1.1\r\n" + bytes(P.HELLO_SIZE - 16))
    with pytest.raises(ProtocolError, match="unknown flags"):
        P.decode_hello(P.encode_hello(P.Hello(P.VERSION, 0x80, 0, 1, b"c" * 16, b"n" * 16)))
    # A different version decodes (so the listener can answer it) but is visible.
    assert P.decode_hello(P.encode_hello(P.Hello(9, 0, 0, 1, b"c" * 16, b"n" * 16))).version == 9


def test_challenge_result_and_macs() -> None:
    hello = P.encode_hello(P.Hello(P.VERSION, 0, 0, 1, b"c" * 16, b"n" * 16))
    ch = P.decode_challenge(P.encode_challenge(P.STATUS_OK, b"s" * 16)[:P.CHALLENGE_SIZE])
    assert ch.status == P.STATUS_OK and ch.nonce == b"s" * 16
    mac = P.client_mac(b"secret", hello, ch.nonce)
    P.verify_mac(P.client_mac(b"secret", hello, ch.nonce), mac, "x")
    with pytest.raises(AuthenticationError, match="connector 1.2.3.4:5 failed the HMAC challenge"):
        P.verify_mac(P.client_mac(b"other", hello, ch.nonce), mac, "connector 1.2.3.4:5")
    # The server's proof depends on the client's, so it cannot be replayed elsewhere.
    assert P.server_mac(b"secret", hello, ch.nonce, mac) != P.server_mac(b"secret", hello, ch.nonce, bytes(32))
    refusal = P.encode_result(P.STATUS_AUTH_FAILED, bytes(32), "wrong shared secret")
    res = P.decode_result(refusal[:P.RESULT_SIZE])
    assert res.status == P.STATUS_AUTH_FAILED
    assert P.decode_reason(refusal[P.RESULT_SIZE:P.RESULT_SIZE + res.reason_length]) == "wrong shared secret"
    with pytest.raises(ProtocolError, match="unknown status 77"):
        P.decode_result(struct.pack("!4sHH32s", P.MAGIC, 77, 0, bytes(32)))


def test_data_frame_round_trip_with_meta_and_checksum() -> None:
    m = meta(shape=(3, 5000), chunk=8192)
    payload = bytes(range(256)) * 32
    ck = P.checksum(P.CK_XXH3, payload)
    wire = P.encode_data_header(7, 8192, len(payload), m, P.CK_XXH3, ck) + payload
    frames = P.Decoder(LIM).feed(wire)
    assert len(frames) == 1
    f = frames[0]
    assert f.header.tid == 7 and f.header.offset == 8192 and f.meta == m and f.payload == payload
    assert m.n_chunks == 8 and m.chunk_length(7 * 8192) == 60000 - 7 * 8192


def test_decoder_handles_byte_by_byte_delivery() -> None:
    m = meta()
    wire = (P.encode_data_header(1, 0, 128, m) + bytes(128) + P.encode_control(P.DONE, 5)
            + P.encode_control(P.PING) + P.encode_control(P.CLOSE, reason="bye"))
    dec = P.Decoder(LIM)
    frames = []
    for i in range(len(wire)):
        frames += dec.feed(wire[i:i + 1])
    assert [f.header.type for f in frames] == [P.DATA, P.DONE, P.PING, P.CLOSE]
    assert frames[1].header.tid == 5 and frames[3].payload == b"bye"


@pytest.mark.parametrize("mutate, message", [
    (lambda h: h[:0] + b"\x09" + h[1:], "unknown frame type 9"),
    (lambda h: h[:3] + b"\x01" + h[4:], "non-zero reserved byte"),
    (lambda h: h[:2] + b"\x09" + h[3:], "unknown checksum algorithm 9"),
    (lambda h: h[:4] + struct.pack("!I", (1 << 20) + 1) + h[8:], "more than the limit of 1048576"),
])
def test_header_refusals(mutate, message) -> None:
    header = P.encode_data_header(1, 0, 128)
    with pytest.raises(ProtocolError, match=message):
        P.decode_header(mutate(header), LIM)


def test_meta_refusals_before_any_allocation() -> None:
    good = P.encode_meta(meta())
    prefix = good[:P.META_SIZE]
    tag, seq, total, chunk, code, ndim = struct.unpack("!QQQIBB", prefix)
    def pack(**kw):
        v = dict(tag=tag, seq=seq, total=total, chunk=chunk, code=code, ndim=ndim) | kw
        return struct.pack("!QQQIBB", v["tag"], v["seq"], v["total"], v["chunk"], v["code"], v["ndim"])
    with pytest.raises(ProtocolError, match="unknown dtype code 200"):
        P.decode_meta_prefix(pack(code=200), LIM)
    with pytest.raises(ProtocolError, match="more than the limit of 1073741824"):
        P.decode_meta_prefix(pack(total=1 << 62), LIM)
    with pytest.raises(ProtocolError, match="40 dimensions, more than the limit of 8"):
        P.decode_meta_prefix(pack(ndim=40), LIM)
    with pytest.raises(ProtocolError, match="not a whole number of float32"):
        P.decode_meta_prefix(pack(total=130), LIM)
    pre = P.decode_meta_prefix(prefix, LIM)
    with pytest.raises(ProtocolError, match="does not match the announced 128 bytes"):
        P.decode_meta_dims(struct.pack("!2Q", 1 << 40, 1 << 40), pre)


def test_chunk_bounds_checked_against_meta() -> None:
    m = meta(shape=(3000,), chunk=4096)  # 12000 bytes: chunks 4096, 4096, 3808
    assert P.check_chunk(m, 8192, 3808) == 2
    with pytest.raises(ProtocolError, match="does not fit"):
        P.check_chunk(m, 8192, 4096)
    with pytest.raises(ProtocolError, match="does not fit"):
        P.check_chunk(m, 100, 4096)
    dec = P.Decoder(LIM)
    with pytest.raises(ProtocolError, match="before its description"):
        dec.feed(P.encode_data_header(9, 0, 16) + bytes(16))
    with pytest.raises(ProtocolError):  # a decoder that failed stays failed
        dec.feed(P.encode_control(P.PING))


def test_checksum_mismatch_is_a_protocol_error() -> None:
    m = meta(shape=(32,))
    wire = P.encode_data_header(1, 0, 128, m, P.CK_CRC32, 12345) + bytes(128)
    with pytest.raises(ProtocolError, match="checksum mismatch in transfer 1 at offset 0"):
        P.Decoder(LIM).feed(wire)


def test_make_meta_refuses_what_receivers_would() -> None:
    with pytest.raises(ProtocolError, match="cannot be sent"):
        P.make_meta(0, 0, "qint8", (4,), 4096, LIM)
    with pytest.raises(ProtocolError, match="tag -1"):
        P.make_meta(-1, 0, "float32", (4,), 4096, LIM)
    assert P.make_meta(0, 0, "bool", (), 4096, LIM).total_bytes == 1
    assert P.make_meta(0, 0, "bfloat16", (0, 7), 4096, LIM).n_chunks == 1


def test_control_frames_refuse_payloads() -> None:
    done = bytearray(P.encode_control(P.DONE, 3))
    done[4:8] = struct.pack("!I", 5)
    with pytest.raises(ProtocolError, match="DONE frame announces a 5-byte payload"):
        P.decode_header(bytes(done), LIM)
    close = bytearray(P.encode_control(P.CLOSE))
    close[4:8] = struct.pack("!I", 100000)
    with pytest.raises(ProtocolError, match="CLOSE reason of 100000 bytes"):
        P.decode_header(bytes(close), LIM)
