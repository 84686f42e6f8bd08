"""Measure every WAN link of a running emulation and compare it with the topology.

For each link, in both directions: RTT with `ping` (a short warm-up first, so ARP
and first-packet effects do not count, then 20 pings 50 ms apart: median and mean)
and goodput with iperf3 through its Python wrapper, with enough parallel streams
that the per-flow window limit of the hosts' TCP settings does not hide the link
rate. The wrapper runs libiperf in-process, so the client and server run as
`python -m testbed.emulation.linkcheck iperf-client|iperf-server` processes inside the nodes.

Endpoints: the first host of each DC when the link is the lowest-latency route
between its two DCs (the normal case); otherwise traffic between those hosts would
take another path, so the two gateways measure the link directly over its /30.

Tolerance (issue #2): RTT within max(1 ms, 3%) of the configured RTT, goodput at
least 90% of the configured rate.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation
    from testbed.emulation.nodes import NodeHandle
    from testbed_core.topology import TcpSettings

IPERF_PORT = 5201
PING_RE = re.compile(r"time[=<]([0-9.]+) ms")


@dataclass(frozen=True)
class Tolerance:
    rtt_abs_s: float = 0.001
    rtt_rel: float = 0.03
    goodput_frac: float = 0.90

    def rtt_ok(self, configured_s: float, measured_s: float | None) -> bool:
        if measured_s is None or math.isnan(measured_s):
            return False
        return abs(measured_s - configured_s) <= max(self.rtt_abs_s, self.rtt_rel * configured_s)

    def goodput_ok(self, configured_bps: float, measured_bps: float | None) -> bool:
        return measured_bps is not None and measured_bps >= self.goodput_frac * configured_bps


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


@dataclass
class Direction:
    src: str
    dst: str
    rtt_ms_median: float | None = None
    rtt_ms_mean: float | None = None
    rtt_samples: int = 0
    goodput_mbps: float | None = None
    streams: int = 0
    retransmits: int | None = None
    error: str | None = None


@dataclass
class LinkResult:
    a: str
    b: str
    endpoints: str  # "hosts" or "gateways"
    configured_rtt_ms: float
    configured_mbps: float
    directions: list[Direction] = field(default_factory=list)
    rtt_ok: bool = False
    goodput_ok: bool = False

    @property
    def ok(self) -> bool:
        return self.rtt_ok and self.goodput_ok

    @property
    def measured_rtt_ms(self) -> float | None:
        """The direction furthest from the configured RTT."""
        values = [d.rtt_ms_median for d in self.directions if d.rtt_ms_median is not None]
        if not values:
            return None
        return max(values, key=lambda v: abs(v - self.configured_rtt_ms))

    @property
    def measured_mbps(self) -> float | None:
        """The slower direction."""
        values = [d.goodput_mbps for d in self.directions]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)

    def judge(self, tol: Tolerance) -> None:
        rtts = [d.rtt_ms_median for d in self.directions]
        rates = [d.goodput_mbps for d in self.directions]
        self.rtt_ok = bool(rtts) and all(
            tol.rtt_ok(self.configured_rtt_ms / 1e3, None if r is None else r / 1e3) for r in rtts)
        self.goodput_ok = bool(rates) and all(
            tol.goodput_ok(self.configured_mbps * 1e6, None if r is None else r * 1e6) for r in rates)

    def as_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "rtt_ms": {"configured": round(self.configured_rtt_ms, 3),
                       "measured": _round(self.measured_rtt_ms, 3)},
            "goodput_mbps": {"configured": round(self.configured_mbps, 3),
                             "measured": _round(self.measured_mbps, 1)},
            "ok": self.ok,
            "rtt_ok": self.rtt_ok,
            "goodput_ok": self.goodput_ok,
            "endpoints": self.endpoints,
            "directions": [asdict(d) for d in self.directions],
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- measurements


def measure_rtt(src: NodeHandle, dst_ip: str, count: int = 20, interval: float = 0.05,
                warmup: int = 3) -> list[float]:
    """RTT samples (seconds) from `src` to `dst_ip` after a warm-up."""
    src.run(["ping", "-n", "-c", str(warmup), "-i", "0.2", "-W", "2", dst_ip], timeout=warmup * 2.5 + 5)
    wait = max(2, math.ceil(10 * interval))
    out = src.run(["ping", "-n", "-c", str(count), "-i", f"{interval:g}", "-W", str(wait), dst_ip],
                  timeout=count * interval + wait + 10)
    return parse_ping(out.stdout)


@dataclass
class IperfResult:
    bps: float | None
    retransmits: int | None = None
    error: str | None = None


def measure_goodput(src: NodeHandle, dst: NodeHandle, dst_ip: str, streams: int,
                    duration: int = 4, omit: int = 1, port: int = IPERF_PORT) -> IperfResult:
    """Goodput from `src` to `dst` (listening on `dst_ip`) with `streams` TCP streams."""
    py = sys.executable
    server = dst.popen([py, "-m", "testbed.emulation.linkcheck", "iperf-server", "--bind", dst_ip, "--port", str(port)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        out = src.run([py, "-m", "testbed.emulation.linkcheck", "iperf-client", "--server", dst_ip, "--port", str(port),
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
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return IperfResult(None, error=(out.stderr.strip() or f"iperf client exited {out.returncode}")[-300:])
    data = json.loads(lines[-1])
    return IperfResult(data.get("bps"), data.get("retransmits"), data.get("error"))


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
                pings: int = 20, progress: Callable[[str], None] | None = None) -> list[LinkResult]:
    """Measure every WAN link in both directions and judge it against `tol`.
    `omit`: seconds of slow start not counted (default: `omit_for` the link's RTT)."""
    tol = tol or Tolerance()
    say = progress or (lambda msg: None)
    results = []
    for link in emu.topology.wan:
        a, b = link.between
        kind, na, ip_a, nb, ip_b = _endpoints(emu, a, b)
        tcp = emu.topology.tcp_for(a) if kind == "hosts" else None
        tcp_b = emu.topology.tcp_for(b) if kind == "hosts" else None
        result = LinkResult(a, b, kind, link.rtt_s * 1e3, link.rate / 1e6)
        for src, dst, ip_dst, settings in ((na, nb, ip_b, tcp), (nb, na, ip_a, tcp_b)):
            d = Direction(src.name, dst.name)
            say(f"{link.name}: RTT {src.name} -> {dst.name}")
            samples = measure_rtt(src, ip_dst, count=pings)
            if samples:
                d.rtt_ms_median = statistics.median(samples) * 1e3
                d.rtt_ms_mean = statistics.fmean(samples) * 1e3
                d.rtt_samples = len(samples)
            d.streams = streams_for(link.rate, link.rtt_s, settings)
            skip = omit if omit is not None else omit_for(link.rtt_s)
            say(f"{link.name}: goodput {src.name} -> {dst.name}, {d.streams} streams, {duration + skip} s")
            got = measure_goodput(src, dst, ip_dst, d.streams, duration, skip)
            d.goodput_mbps = None if got.bps is None else got.bps / 1e6
            d.retransmits = got.retransmits
            d.error = got.error
            result.directions.append(d)
        result.judge(tol)
        results.append(result)
    return results


@dataclass(frozen=True)
class StreamComparison:
    few_streams: int
    many_streams: int
    few_mbps: float
    many_mbps: float

    @property
    def ratio(self) -> float:
        return self.many_mbps / self.few_mbps if self.few_mbps > 0 else math.inf


def compare_streams(emu: Emulation, a: str, b: str, few: int = 1, many: int = 8, duration: int = 4,
                    omit: int = 1) -> StreamComparison:
    """Goodput of `few` vs `many` parallel TCP streams from DC a's first host to DC b's:
    with window-limited flows, many streams get proportionally more."""
    src, dst = emu.host(a, 0), emu.host(b, 0)
    got = {}
    for n in (few, many):
        res = measure_goodput(src, dst, dst.ip, n, duration, omit)
        if res.bps is None:
            raise RuntimeError(f"iperf3 with {n} streams {src.name} -> {dst.name} failed: {res.error}")
        got[n] = res.bps / 1e6
    return StreamComparison(few, many, got[few], got[many])


# --------------------------------------------------------------------------- in-node iperf3 entry points


def _grow_pipe(obj: Any) -> None:
    """The wrapper captures libiperf's JSON through a pipe it reads only at the end;
    a large result (many streams) would block on a default 64 KiB pipe."""
    import fcntl

    try:
        fcntl.fcntl(obj._pipe_in, 1031, 1 << 20)  # F_SETPIPE_SZ
    except (OSError, AttributeError):
        pass


def _server_main(bind: str, port: int) -> int:
    import iperf3

    server = iperf3.Server()
    _grow_pipe(server)
    server.bind_address = bind
    server.port = port
    server.verbose = False
    result = server.run()
    return 0 if result is not None and not getattr(result, "error", None) else 1


def _client_main(server_ip: str, port: int, streams: int, duration: int, omit: int,
                 connect_timeout: float = 10.0) -> int:
    import iperf3

    deadline = time.monotonic() + connect_timeout
    while True:
        client = iperf3.Client()
        _grow_pipe(client)
        client.server_hostname = server_ip
        client.port = port
        client.num_streams = streams
        client.duration = duration
        client.omit = omit
        client.verbose = False
        result = client.run()
        error = result.error
        if error and "connect" in error.lower() and time.monotonic() < deadline:
            del client
            time.sleep(0.1)  # the server is not listening yet
            continue
        break
    if error:
        print(json.dumps({"bps": None, "error": error}))
        return 1
    print(json.dumps({"bps": result.received_bps, "sent_bps": result.sent_bps,
                      "retransmits": result.retransmits, "streams": streams}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.emulation.linkcheck",
                                     description="iperf3 (Python wrapper) endpoints run inside emulated nodes")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("iperf-server")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, default=IPERF_PORT)
    c = sub.add_parser("iperf-client")
    c.add_argument("--server", required=True)
    c.add_argument("--port", type=int, default=IPERF_PORT)
    c.add_argument("--streams", type=int, default=8)
    c.add_argument("--duration", type=int, default=4)
    c.add_argument("--omit", type=int, default=1)
    ns = parser.parse_args(argv)
    if ns.role == "iperf-server":
        return _server_main(ns.bind, ns.port)
    return _client_main(ns.server, ns.port, ns.streams, ns.duration, ns.omit)


if __name__ == "__main__":
    sys.exit(main())
