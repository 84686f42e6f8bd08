"""Measure every WAN link of a running emulation and compare it with the topology.

For each link, in both directions: RTT with `ping` (a short warm-up first, so ARP
and first-packet effects do not count, then 20 pings 50 ms apart: median and mean)
and goodput with iperf3 through its Python wrapper, with enough parallel streams
that the per-flow window limit of the hosts' TCP settings does not hide the link
rate. The wrapper runs libiperf in-process, so the client and server run as
`python -m testbed.emulation.linkmeasure.iperf client|server` processes inside the nodes.

Endpoints: the first host of each DC when the link is the lowest-latency route
between its two DCs (the normal case); otherwise traffic between those hosts would
take another path, so the two gateways measure the link directly over its /30.

Then, without TCP (`testbed.emulation.linkmeasure.probe`, judged by `testbed.emulation.linkmeasure.packet_trains`):
a UDP train both ways at once gives each direction's loss (with its confidence
interval), one-way delay distribution (min, median, max against the configured
jitter range, from kernel receive timestamps) and reordering, and the precise RTT
(the sum of the two median one-way delays); a UDP GSO blast above the link rate one
way, then the other, gives the shaper's rate from the WAN node's egress byte counters.

Verdict: RTT within 0.3 ms of the configured RTT (of the FIFO jitter model's median
under jitter); loss, delay and rate as configured (see `packet_trains`); and, on a
loss-free link, TCP goodput at least 90% of the rate. A lossy link cannot carry its
full rate over TCP, so there the goodput is shown beside what TCP can expect under
that loss (`packet_trains.expected_tcp_goodput`) instead of being judged.
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from pydantic import BaseModel

from testbed.emulation.linkmeasure import packet_trains, pcapcheck
from testbed.emulation.linkmeasure.iperf import IPERF_MODULE, IPERF_PORT, IperfLine
from testbed.emulation.linkmeasure.probe import GSO_SEGMENT, CaptureReport, TrainReport
from testbed.emulation.linkmeasure.results import Direction, LinkResult, Tolerance

if TYPE_CHECKING:
    from testbed.emulation.delayline.stats import RelaySnapshot
    from testbed.emulation.network import Emulation
    from testbed.emulation.nodes import NodeHandle
    from testbed_core.topology import TcpSettings, WanLink

R = TypeVar("R", bound=BaseModel)
PING_RE = re.compile(r"time[=<]([0-9.]+) ms")


def parse_ping(text: str) -> list[float]:
    """Per-reply RTTs in seconds from ping's output."""
    return [float(m) / 1000 for m in PING_RE.findall(text)]


def streams_for(rate_bps: float, rtt_s: float, tcp: TcpSettings | None,
                minimum: int = 8, maximum: int = 64, headroom: float = 1.1) -> int:
    """Parallel streams so that their summed window limit exceeds the link rate with
    `headroom` (at least `minimum`)."""
    if tcp is None:
        return minimum
    per_flow = tcp.window_limited_rate(rtt_s)
    if not math.isfinite(per_flow) or per_flow <= 0:
        return minimum
    return max(minimum, min(maximum, math.ceil(headroom * rate_bps / per_flow)))


# --------------------------------------------------------------------------- measurements


def measure_rtt(src: NodeHandle, dst_ip: str, count: int = 20, interval: float = 0.05,
                warmup: int = 3) -> list[float]:
    """RTT samples (seconds) from `src` to `dst_ip` after a warm-up."""
    src.run(["ping", "-n", "-c", str(warmup), "-i", "0.2", "-W", "2", dst_ip], timeout=warmup * 2.5 + 5)
    wait = max(2, math.ceil(10 * interval))
    out = src.run(["ping", "-n", "-c", str(count), "-i", f"{interval:g}", "-W", str(wait), dst_ip],
                  timeout=count * interval + wait + 10)
    return parse_ping(out.stdout)


