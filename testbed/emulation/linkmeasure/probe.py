"""Packet trains that measure a WAN link without TCP, run inside the emulated nodes.

``python -m testbed.emulation.linkmeasure.probe train --peer IP ...`` runs at both ends of a link at
once: each end sends a paced train of small UDP datagrams (a magic word, a sequence
number and the send time) to the other and receives the other's train. Every node of
an emulation shares the machine's clock, so the receiver gets each datagram's one-way
delay from the kernel's receive timestamp (SO_TIMESTAMPNS) less the send time it
carries; the sequence numbers give loss and reordering. The records go to a binary
file (`RECORD`: seq, send ns, receive ns, in arrival order) that
`testbed.emulation.linkmeasure.packet_trains` reads.

``python -m testbed.emulation.linkmeasure.probe capture --intf X --intf Y --out F.pcapng`` runs in
the WAN link node during a train (`topo check --deep`): a packet socket per interface,
with a kernel filter that passes only the train's datagrams and kernel timestamps,
keeps each datagram's headers as it enters and as it leaves the node, and on SIGTERM
writes them with scapy's pcapng writer (interface name and direction per packet), for
`testbed.emulation.linkmeasure.pcapcheck` to read.

``python -m testbed.emulation.linkmeasure.probe blast --peer IP --rate 1.3Gbit`` sends UDP GSO
super-packets (64 KiB each, so the relay moves few frames) above the link rate for a
while: the link's shaper must then send at exactly its rate, which the caller reads
from the WAN node's egress byte counters.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

MAGIC = 0x7462_7072  # "tbpr"
HELLO = struct.pack("!I", 0x7462_6865)  # "tbhe": this end's socket is bound (before the train)
HELLO_EVERY_S = 0.01
HELLO_WAIT_S = 30.0  # a peer's interpreter starts slowly on a busy machine
HEADER = struct.Struct("!IIQ")  # magic, seq, send time (ns, CLOCK_REALTIME)
RECORD = struct.Struct("<IQQ")  # seq, send ns, receive ns
SO_TIMESTAMPNS = 35
SOL_UDP = 17
UDP_SEGMENT = 103
GSO_SEGMENT = 1400  # payload bytes per segment: fits a 1500-byte MTU with headers
GSO_SEGMENTS = 44  # 44 x 1400 = 61,600 bytes per send (< 64 KiB)
BATCH_S = 0.001  # the sender paces in 1 ms batches


class _Report(BaseModel):
    """What a probe prints as its last line of stdout, one JSON object."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainReport(_Report):
    """One end of a train: datagrams sent to the peer, received from it (the peer's
    train's records in `records`), and foreign ones (not the train's) left out."""

    sent: int
    received: int
    foreign: int
    records: str


class CaptureReport(_Report):
    """A capture: train datagrams kept (each seen entering and leaving), the kernel's
    drops on the packet sockets, and the pcapng file written."""

    packets: int
    drops: int
    pcap: str


class BlastReport(_Report):
    """A blast: GSO sends made, refused by the host's own queue, bytes offered, seconds."""

    sends: int
    refused: int
    bytes: int
    seconds: float


