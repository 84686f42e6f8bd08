"""GSO frame surgery of the delay line: per-segment loss rebuilds valid packets."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.emulation.delayline import frames as fr


def naive_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    s = 0
    for i in range(0, len(data), 2):
        s += (data[i] << 8) | data[i + 1]
        s = (s & 0xFFFF) + (s >> 16)
    return s


def make_tcp_gso(
    ipv: int = 4,
    payload: bytes = bytes(range(256)) * 40,
    mss: int = 1448,
    seq: int = 0xFFFFF000,
    flags: int = 0x18,
    ip_id: int = 0xFFFE,
    ecn: bool = False,
    gso_type: int | None = None,
) -> bytes:
    """A TCP super-packet as the kernel hands it to a PACKET_VNET_HDR socket."""
    eth = b"\x02" * 6 + b"\x04" * 6 + struct.pack("!H", fr.ETH_P_IP if ipv == 4 else fr.ETH_P_IPV6)
    tcp_opts = b"\x01\x01\x08\x0a" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x02"
    tcp_hlen = 20 + len(tcp_opts)
    tcp_len = tcp_hlen + len(payload)
    tcp = struct.pack("!HHIIBBHHH", 5001, 40000, seq, 77, (tcp_hlen // 4) << 4, flags, 512, 0, 0) + tcp_opts
    if ipv == 4:
        src, dst = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
        ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + tcp_len, ip_id, 0x4000, 64, 6, 0, src, dst))
        ip[10:12] = struct.pack("!H", ~naive_sum(bytes(ip)) & 0xFFFF)
        pseudo = src + dst + struct.pack("!BBH", 0, 6, tcp_len)
    else:
        src, dst = bytes(range(16)), bytes(range(16, 32))
        ip = bytearray(struct.pack("!IHBB16s16s", 0x60000000, tcp_len, 6, 64, src, dst))
        pseudo = src + dst + struct.pack("!IxxxB", tcp_len, 6)
    tcp = bytearray(tcp)
    tcp[16:18] = struct.pack("!H", naive_sum(pseudo))  # CHECKSUM_PARTIAL seed
    l4 = fr.ETH_LEN + len(ip)
    gt = gso_type if gso_type is not None else (fr.GSO_TCPV4 if ipv == 4 else fr.GSO_TCPV6)
    vnet = fr.VNET.pack(fr.F_NEEDS_CSUM, gt | (fr.GSO_ECN if ecn else 0), l4 + tcp_hlen, mss, l4, 16)
    return vnet + eth + bytes(ip) + bytes(tcp) + payload


def complete_and_verify(frame: bytes) -> None:
    """Finish CHECKSUM_PARTIAL like a NIC would, then check TCP and IPv4 checksums
    with an independent (word-by-word) implementation."""
    flags, _gt, _hl, _gs, cstart, coff = fr.VNET.unpack_from(frame, 0)
    assert flags & fr.F_NEEDS_CSUM
    pkt = bytearray(frame[fr.VNET_LEN :])
    seed_sum = naive_sum(bytes(pkt[cstart:]))
    pkt[cstart + coff : cstart + coff + 2] = struct.pack("!H", ~seed_sum & 0xFFFF)
    ethertype = struct.unpack_from("!H", pkt, 12)[0]
    if ethertype == fr.ETH_P_IP:
        ihl = (pkt[14] & 0xF) * 4
        assert naive_sum(bytes(pkt[14 : 14 + ihl])) == 0xFFFF, "bad IPv4 header checksum"
        total = struct.unpack_from("!H", pkt, 16)[0]
        assert total == len(pkt) - 14
        src_dst = bytes(pkt[26:34])
        tcp_len = total - ihl
        pseudo = src_dst + struct.pack("!BBH", 0, 6, tcp_len)
    else:
        plen = struct.unpack_from("!H", pkt, 18)[0]
        assert plen == len(pkt) - 54
        pseudo = bytes(pkt[22:54]) + struct.pack("!IxxxB", plen, 6)
    assert naive_sum(pseudo + bytes(pkt[cstart:])) == 0xFFFF, "bad TCP checksum"


def split(frame: bytes, lost_idx: set[int]) -> list[bytes]:
    lay = fr.gso_layout(frame)
    assert lay is not None
    return fr.keep_segments(frame, lay, [i in lost_idx for i in range(lay.segments)])


def tcp_fields(frame: bytes) -> dict[str, int]:
    l3 = fr.VNET_LEN + fr.ETH_LEN
    ipv = 4 if struct.unpack_from("!H", frame, l3 - 2)[0] == fr.ETH_P_IP else 6
    l4 = l3 + ((frame[l3] & 0xF) * 4 if ipv == 4 else 40)
    hdr_end = l4 + (frame[l4 + 12] >> 4) * 4
    vflags, gt, hdr_len, gso_size, cstart, coff = fr.VNET.unpack_from(frame, 0)
    return {
        "seq": struct.unpack_from("!I", frame, l4 + 4)[0],
        "flags": frame[l4 + 13],
        "ip_id": struct.unpack_from("!H", frame, l3 + 4)[0] if ipv == 4 else -1,
        "payload_len": len(frame) - hdr_end,
        "gso_type": gt,
        "gso_size": gso_size,
        "hdr_len": hdr_len,
        "csum_start": cstart,
        "hdr_end": hdr_end,
    }


@pytest.mark.parametrize("ipv", [4, 6])
def test_layout_counts_segments(ipv: int) -> None:
    frame = make_tcp_gso(ipv=ipv, payload=b"x" * 10_000, mss=1448)
    lay = fr.gso_layout(frame)
    assert lay is not None and lay.splittable
    assert lay.segments == 7  # ceil(10000 / 1448)
    assert fr.segment_count(frame) == 7
    complete_and_verify(frame)  # the helper builds valid frames


def test_plain_frame_is_one_segment() -> None:
    frame = fr.VNET.pack(0, fr.GSO_NONE, 0, 0, 0, 0) + b"\xff" * 14 + b"\x00" * 100
    assert fr.gso_layout(frame) is None
    assert fr.segment_count(frame) == 1
    assert fr.segment_count(b"short") == 1


def test_nothing_lost_keeps_the_frame_itself() -> None:
    frame = make_tcp_gso()
    assert split(frame, set())[0] is frame


@pytest.mark.parametrize("ipv", [4, 6])
def test_lost_segments_are_cut_out_and_the_rest_stays_valid(ipv: int) -> None:
    payload = bytes((i * 7) & 0xFF for i in range(10_000))
    frame = make_tcp_gso(ipv=ipv, payload=payload, flags=0x80 | 0x18 | 0x01, ecn=True)  # CWR PSH ACK FIN
    out = split(frame, {2, 3})
    assert len(out) == 2
    first, second = (tcp_fields(f) for f in out)
    mss = 1448
    # payloads: segments 0-1 and 4-6, byte for byte
    got = [f[tcp_fields(f)["hdr_end"] :] for f in out]
    assert got[0] == payload[: 2 * mss]
    assert got[1] == payload[4 * mss :]
    assert first["seq"] == 0xFFFFF000
    assert second["seq"] == (0xFFFFF000 + 4 * mss) & 0xFFFFFFFF  # wraps around 2**32
    if ipv == 4:
        assert first["ip_id"] == 0xFFFE and second["ip_id"] == (0xFFFE + 4) & 0xFFFF
    # CWR only where segment 0 is; FIN/PSH only where the last segment is
    assert first["flags"] & 0x80 and not first["flags"] & 0x09
    assert not second["flags"] & 0x80 and second["flags"] & 0x09 == 0x09
    assert first["gso_type"] & fr.GSO_ECN and not second["gso_type"] & fr.GSO_ECN
    for f in (first, second):
        assert f["gso_size"] == mss and f["gso_type"] & 0x7F == (fr.GSO_TCPV4 if ipv == 4 else fr.GSO_TCPV6)
        assert f["hdr_len"] == f["hdr_end"] - fr.VNET_LEN
    for f in out:
        complete_and_verify(f)


def test_single_surviving_segment_becomes_a_plain_packet() -> None:
    frame = make_tcp_gso(payload=b"y" * 4000, mss=1448)  # 3 segments
    out = split(frame, {0, 2})
    assert len(out) == 1
    f = tcp_fields(out[0])
    assert f["gso_type"] == fr.GSO_NONE and f["gso_size"] == 0
    assert f["payload_len"] == 1448
    complete_and_verify(out[0])


def test_all_lost_or_unsplittable_drops_whole() -> None:
    frame = make_tcp_gso(payload=b"z" * 3000)
    assert split(frame, {0, 1, 2}) == []
    udp_like = make_tcp_gso(payload=b"z" * 3000, gso_type=fr.GSO_UDP_L4)
    lay = fr.gso_layout(udp_like)
    assert lay is not None and not lay.splittable
    assert split(udp_like, {1}) == []
    assert split(udp_like, set()) == [udp_like]


@given(st.binary(min_size=0, max_size=300))
def test_ones_sum_matches_word_by_word(data: bytes) -> None:
    expect = naive_sum(data)
    got = fr.ones_sum(data)
    # +0 and -0 are the same value in ones' complement
    assert got == expect or {got, expect} == {0, 0xFFFF}


@given(st.integers(min_value=1, max_value=12), st.data())
def test_any_loss_pattern_preserves_surviving_bytes(nseg: int, data: st.DataObject) -> None:
    mss = 100
    payload = bytes((i * 13) & 0xFF for i in range(mss * nseg - data.draw(st.integers(0, mss - 1))))
    frame = make_tcp_gso(payload=payload, mss=mss)
    lost = data.draw(st.sets(st.integers(0, nseg - 1)))
    out = split(frame, lost)
    kept = b"".join(payload[i * mss : (i + 1) * mss] for i in range(nseg) if i not in lost)
    got = b"".join(f[tcp_fields(f)["hdr_end"] :] for f in out)
    assert got == kept
    for f in out:
        complete_and_verify(f)


def make_udp_gso(ipv: int = 4, payload: bytes = bytes(range(256)) * 20, gso_size: int = 1400,
                 ip_id: int = 0x1234) -> bytes:
    """A UDP_SEGMENT super-packet as the kernel hands it to a PACKET_VNET_HDR socket."""
    eth = b"\x02" * 6 + b"\x04" * 6 + struct.pack("!H", fr.ETH_P_IP if ipv == 4 else fr.ETH_P_IPV6)
    udp_len = 8 + len(payload)
    if ipv == 4:
        src, dst = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
        ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, ip_id, 0x4000, 64, 17, 0, src, dst))
        ip[10:12] = struct.pack("!H", ~naive_sum(bytes(ip)) & 0xFFFF)
        pseudo = src + dst + struct.pack("!BBH", 0, 17, udp_len)
    else:
        src, dst = bytes(range(16)), bytes(range(16, 32))
        ip = bytearray(struct.pack("!IHBB16s16s", 0x60000000, udp_len, 17, 64, src, dst))
        pseudo = src + dst + struct.pack("!IxxxB", udp_len, 17)
    udp = struct.pack("!HHHH", 47001, 47001, udp_len, naive_sum(pseudo))
    l4 = fr.ETH_LEN + len(ip)
    vnet = fr.VNET.pack(fr.F_NEEDS_CSUM, fr.GSO_UDP_L4, l4 + 8, gso_size, l4, 6)
    return vnet + eth + bytes(ip) + udp + payload


def complete_and_verify_udp(frame: bytes) -> bytes:
    """Finish the partial UDP checksum and check it, the UDP length and the IP header;
    returns the UDP payload."""
    flags, _gt, _hl, _gs, cstart, coff = fr.VNET.unpack_from(frame, 0)
    assert flags & fr.F_NEEDS_CSUM and coff == 6
    pkt = bytearray(frame[fr.VNET_LEN :])
    pkt[cstart + coff : cstart + coff + 2] = struct.pack("!H", ~naive_sum(bytes(pkt[cstart:])) & 0xFFFF)
    udp_len = struct.unpack_from("!H", pkt, cstart + 4)[0]
    assert udp_len == len(pkt) - cstart
    if struct.unpack_from("!H", pkt, 12)[0] == fr.ETH_P_IP:
        assert naive_sum(bytes(pkt[14:34])) == 0xFFFF, "bad IPv4 header checksum"
        assert struct.unpack_from("!H", pkt, 16)[0] == len(pkt) - 14
        pseudo = bytes(pkt[26:34]) + struct.pack("!BBH", 0, 17, udp_len)
    else:
        assert struct.unpack_from("!H", pkt, 18)[0] == udp_len
        pseudo = bytes(pkt[22:54]) + struct.pack("!IxxxB", udp_len, 17)
    assert naive_sum(pseudo + bytes(pkt[cstart:])) == 0xFFFF, "bad UDP checksum"
    return bytes(pkt[cstart + 8 :])


@pytest.mark.parametrize("ipv", [4, 6])
def test_udp_gso_loses_only_the_lost_segments(ipv: int) -> None:
    """UDP_SEGMENT super-packets (QUIC, the link check's rate blast) lose single datagrams,
    not the whole super-packet: dropping it whole would multiply the loss rate by its
    segment count."""
    payload = bytes((i * 11) & 0xFF for i in range(5000))  # 4 segments of 1400, the last 800
    frame = make_udp_gso(ipv=ipv, payload=payload)
    lay = fr.gso_layout(frame)
    assert lay is not None and lay.splittable and lay.segments == 4
    complete_and_verify_udp(frame)
    out = split(frame, {1})
    assert len(out) == 2
    assert [complete_and_verify_udp(f) for f in out] == [payload[:1400], payload[2800:]]
    gso = [fr.VNET.unpack_from(f, 0) for f in out]
    assert gso[0][1] == fr.GSO_NONE and gso[1][1] == fr.GSO_UDP_L4 and gso[1][3] == 1400
    if ipv == 4:
        ids = [struct.unpack_from("!H", f, fr.VNET_LEN + fr.ETH_LEN + 4)[0] for f in out]
        assert ids == [0x1234, 0x1236]  # as if the kernel had cut segments 0 and 2-3