def measure_rtt_both_ways(na: NodeHandle, ip_a: str, nb: NodeHandle, ip_b: str,
                          count: int = 20) -> tuple[list[float], list[float]]:
    """RTT samples a -> b and b -> a, both pinged at once: a few echoes each way do not
    load the link (or each other), and the check waits for one ping's time, not two."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        a_to_b = pool.submit(measure_rtt, na, ip_b, count)
        b_to_a = pool.submit(measure_rtt, nb, ip_a, count)
        return a_to_b.result(), b_to_a.result()


@dataclass
class IperfResult:
    bps: float | None
    retransmits: int | None = None
    error: str | None = None


def measure_goodput(src: NodeHandle, dst: NodeHandle, dst_ip: str, streams: int,
                    duration: int = 4, omit: int = 1, port: int = IPERF_PORT) -> IperfResult:
    """Goodput from `src` to `dst` (listening on `dst_ip`) with `streams` TCP streams."""
    py = sys.executable
    server = dst.popen([py, "-m", IPERF_MODULE, "server", "--bind", dst_ip, "--port", str(port)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        out = src.run([py, "-m", IPERF_MODULE, "client", "--server", dst_ip, "--port", str(port),
                       "--streams", str(streams), "--duration", str(duration), "--omit", str(omit)],
                      timeout=duration + omit + 30)
    except BaseException:  # Ctrl-C or a timeout: do not wait for the server
        server.kill()
        server.wait()
        raise
    finally:
        if server.poll() is None:
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if server.stderr is not None:
            server.stderr.close()
    line = _last_json_line(out.stdout)
    if line is None:
        return IperfResult(None, error=(out.stderr.strip() or f"iperf client exited {out.returncode}")[-300:])
    got = IperfLine.model_validate_json(line)
    return IperfResult(got.bps, got.retransmits, got.error)


PROBE_PORT = 47000
BLAST_PORT = 47001
BLAST_OVERLOAD = 1.15  # the blast offers 115% of the link rate: the shaper must cut it
BLAST_S = 2.2
RATE_WINDOW = (0.6, 2.0)  # seconds into the blast over which the egress counters are read ...
RATE_STEP_S = 0.2  # ... every RATE_STEP_S
RATE_QUANTILE = 0.75
RATE_READ_MAX_S = 0.004
"""A counter read that took longer than this (a busy machine, the netlink call waiting for
the CPU) is left out: the counters were taken somewhere inside the call, and over a
RATE_STEP_S interval 20 ms of doubt alone moves the rate by 10% (one check at load 8
measured a 2 Gbit/s link at 2126 Mbit/s)."""


def _probe_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "testbed.emulation.linkmeasure.probe", *args]


def _last_json_line(text: str) -> str | None:
    """The last line of a node program's stdout that is a JSON object (its report)."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return lines[-1] if lines else None


def _report(proc: subprocess.Popen[str], timeout_s: float, model: type[R], what: str) -> R:
    """Wait for probe `proc` (killed after `timeout_s`) and read its report; a probe that
    printed none failed, and its stderr says why."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    line = _last_json_line(out)
    if line is None:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {err.strip()[-400:]}")
    return model.model_validate_json(line)


def measure_trains(na: NodeHandle, ip_a: str, nb: NodeHandle, ip_b: str, count: int, pps: float,
                   linger_s: float, folder: Path, port: int = PROBE_PORT) -> tuple[TrainReport, TrainReport]:
    """Run a train a->b and b->a at once; returns each end's report (its `records`
    file, fetched into `folder`, holds what it received)."""
    procs = []
    for node, peer, tag in ((na, ip_b, "a"), (nb, ip_a, "b")):
        procs.append(node.popen(_probe_argv("train", "--peer", peer, "--port", str(port), "--count", str(count),
                                            "--pps", f"{pps:g}", "--linger", f"{linger_s:g}",
                                            "--out", str(folder / f"train-{tag}.bin")),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    reports = [_report(proc, count / pps + linger_s + 30, TrainReport, "the probe train") for proc in procs]
    rep_a, rep_b = (report.model_copy(update={"records": str(node.fetch(report.records, folder))})
                    for node, report in ((na, reports[0]), (nb, reports[1])))  # a node on another server wrote it there
    return rep_a, rep_b


def _tx_counters(wan: NodeHandle, intfs: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(bytes, packets) each interface has sent; a GSO super-packet counts once."""
    return wan.tx_counters(intfs)  # through its PID here, through its node agent on a server over SSH


