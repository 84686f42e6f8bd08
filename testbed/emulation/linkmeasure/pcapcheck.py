"""What a capture on a WAN link node (`probe capture`, pcapng) says about the link itself:
for each direction, every train datagram as it entered the node and as it left it,
hence the delay the node added (relay queue and shaper, without the hosts and
gateways), the datagrams it lost and whether it kept their order.

The file is read with scapy's pcapng reader (interface name, direction and timestamp
per packet). The headers are decoded at fixed offsets rather than dissected packet by
packet with scapy's layers: the capture filter passes only IPv4 UDP datagrams of the
train, and a lossy link's train has some 100,000 datagrams, each seen twice, which
scapy's per-packet dissection would take minutes over.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from testbed.emulation.linkmeasure.probe import HEADER, MAGIC

INBOUND, OUTBOUND = 1, 2


@dataclass(frozen=True)
class Seen:
    """One train datagram as the capture saw it."""

    ifname: str
    direction: int  # INBOUND (entering the node) or OUTBOUND (leaving it)
    t_s: float
    src: str
    seq: int


def read_capture(path: Path) -> list[Seen]:
    """The train's datagrams in a pcapng written by `probe capture`."""
    from scapy.utils import RawPcapNgReader

    out: list[Seen] = []
    with RawPcapNgReader(str(path)) as reader:
        for data, meta in reader:
            if len(data) < 14 + 20 + 8 + HEADER.size or data[12:14] != b"\x08\x00":
                continue
            ihl = (data[14] & 0x0F) * 4
            payload = 14 + ihl + 8
            if len(data) < payload + HEADER.size:
                continue
            magic, seq, _sent = HEADER.unpack_from(data, payload)
            if magic != MAGIC:
                continue
            ts = ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
            name = meta.ifname.decode() if isinstance(meta.ifname, bytes) else str(meta.ifname)
            out.append(Seen(name, int(meta.direction or 0), ts, str(ipaddress.IPv4Address(data[26:30])), seq))
    return out


class NodePassReport(BaseModel):
    """`NodePass` as `testbed topo check` reports it (delays in ms: min, p50, max)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entered: int
    left: int
    lost: int
    loss: float
    reordered: int
    delay_ms: dict[str, float]


@dataclass
class NodePass:
    """One direction through the WAN node."""

    entered: int
    left: int
    lost: int
    reordered: int
    delays_s: np.ndarray

    @property
    def loss(self) -> float:
        return self.lost / self.entered if self.entered else math.nan

    def summary_ms(self) -> dict[str, float]:
        if not self.delays_s.size:
            return {"min": math.nan, "p50": math.nan, "max": math.nan}
        q = np.quantile(self.delays_s, [0.0, 0.5, 1.0]) * 1e3
        return {"min": float(q[0]), "p50": float(q[1]), "max": float(q[2])}

    def report(self) -> NodePassReport:
        return NodePassReport(entered=self.entered, left=self.left, lost=self.lost, loss=self.loss,
                              reordered=self.reordered,
                              delay_ms={k: round(v, 4) for k, v in self.summary_ms().items()})


def node_pass(seen: list[Seen], src: str, in_intf: str, out_intf: str) -> NodePass:
    """Datagrams from `src` entering on `in_intf` and leaving on `out_intf`."""
    entered: dict[int, float] = {}
    left: list[tuple[int, float]] = []
    for s in seen:
        if s.src != src:
            continue
        if s.ifname == in_intf and s.direction == INBOUND:
            entered.setdefault(s.seq, s.t_s)
        elif s.ifname == out_intf and s.direction == OUTBOUND:
            left.append((s.seq, s.t_s))
    left_seqs = {seq for seq, _ in left}
    delays = np.array([t - entered[seq] for seq, t in left if seq in entered])
    order = [seq for seq, _ in left]
    running = -1
    reordered = 0
    for seq in order:
        if seq < running:
            reordered += 1
        running = max(running, seq)
    return NodePass(entered=len(entered), left=len(left_seqs), lost=len(set(entered) - left_seqs),
                    reordered=reordered, delays_s=delays)


def histogram_png(path: Path, title: str, panels: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
                  delay_s: float, jitter_s: float) -> None:
    """One panel per direction (label, end-to-end delays, through-the-node delays, the
    order-keeping model's delays for the same send times; seconds): histograms, the
    model as a line, the configured delay and jitter range marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), squeeze=False)
    for ax, (label, e2e_s, node_s, model_s) in zip(axes[:, 0], panels, strict=True):
        values = [v for v in (e2e_s, node_s) if v.size]
        if values:
            everything = np.concatenate(values) * 1e3
            lo = float(everything.min())
            # a few datagrams held up by a busy machine would squeeze the shape into one bar:
            # the axis ends 1 ms past the jitter range or 0.5 ms past the 99th percentile, the rest is counted
            hi = max((delay_s + jitter_s) * 1e3 + 1.0, float(np.quantile(everything, 0.99)) + 0.5)
            beyond = int(np.count_nonzero(everything > hi))
            if beyond:
                label += f" ({beyond} beyond {hi:.1f} ms, up to {float(everything.max()):.1f} ms)"
            bins = np.linspace(lo - 0.05, hi + 0.05, 80)
            if e2e_s.size:
                ax.hist(e2e_s * 1e3, bins=bins, alpha=0.6, label=f"end to end (host to host), n={e2e_s.size}")
            if node_s.size:
                ax.hist(node_s * 1e3, bins=bins, alpha=0.6, label=f"through the WAN node, n={node_s.size}")
            if model_s.size:
                ax.hist(model_s * 1e3, bins=bins, histtype="step", color="k", linewidth=1,
                        label="configured (order-keeping uniform jitter model)")
        ax.axvline(delay_s * 1e3, color="k", linestyle="--", linewidth=1, label="configured delay")
        if jitter_s > 0:
            for edge in (delay_s - jitter_s, delay_s + jitter_s):
                ax.axvline(edge * 1e3, color="r", linestyle=":", linewidth=1)
            ax.axvspan((delay_s - jitter_s) * 1e3, (delay_s + jitter_s) * 1e3, color="r", alpha=0.06,
                       label="configured jitter range")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("one-way delay (ms)")
        ax.set_ylabel("datagrams")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