def _train(peer: str, port: int, count: int, pps: float, size: int, linger_s: float, out: Path) -> TrainReport:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind(("0.0.0.0", port))
    sock.setblocking(False)
    pad = bytes(max(0, size - HEADER.size))
    records = bytearray()
    received = 0
    foreign = 0
    sent = 0
    peer_bound = False
    last_rx = time.monotonic()
    pack, rec = HEADER.pack_into, RECORD.pack
    buf = bytearray(HEADER.size + len(pad))
    buf[HEADER.size:] = pad
    cmsg_space = socket.CMSG_SPACE(16)

    def receive() -> None:
        nonlocal received, foreign, last_rx, peer_bound
        while True:
            try:
                data, anc, _flags, _addr = sock.recvmsg(64, cmsg_space)
            except BlockingIOError:
                return
            if data == HELLO:
                peer_bound = True
                continue
            rx_ns = None
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", value[:16])
                    rx_ns = sec * 1_000_000_000 + nsec
            if rx_ns is None or len(data) < HEADER.size:
                foreign += 1
                continue
            magic, seq, sent_ns = HEADER.unpack_from(data)
            if magic != MAGIC:
                foreign += 1
                continue
            records.extend(rec(seq, sent_ns, rx_ns))
            received += 1
            peer_bound = True
            last_rx = time.monotonic()

    # Both ends start at once but not at the same moment (a loaded machine can take
    # seconds to start an interpreter): send only once the peer's socket is bound, as
    # its HELLO (or its first datagram) shows, else the first datagrams would count as lost.
    give_up = time.monotonic() + HELLO_WAIT_S
    while not peer_bound and time.monotonic() < give_up:
        try:
            sock.sendto(HELLO, (peer, port))
        except OSError:
            pass
        select.select([sock], [], [], HELLO_EVERY_S)
        receive()
    try:
        sock.sendto(HELLO, (peer, port))  # the peer may have bound after our earlier ones
    except OSError:
        pass
    start = time.monotonic()
    last_rx = start
    while sent < count:
        now = time.monotonic()
        due = min(count, int((now - start) / (1.0 / pps)) + 1) if now >= start else 0
        while sent < due:
            pack(buf, 0, MAGIC, sent, time.time_ns())
            try:
                sock.sendto(buf, (peer, port))
            except (BlockingIOError, OSError):
                pass  # counted as lost on the way: the receiver never sees it
            sent += 1
        receive()
        select.select([sock], [], [], BATCH_S)
    done = time.monotonic()
    while True:
        receive()
        now = time.monotonic()
        if now - done > linger_s and now - last_rx > min(linger_s, 0.5):
            break
        select.select([sock], [], [], 0.05)
    sock.close()
    out.write_bytes(bytes(records))
    return TrainReport(sent=sent, received=received, foreign=foreign, records=str(out))


SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
ETH_P_ALL = 3
SO_ATTACH_FILTER = 26
SNAPLEN = 96  # Ethernet, IPv4 and UDP headers and the train's header
LINKTYPE_ETHERNET = 1


def udp_port_filter(port: int, snaplen: int = SNAPLEN) -> list[tuple[int, int, int, int]]:
    """Classic BPF: IPv4 UDP to `port`, first fragment only, cut at `snaplen` bytes
    (what `tcpdump -dd 'udp dst port PORT'` gives, for IPv4)."""
    return [
        (0x28, 0, 0, 12),          # ldh [12]          ethertype
        (0x15, 0, 8, 0x0800),      # jeq #IPv4
        (0x30, 0, 0, 23),          # ldb [23]          protocol
        (0x15, 0, 6, 17),          # jeq #UDP
        (0x28, 0, 0, 20),          # ldh [20]          flags + fragment offset
        (0x45, 4, 0, 0x1FFF),      # jset #0x1fff      a later fragment: drop
        (0xB1, 0, 0, 14),          # ldxb 4*([14]&0xf) IP header length
        (0x48, 0, 0, 16),          # ldh [x + 16]      UDP destination port
        (0x15, 0, 1, port),        # jeq #port
        (0x06, 0, 0, snaplen),     # ret #snaplen
        (0x06, 0, 0, 0),           # ret #0
    ]