def wire_bits(d_bytes: int, d_packets: int, segment: int = GSO_SEGMENT, headers: int = 14 + 20 + 8) -> float:
    """Bits the blast's frames take once cut into segments. Every segment carries
    `segment` payload bytes and its own Ethernet, IPv4 and UDP headers, which HTB
    charges for (qdisc_pkt_len) but the interface's byte counter, counting each GSO
    super-packet (whole, or rebuilt around lost segments) once, does not."""
    return 8.0 * max(0, d_bytes - d_packets * headers) * (segment + headers) / segment


def shaper_rate(samples: Sequence[tuple[float, int, int]], quantile: float = RATE_QUANTILE) -> float | None:
    """The rate (bits/s) a shaper sends at while it has a backlog, from (time, tx bytes,
    tx packets) samples of its interface: the `quantile` of the rates over successive
    intervals. A feed that lags now and then (the relay or the sender losing the CPU on
    a busy machine) lets the queue run dry in some intervals and lowers their rate; the
    upper quantile is what the shaper gives when fed."""
    rates = [wire_bits(b2 - b1, p2 - p1) / (t2 - t1)
             for (t1, b1, p1), (t2, b2, p2) in zip(samples, samples[1:], strict=False) if t2 > t1]
    if not rates:
        return None
    return float(np.quantile(rates, quantile))


