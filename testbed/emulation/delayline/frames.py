"""Frames as the relay sees them: a ``virtio_net_hdr`` (PACKET_VNET_HDR) followed by an
Ethernet frame that may be a GSO super-packet (many TCP segments in one buffer).

Pure functions, no I/O. Loss is decided per *segment*; when some segments of a TCP
super-packet are lost, `keep_segments` rebuilds the surviving runs as their own
(smaller) GSO packets, exactly as if the lost segments had been dropped on the wire:
sequence numbers, IPv4 id, lengths, IPv4 header checksum, the partial TCP checksum
and the TCP flags that GSO puts on the first (CWR) or last (FIN, PSH) segment only.
UDP GSO (UDP_SEGMENT) super-packets are rebuilt the same way (UDP length, IPv4 id and
checksum, the partial UDP checksum). Frames we cannot rebuild (UFO, IP options we do
not parse, VLAN tags) are dropped whole when any of their segments is lost.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

VNET = struct.Struct("<BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
VNET_LEN = VNET.size  # 10
ETH_LEN = 14

F_NEEDS_CSUM = 1
GSO_NONE = 0
GSO_TCPV4 = 1
GSO_UDP = 3
GSO_TCPV6 = 4
GSO_UDP_L4 = 5
GSO_ECN = 0x80

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
IPPROTO_TCP = 6
IPPROTO_UDP = 17

TCP_FIN = 0x01
TCP_PSH = 0x08
TCP_CWR = 0x80


@dataclass(frozen=True)
class GsoLayout:
    """Where things are in a GSO frame (offsets from the start of the buffer,
    vnet header included)."""

    gso_type: int  # without the ECN bit
    ecn: bool
    gso_size: int
    l3: int
    ipv: int  # 4 or 6, 0 when not parsed
    l4: int
    hdr_end: int  # first payload byte
    segments: int
    splittable: bool


def gso_layout(frame: bytes) -> GsoLayout | None:
    """Parse a GSO super-packet; None for an ordinary (single-segment) frame."""
    if len(frame) < VNET_LEN + ETH_LEN:
        return None
    _flags, gso_raw, hdr_len, gso_size, _cs, _co = VNET.unpack_from(frame, 0)
    gso_type = gso_raw & ~GSO_ECN & 0xFF
    if gso_type == GSO_NONE or gso_size == 0:
        return None
    l3 = VNET_LEN + ETH_LEN
    ethertype = int.from_bytes(frame[l3 - 2 : l3], "big")
    ipv = 0
    l4 = hdr_end = -1
    proto = -1
    if ethertype == ETH_P_IP and len(frame) >= l3 + 20:
        ipv = 4
        ihl = (frame[l3] & 0x0F) * 4
        proto = frame[l3 + 9]
        l4 = l3 + ihl
    elif ethertype == ETH_P_IPV6 and len(frame) >= l3 + 40:
        ipv = 6
        proto = frame[l3 + 6]
        l4 = l3 + 40
    splittable = False
    if proto == IPPROTO_TCP and len(frame) >= l4 + 20:
        hdr_end = l4 + (frame[l4 + 12] >> 4) * 4
        splittable = gso_type in (GSO_TCPV4, GSO_TCPV6) and (ipv == 4) == (gso_type == GSO_TCPV4)
    elif proto == IPPROTO_UDP and len(frame) >= l4 + 8:
        hdr_end = l4 + 8
        splittable = gso_type == GSO_UDP_L4 and ipv in (4, 6)
    if hdr_end < 0 or hdr_end > len(frame):
        hdr_end = min(len(frame), VNET_LEN + hdr_len) if hdr_len else len(frame)
        splittable = False
    payload = len(frame) - hdr_end
    segments = max(1, math.ceil(payload / gso_size))
    return GsoLayout(
        gso_type=gso_type,
        ecn=bool(gso_raw & GSO_ECN),
        gso_size=gso_size,
        l3=l3,
        ipv=ipv,
        l4=l4,
        hdr_end=hdr_end,
        segments=segments,
        splittable=splittable,
    )


def segment_count(frame: bytes) -> int:
    """How many wire packets this frame stands for (1 unless GSO)."""
    lay = gso_layout(frame)
    return 1 if lay is None else lay.segments


def ones_sum(data: bytes | bytearray | memoryview) -> int:
    """The 16-bit ones'-complement sum (folded, not inverted) of big-endian words.
    Uses 2**16 = 1 (mod 0xFFFF), so one big-integer modulo does all the work in C."""
    if len(data) % 2:
        data = bytes(data) + b"\x00"
    value = int.from_bytes(data, "big")
    if value == 0:
        return 0
    s = value % 0xFFFF
    return s or 0xFFFF


def _pseudo_sum(hdr: bytearray, lay: GsoLayout, l4_len: int, proto: int = IPPROTO_TCP) -> int:
    if lay.ipv == 4:
        src_dst = hdr[lay.l3 + 12 : lay.l3 + 20]
        pseudo = bytes(src_dst) + struct.pack("!BBH", 0, proto, l4_len)
    else:
        src_dst = hdr[lay.l3 + 8 : lay.l3 + 40]
        pseudo = bytes(src_dst) + struct.pack("!IxxxB", l4_len, proto)
    return ones_sum(pseudo)


def _run(frame: bytes, lay: GsoLayout, first: int, stop: int) -> bytes:
    """Segments [first, stop) of a TCP or UDP super-packet as a frame of their own."""
    mss = lay.gso_size
    start = lay.hdr_end + first * mss
    end = min(lay.hdr_end + stop * mss, len(frame))
    count = stop - first
    hdr = bytearray(frame[: lay.hdr_end])
    l3, l4 = lay.l3, lay.l4
    l4_len = (lay.hdr_end - l4) + (end - start)
    udp = lay.gso_type == GSO_UDP_L4
    if udp:
        hdr[l4 + 4 : l4 + 6] = l4_len.to_bytes(2, "big")
    else:
        seq = (int.from_bytes(hdr[l4 + 4 : l4 + 8], "big") + first * mss) & 0xFFFFFFFF
        hdr[l4 + 4 : l4 + 8] = seq.to_bytes(4, "big")
        flags = hdr[l4 + 13]
        if first > 0:
            flags &= ~TCP_CWR & 0xFF
        if stop < lay.segments:
            flags &= ~(TCP_FIN | TCP_PSH) & 0xFF
        hdr[l4 + 13] = flags
    if lay.ipv == 4:
        ihl = l4 - l3
        hdr[l3 + 2 : l3 + 4] = (ihl + l4_len).to_bytes(2, "big")
        ip_id = (int.from_bytes(hdr[l3 + 4 : l3 + 6], "big") + first) & 0xFFFF
        hdr[l3 + 4 : l3 + 6] = ip_id.to_bytes(2, "big")
        hdr[l3 + 10 : l3 + 12] = b"\x00\x00"
        hdr[l3 + 10 : l3 + 12] = (~ones_sum(hdr[l3:l4]) & 0xFFFF).to_bytes(2, "big")
    else:
        hdr[l3 + 4 : l3 + 6] = ((l4 - l3 - 40) + l4_len).to_bytes(2, "big")
    # CHECKSUM_PARTIAL: the check field carries the pseudo-header sum, the sender's
    # device (or software) completes it over header and payload.
    csum_offset = 6 if udp else 16
    proto = IPPROTO_UDP if udp else IPPROTO_TCP
    hdr[l4 + csum_offset : l4 + csum_offset + 2] = _pseudo_sum(hdr, lay, l4_len, proto).to_bytes(2, "big")
    gso_type = lay.gso_type | (GSO_ECN if lay.ecn and first == 0 else 0)
    VNET.pack_into(
        hdr,
        0,
        F_NEEDS_CSUM,
        gso_type if count > 1 else GSO_NONE,
        lay.hdr_end - VNET_LEN,
        mss if count > 1 else 0,
        l4 - VNET_LEN,
        csum_offset,
    )
    return bytes(hdr) + frame[start:end]


def keep_segments(frame: bytes, lay: GsoLayout, lost: list[bool]) -> list[bytes]:
    """The frames to send when the segments marked in ``lost`` are dropped.

    All kept: the frame itself. None kept, or a frame we cannot rebuild: nothing.
    """
    if not any(lost):
        return [frame]
    if not lay.splittable or all(lost):
        return []
    out: list[bytes] = []
    first = None
    for i, gone in enumerate(lost):
        if not gone and first is None:
            first = i
        elif gone and first is not None:
            out.append(_run(frame, lay, first, i))
            first = None
    if first is not None:
        out.append(_run(frame, lay, first, len(lost)))
    return out