def _attach_filter(sock: socket.socket, prog: list[tuple[int, int, int, int]]) -> None:
    import ctypes

    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw)
    fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))  # the kernel copies the program
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def _capture(intfs: Sequence[str], port: int, out: Path) -> CaptureReport:
    # The kernel stamps each packet as it passes; reading them late costs nothing but
    # buffer space (32 MiB per socket), so the capture yields the CPU to the relay and
    # the train's ends, whose timing it measures.
    os.nice(10)
    socks = []
    for name in intfs:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        _attach_filter(sock, udp_port_filter(port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.bind((name, ETH_P_ALL))
        sock.setblocking(False)
        socks.append((name, sock))
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print("READY", flush=True)
    kept: list[tuple[bytes, int, int, bytes]] = []  # ifname, direction, ts ns, headers (cut by the filter)
    cmsg_space = socket.CMSG_SPACE(16)
    by_fd = {sock.fileno(): (name.encode(), sock) for name, sock in socks}

    def drain(name: bytes, sock: socket.socket) -> None:
        while True:
            try:
                data, anc, _flags, addr = sock.recvmsg(SNAPLEN, cmsg_space)
            except BlockingIOError:
                return
            ts = 0
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", value[:16])
                    ts = sec * 1_000_000_000 + nsec
            direction = 2 if addr[2] == PACKET_OUTGOING else 1
            kept.append((name, direction, ts, data))

    while not stop:
        try:
            ready, _, _ = select.select(list(by_fd), [], [], 0.1)
        except InterruptedError:
            continue
        for fd in ready:
            drain(*by_fd[fd])
    for name, sock in by_fd.values():
        drain(name, sock)
    drops = 0
    for _name, sock in by_fd.values():
        drops += struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
        sock.close()
    write_pcapng(out, kept)
    return CaptureReport(packets=len(kept), drops=drops, pcap=str(out))


def write_pcapng(path: Path, packets: Sequence[tuple[bytes, int, int, bytes]]) -> None:
    """Ethernet frames as (interface name, direction 1 in / 2 out, time ns, bytes) to a
    pcapng file through scapy's writer (one interface block per interface name)."""
    from scapy.utils import RawPcapNgWriter

    writer = RawPcapNgWriter(str(path))
    writer.linktype = LINKTYPE_ETHERNET
    writer.write_header(None)  # section header; per-packet writes add one block per interface
    for name, direction, ts, data in packets:
        writer._write_packet(data, LINKTYPE_ETHERNET, sec=ts / 1e9, caplen=len(data), wirelen=len(data),
                             ifname=name, direction=direction)
    writer.close()


def _blast(peer: str, port: int, rate_bps: float, duration_s: float) -> BlastReport:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(SOL_UDP, UDP_SEGMENT, GSO_SEGMENT)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    payload = bytes(GSO_SEGMENT * GSO_SEGMENTS)
    per_send_bits = 8 * (len(payload) + GSO_SEGMENTS * 28)  # with IP and UDP headers
    interval = per_send_bits / rate_bps
    sends = refused = 0
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        if now - t0 >= duration_s:
            break
        due = int((now - t0) / interval) + 1
        while sends < due:
            try:
                sock.sendto(payload, (peer, port))
            except OSError:
                refused += 1  # the host's own queue is full: it only sends less
            sends += 1
        time.sleep(BATCH_S)
    sock.close()
    return BlastReport(sends=sends, refused=refused, bytes=sends * len(payload), seconds=time.monotonic() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.emulation.linkmeasure.probe",
                                     description="UDP packet trains for `testbed topo check`, run inside nodes")
    sub = parser.add_subparsers(dest="role", required=True)
    t = sub.add_parser("train", help="send a train to --peer while receiving its train")
    t.add_argument("--peer", required=True)
    t.add_argument("--port", type=int, default=47000)
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--pps", type=float, required=True)
    t.add_argument("--size", type=int, default=64, help="UDP payload bytes")
    t.add_argument("--linger", type=float, default=1.0, help="seconds to keep receiving after the last send")
    t.add_argument("--out", required=True, help="file for the received records")
    c = sub.add_parser("capture", help="capture a train's datagrams on interfaces until SIGTERM")
    c.add_argument("--intf", action="append", required=True)
    c.add_argument("--port", type=int, default=47000)
    c.add_argument("--out", required=True, help="pcapng file")
    b = sub.add_parser("blast", help="UDP GSO above the link rate, to measure the shaper")
    b.add_argument("--peer", required=True)
    b.add_argument("--port", type=int, default=47001)
    b.add_argument("--rate", type=float, required=True, help="bits per second")
    b.add_argument("--duration", type=float, required=True)
    ns = parser.parse_args(argv)
    result: _Report
    if ns.role == "train":
        result = _train(ns.peer, ns.port, ns.count, ns.pps, ns.size, ns.linger, Path(ns.out))
    elif ns.role == "capture":
        result = _capture(ns.intf, ns.port, Path(ns.out))
    else:
        result = _blast(ns.peer, ns.port, ns.rate, ns.duration)
    print(result.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