def measure_rate(emu: Emulation, a: str, b: str, src: NodeHandle, dst_ip: str, rate_bps: float) -> dict[str, float]:
    """Blast UDP from `src` to `dst_ip` above the rate of link a-b; the WAN node's egress
    counters, read every RATE_STEP_S over the steady part, give the rate each interface
    sends at (`shaper_rate`; bits/s of segmented frames as HTB counts them, `wire_bits`),
    by interface name."""
    wan = emu.wan_node(a, b)
    blast = src.popen(_probe_argv("blast", "--peer", dst_ip, "--port", str(BLAST_PORT),
                                  "--rate", f"{rate_bps * BLAST_OVERLOAD:g}", "--duration", f"{BLAST_S:g}"),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t_start = time.monotonic()
    samples: dict[str, list[tuple[float, int, int]]] = {}
    try:
        at = RATE_WINDOW[0]
        while at <= RATE_WINDOW[1] + 1e-9:
            time.sleep(max(0.0, t_start + at - time.monotonic()))
            before = time.monotonic()
            counters = _tx_counters(wan, wan.intfs)
            after = time.monotonic()
            for name, (nbytes, npackets) in counters.items():
                samples.setdefault(name, []).append(((before + after) / 2, nbytes, npackets, after - before))
            at += RATE_STEP_S
    finally:
        try:
            blast.communicate(timeout=BLAST_S + 30)
        except subprocess.TimeoutExpired:
            blast.kill()
            blast.communicate()
    return {name: rate for name, got in samples.items() if (rate := shaper_rate(timed_reads(got))) is not None}


def timed_reads(samples: Sequence[tuple[float, int, int, float]],
                read_max_s: float = RATE_READ_MAX_S) -> list[tuple[float, int, int]]:
    """The (time, bytes, packets) of the counter reads that took at most `read_max_s`
    (their time is known to within half that); all of them when fewer than three did."""
    quick = [(t, b, p) for t, b, p, took in samples if took <= read_max_s]
    return quick if len(quick) >= 3 else [(t, b, p) for t, b, p, _ in samples]


def relay_drops(before: RelaySnapshot, after: RelaySnapshot) -> dict[str, dict[str, int]]:
    """Per direction of a relay, between two STATS snapshots: what its loss model dropped
    (segments), what the shaper's queue refused, and what the relay itself lost (its
    socket's ring or its own queue overflowing: the emulator's fault, not the link's)."""
    from testbed.emulation.delayline.stats import window

    got = window(before, after)
    return {name: {"loss_model": d.loss_model, "queue_drops": d.queue_drops, "relay_drops": d.relay_drops,
                   "socket_drops": d.socket_drops}
            for name, d in got.directions().items()}


def relay_cpu(before: RelaySnapshot | None, after: RelaySnapshot | None) -> tuple[float, float | None] | None:
    """The relay's CPU seconds between two STATS snapshots, and per Gbit it sent in
    both directions together then (frames as they left it, vnet header excluded);
    None when either snapshot is missing or has no CPU figure (netem, an older relay)."""
    if before is None or after is None or before.cpu_s is None or after.cpu_s is None:
        return None
    cpu = after.cpu_s - before.cpu_s
    sent = sum(after.direction(k).tx_bytes - before.direction(k).tx_bytes for k in ("a2b", "b2a"))
    return cpu, (cpu / (sent * 8 / 1e9) if sent > 0 else None)


def _egress_towards(emu: Emulation, a: str, b: str) -> str:
    """The WAN node's interface that sends towards DC b."""
    wan = emu.wan_node(a, b)
    assert wan.plan is not None and emu._wiring is not None
    return emu._wiring.intf_towards(wan.mn_name, emu.gateway(b).mn_name)


def _endpoints(emu: Emulation, a: str, b: str) -> tuple[str, NodeHandle, str, NodeHandle, str]:
    """(kind, node in a, its address, node in b, its address) to measure link a-b."""
    routes = emu.topology.routes()
    if routes[(a, b)] == [a, b] and routes[(b, a)] == [b, a]:
        ha, hb = emu.host(a, 0), emu.host(b, 0)
        return "hosts", ha, ha.ip, hb, hb.ip
    ga, gb = emu.gateway(a), emu.gateway(b)
    return "gateways", ga, ga.wan_ips[b], gb, gb.wan_ips[a]


def omit_for(rtt_s: float) -> int:
    """Seconds of slow start to leave out of the goodput: about 12 RTTs (a 200 ms
    path needs ~10 RTTs to open its windows to the bandwidth-delay product)."""
    return max(1, math.ceil(12 * rtt_s))


def check_links(emu: Emulation, tol: Tolerance | None = None, duration: int = 4, omit: int | None = None,
                pings: int = 20, progress: Callable[[str], None] | None = None,
                deep_dir: Path | None = None,
                loss_precision: float = packet_trains.TARGET_REL_HALF_WIDTH,
                tcp_goodput: bool = True) -> list[LinkResult]:
    """Measure every WAN link in both directions and judge it against `tol`.
    `tcp_goodput=False` leaves iperf3 out (the link is then judged without it).
    `loss_precision`: a lossy link's pooled loss must be within this fraction of its
    configured loss; the train is sized so that this is 4 standard deviations
    (`packet_trains.train_size`, `packet_trains.judge_loss`).
    `omit`: seconds of slow start not counted (default: `omit_for` the link's RTT).
    `deep_dir`: also capture each train on the WAN node and write there, per link, the
    pcapng and a delay histogram (PNG)."""
    tol = tol or Tolerance()
    say = progress or (lambda msg: None)
    results = []
    for link in emu.topology.wan:
        a, b = link.between
        kind, na, ip_a, nb, ip_b = _endpoints(emu, a, b)
        tcp = emu.topology.tcp_for(a) if kind == "hosts" else None
        tcp_b = emu.topology.tcp_for(b) if kind == "hosts" else None
        result = LinkResult(a, b, kind, link.rtt_s * 1e3, link.rate / 1e6, configured_loss=link.loss,
                            configured_jitter_ms=link.jitter * 1e3, tcp_measured=tcp_goodput,
                            loss_rel_tol=loss_precision)
        offset = emu.path_offsets.get(link.name)
        result.path_offset_ms = None if offset is None else offset.offset_s * 1e3
        say(f"{link.name}: RTT {na.name} -> {nb.name} and {nb.name} -> {na.name}")
        rtt_samples = measure_rtt_both_ways(na, ip_a, nb, ip_b, count=pings)
        for (src, dst, ip_dst, settings), samples in zip(((na, nb, ip_b, tcp), (nb, na, ip_a, tcp_b)), rtt_samples,
                                                           strict=True):
            d = Direction(src.name, dst.name)
            if samples:
                d.rtt_ms_median = statistics.median(samples) * 1e3
                d.rtt_ms_mean = statistics.fmean(samples) * 1e3
                d.rtt_samples = len(samples)
            d.streams = streams_for(link.rate, link.rtt_s, settings)
            if tcp_goodput:
                skip = omit if omit is not None else omit_for(link.rtt_s)
                say(f"{link.name}: goodput {src.name} -> {dst.name}, {d.streams} streams, {duration + skip} s")
                before = emu.delay_line_stats().get(link.name)
                got = measure_goodput(src, dst, ip_dst, d.streams, duration, skip)
                used = relay_cpu(before, emu.delay_line_stats().get(link.name))
                if used is not None:
                    d.relay_cpu_s, d.relay_cpu_s_per_gbit = used
                d.goodput_mbps = None if got.bps is None else got.bps / 1e6
                d.retransmits = got.retransmits
                d.error = got.error
            if link.loss > 0:
                cc = (settings or emu.topology.tcp_for(a)).congestion_control
                d.expected_goodput_mbps = packet_trains.expected_tcp_goodput(
                    link.rate, link.rtt_s, link.loss, d.streams, cc) / 1e6
            result.directions.append(d)
        _packet_checks(emu, link, result, na, ip_a, nb, ip_b, emu.temp_dir("linkcheck"), deep_dir, say,
                       loss_precision)
        result.judge(tol)
        results.append(result)
    return results


def _start_capture(emu: Emulation, a: str, b: str, out: Path) -> subprocess.Popen[str]:
    wan = emu.wan_node(a, b)
    written = emu.temp_dir("capture") / out.name if wan.remote else out  # on another server: fetched at the stop
    proc = wan.popen(_probe_argv("capture", "--port", str(PROBE_PORT), "--out", str(written),
                                 *(arg for intf in wan.intfs for arg in ("--intf", intf))),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc._tb_capture = (wan, out)  # type: ignore[attr-defined]
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        _out, err = proc.communicate()
        raise RuntimeError(f"the capture on {wan.name} did not start: {err.strip()[-400:]}")
    return proc


def _stop_capture(proc: subprocess.Popen[str]) -> CaptureReport:
    proc.terminate()
    report = _report(proc, 120, CaptureReport, "the capture")
    wan, asked = getattr(proc, "_tb_capture", (None, None))
    if wan is not None and wan.remote:  # written on the WAN node's server: copied to where it was asked for
        wan.fetch(report.pcap, asked.parent).replace(asked)
        report = report.model_copy(update={"pcap": str(asked)})
    return report


def _packet_checks(emu: Emulation, link: WanLink, result: LinkResult, na: NodeHandle, ip_a: str, nb: NodeHandle,
                   ip_b: str, folder: Path, deep_dir: Path | None, say: Callable[[str], None],
                   loss_precision: float = packet_trains.TARGET_REL_HALF_WIDTH) -> None:
    """The UDP train (loss, delay, order, precise RTT) and the rate blast of one link;
    with `deep_dir`, the train captured on the WAN node too."""
    a, b = link.between
    count = packet_trains.train_size(link.loss, loss_precision)
    pps = packet_trains.train_pps(count)
    linger = 2 * (link.delay + link.jitter) + 1.0
    capture = None
    if deep_dir is not None:
        result.pcap = str(deep_dir / f"{link.name}.pcapng")
        say(f"{link.name}: capturing on {emu.wan_node(a, b).name}")
        capture = _start_capture(emu, a, b, Path(result.pcap))
    say(f"{link.name}: UDP train both ways, {count} datagrams at {pps:g}/s")
    before = emu.delay_line_stats().get(link.name)
    try:
        rep_a, rep_b = measure_trains(na, ip_a, nb, ip_b, count, pps, linger, folder)
    finally:
        cap = _stop_capture(capture) if capture is not None else None
    after = emu.delay_line_stats().get(link.name)
    if before is not None and after is not None:
        result.relay = relay_drops(before, after)
    delay_s, jitter_s = link.delay, link.jitter
    keep_order = emu.delay_backend != "netem"  # netem's jitter reorders (tfifo sorts by send time)
    offset_s = (result.path_offset_ms or 0.0) / 1e3
    for d, receiver, sender in ((result.directions[0], rep_b, rep_a), (result.directions[1], rep_a, rep_b)):
        records = packet_trains.read_records(Path(receiver.records))
        d.train = packet_trains.analyse(d.src, d.dst, records, sender.sent, delay_s, jitter_s, pps,
                                     keep_order=keep_order, offset_s=offset_s)
    if cap is not None and deep_dir is not None:
        result.capture_drops = cap.drops
        say(f"{link.name}: reading {cap.packets} captured datagrams")
        seen = pcapcheck.read_capture(Path(cap.pcap))
        towards_b, towards_a = _egress_towards(emu, a, b), _egress_towards(emu, b, a)
        panels = []
        for d, src_ip, (into, out_of), records_of in (
                (result.directions[0], ip_a, (towards_a, towards_b), rep_b),
                (result.directions[1], ip_b, (towards_b, towards_a), rep_a)):
            d.node = pcapcheck.node_pass(seen, src_ip, into, out_of)
            rec = packet_trains.read_records(Path(records_of.records))
            e2e = (rec["rx"].astype(np.int64) - rec["sent"].astype(np.int64)) / 1e9
            sent = np.sort(rec["sent"].astype(np.int64))
            model = packet_trains.fifo_model_delays((sent - (sent[0] if sent.size else 0)) / 1e9, delay_s, jitter_s,
                                                 keep_order=keep_order)
            panels.append((f"{d.src} -> {d.dst}", e2e, d.node.delays_s, model))
        result.histogram = str(deep_dir / f"{link.name}-delay.png")
        pcapcheck.histogram_png(Path(result.histogram),
                                f"{link.name}: delay {link.delay * 1e3:g} ms, jitter {link.jitter * 1e3:g} ms, "
                                f"loss {link.loss * 100:g}%", panels, delay_s, jitter_s)
    t_ab, t_ba = result.directions[0].train, result.directions[1].train
    if t_ab is not None and t_ba is not None and t_ab.received and t_ba.received:
        result.train_rtt_ms = t_ab.delay_ms["p50"] + t_ba.delay_ms["p50"]
        result.expected_rtt_ms = t_ab.model_ms["p50"] + t_ba.model_ms["p50"]
    for d, src, dst_ip, towards in ((result.directions[0], na, ip_b, b), (result.directions[1], nb, ip_a, a)):
        say(f"{link.name}: UDP blast {d.src} -> {d.dst} at {BLAST_OVERLOAD:g}x the rate, {BLAST_S:g} s")
        rates = measure_rate(emu, a, b, src, dst_ip, link.rate)
        got = rates.get(_egress_towards(emu, a, b) if towards == b else _egress_towards(emu, b, a))
        d.rate_mbps = None if got is None else got / 1e6
