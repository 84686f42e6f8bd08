"""The WAN node capture, offline: frames written the way `probe capture` writes them
(scapy's pcapng writer) are read back and turned into each direction's pass through
the node (delay, loss, order), and the histogram is drawn."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from testbed.emulation.linkmeasure import pcapcheck
from testbed.emulation.linkmeasure.probe import HEADER, MAGIC, udp_port_filter, write_pcapng

A, B = "10.200.1.10", "10.200.2.10"


def frame(src: str, dst: str, seq: int, dport: int = 47000) -> bytes:
    payload = HEADER.pack(MAGIC, seq, 123) + bytes(16)
    udp = struct.pack("!HHHH", 47000, dport, 8 + len(payload), 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp) + len(payload), 0, 0x4000, 64, 17, 0,
                     bytes(map(int, src.split("."))), bytes(map(int, dst.split("."))))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + udp + payload


def test_capture_round_trip_and_node_pass(tmp_path: Path) -> None:
    ms = 1_000_000
    t0 = 1_700_000_000 * 1_000_000_000
    packets = []
    for seq in range(6):  # a->b enters on eth0 at seq ms, leaves on eth1 25 ms later
        packets.append((b"w-eth0", 1, t0 + seq * ms, frame(A, B, seq)))
    for seq, extra in ((0, 0), (2, 0), (1, 1), (3, 0), (5, 0)):  # 4 lost, 1 overtaken by 2
        packets.append((b"w-eth1", 2, t0 + (seq + 25 + extra * 2) * ms, frame(A, B, seq)))
    packets.append((b"w-eth1", 1, t0, frame(B, A, 0)))  # the other direction entering: not a->b
    path = tmp_path / "link.pcapng"
    write_pcapng(path, packets)
    seen = pcapcheck.read_capture(path)
    assert len(seen) == len(packets)
    assert seen[0] == pcapcheck.Seen("w-eth0", pcapcheck.INBOUND, pytest.approx(t0 / 1e9), A, 0)
    npass = pcapcheck.node_pass(seen, A, "w-eth0", "w-eth1")
    assert (npass.entered, npass.left, npass.lost, npass.reordered) == (6, 5, 1, 1)
    assert npass.loss == pytest.approx(1 / 6)
    s = npass.summary_ms()
    assert s["min"] == pytest.approx(25.0, abs=0.002) and s["max"] == pytest.approx(27.0, abs=0.002)
    back = pcapcheck.node_pass(seen, B, "w-eth1", "w-eth0")
    assert (back.entered, back.left, back.lost) == (1, 0, 1)


def test_empty_capture_reads_as_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.pcapng"
    write_pcapng(path, [])
    assert pcapcheck.read_capture(path) == []


def test_histogram_png(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    e2e = 0.025 + rng.uniform(-0.002, 0.002, 500)
    path = tmp_path / "h.png"
    pcapcheck.histogram_png(path, "test", [("a -> b", e2e, e2e - 0.0002, e2e), ("b -> a", e2e, np.array([]), e2e)],
                            0.025, 0.002)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_capture_filter_program_shape() -> None:
    """The classic BPF program accepts IPv4 UDP to the port and cuts at the snap length."""
    prog = udp_port_filter(47000, 96)
    assert prog[0] == (0x28, 0, 0, 12) and prog[1][3] == 0x0800 and prog[3][3] == 17
    assert (0x15, 0, 1, 47000) in prog and prog[-2] == (0x06, 0, 0, 96) and prog[-1] == (0x06, 0, 0, 0)
    for i, (code, jt, jf, _k) in enumerate(prog):  # every jump lands inside the program
        if code & 0x07 == 0x05:
            assert i + 1 + max(jt, jf) < len(prog)
