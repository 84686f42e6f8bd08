"""Topology files: datacenters, the WAN links between them, per-host TCP settings.

A file is validated in full when it is loaded, so a typo is reported before any
namespace exists. Errors name the file, the field (as a dotted path) and what is
allowed. The format: docs/topologies.md, every field in docs/reference/formats/topology.md.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from testbed_core.configfile import (
    MAX_TRACE_BYTES,
    ConfigError,
    ConfigModel,
    format_validation_error,
    read_text,
    read_yaml,
)
from testbed_core.constants import RMEM_FRACTION, TOPOLOGIES_DIR
from testbed_core.servers import ServerPlan
from testbed_core.shaper import ETH_FRAME
from testbed_core.units import (
    UnitError,
    format_rate,
    format_size,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
    unit_validator,
)

# Bounds of a topology's values: physically sensible, and within every limit the
# emulation would otherwise hit only once it is built (tests/unit/core/test_hostile_topology.py
# checks that the builder's own limits still match these).
MIN_RATE_BPS = 1e3  # 1 kbit/s; tc itself takes 8 bit/s and up
MAX_RATE_BPS = 10e12  # 10 Tbit/s: above NVLink-class links inside a DC (HTB takes 64-bit rates)
MAX_DELAY_S = 10.0  # one way; geostationary satellite paths are ~0.3 s, netem stops at ~274 s
MAX_CHANGE_AT_S = 86_400.0  # a link change at most a day into the run
MAX_CHANGES = 10_000  # rate/delay steps of one link (each is a tc or delay-line command)
MAX_DOWN_S = 3_600.0  # a link taken down on purpose stays down at most an hour (a fault, not a topology)
QUEUE_MIN_BYTES = ETH_FRAME  # one full Ethernet frame
QUEUE_MAX_BYTES = 2**31 - 1  # bfifo's limit is a signed 32-bit byte count
MAX_IN_FLIGHT_BYTES = 256 * 2**20  # the delay line's queue (its --max-queue default): rate x (delay + jitter)
TCP_BUFFER_MIN = 4096  # the hosts' tcp_rmem/tcp_wmem minimum (testbed/emulation/nodes.py)
TCP_BUFFER_MAX = 2**31 - 1  # the kernel's int sysctl
MAX_HOSTS_PER_DC = 64  # testbed/emulation/naming.py: host names and the DC's /24
MAX_EMULATED_DCS = 36  # testbed/emulation/naming.py: one base-36 digit per DC in interface names
MAX_DCS = 1000  # DCs given as GPU counts (prediction only)
TRACE_BIN_MIN_S = 0.001  # trace timestamps are milliseconds
TRACE_BIN_MAX_S = 10.0  # one 1500-byte packet per bin stays above MIN_RATE_BPS


class TopologyError(ConfigError):
    """A topology file that cannot be used, with the place and the fix in its message."""


def _within(low: float, high: float, fmt: Callable[[float], str], what: str, why: str) -> AfterValidator:
    def check(value: float) -> float:
        if not low <= value <= high:
            raise ValueError(f"{what} {fmt(value)} is out of range: allowed {fmt(low)} to {fmt(high)} ({why})")
        return value

    return AfterValidator(check)


def _bytes(value: float) -> str:
    return f"{int(value)}B" if value < 10 * 1024 else format_size(value)


def _seconds(value: float) -> str:
    return f"{value * 1e3:g}ms" if 0 < value < 1 else f"{value:g}s"


Rate = Annotated[float, unit_validator(parse_rate), Field(gt=0, description="bits per second"),
                 _within(MIN_RATE_BPS, MAX_RATE_BPS, format_rate, "rate", "bits per second; 10Tbit is above any "
                         "single link")]
Duration = Annotated[float, unit_validator(parse_duration), Field(ge=0, description="seconds")]
Delay = Annotated[Duration, _within(0, MAX_DELAY_S, _seconds, "delay", "one way; satellite paths are ~300ms")]
Size = Annotated[int, unit_validator(parse_size), Field(gt=0, description="bytes")]
TcpBuffer = Annotated[Size, _within(TCP_BUFFER_MIN, TCP_BUFFER_MAX, _bytes, "buffer",
                                    "tcp_rmem/tcp_wmem take 4096 bytes to the kernel's int limit")]
QUEUE_WHY = "at least one full frame; bfifo counts bytes in a signed 32-bit field"
Queue = Annotated[Size, _within(QUEUE_MIN_BYTES, QUEUE_MAX_BYTES, _bytes, "queue", QUEUE_WHY)]
Fraction = Annotated[float, unit_validator(parse_fraction), Field(ge=0, le=1)]

CongestionControl = Literal["cubic", "bbr", "reno", "htcp", "vegas", "dctcp"]
DC_NAME = r"^[a-z][a-z0-9]{0,7}$"


class _Model(ConfigModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TcpSettings(_Model):
    """Per-host TCP settings, applied inside each host's own namespace."""

    # TCP congestion control algorithm set in each host's namespace
    # (net.ipv4.tcp_congestion_control); the kernel must have it (testbed/emulation/congestion.py)
    congestion_control: CongestionControl = "cubic"
    # Maxima of net.ipv4.tcp_rmem / tcp_wmem: they cap one flow's window, hence its
    # rate to window/RTT, as per-flow limits do on real WAN paths.
    rmem_max: TcpBuffer = 6 * 2**20
    wmem_max: TcpBuffer = 4 * 2**20
    # net.ipv4.tcp_slow_start_after_idle (Linux default: on). On, a connection idle for
    # an RTO restarts from the initial window and slow-starts up to its ssthresh: after
    # one loss every tensor sent after a pipeline bubble ramps up slowly. Long-lived
    # bulk WAN connections often turn it off.
    slow_start_after_idle: bool = True

    def window_limited_rate(self, rtt_s: float) -> float:
        """Upper bound on one TCP flow's goodput over `rtt_s`, bits/s: the window the
        receiver advertises at most (RMEM_FRACTION of its tcp_rmem) per round trip."""
        if rtt_s <= 0:
            return float("inf")
        return min(self.rmem_max * RMEM_FRACTION, self.wmem_max) * 8 / rtt_s


MAX_DC_GPUS = 10_000_000


class Datacenter(_Model):
    name: str = Field(pattern=DC_NAME, description="short lowercase name, used in host and interface names")
    # Either hosts (emulated, one per emulated worker) or gpus (a DC's size for prediction
    # at paper scale: `testbed whatif`, `testbed plan`; such a DC cannot be emulated).
    hosts: list[str] = []
    gpus: int | None = Field(None, ge=1, le=MAX_DC_GPUS, description="DC size in GPUs, instead of hosts")
    lan_rate: Rate = 10e9
    # TCP settings for this DC's hosts instead of the topology's top-level `tcp` (null: those)
    tcp: TcpSettings | None = None

    @model_validator(mode="after")
    def _hosts_or_gpus(self) -> Datacenter:
        if self.gpus is not None and self.hosts:
            raise ValueError(
                f"DC {self.name}: give either hosts (an emulated DC) or gpus (a DC size for prediction only), not both"
            )
        if self.gpus is None and not self.hosts:
            raise ValueError(f"DC {self.name}: give hosts (a count or names, to emulate it) or gpus (its size, "
                             "for prediction only)")
        return self

    def gpu_count(self, gpus_per_host: int = 1) -> int:
        """GPUs of the DC: its `gpus`, or hosts x gpus_per_host."""
        return self.gpus if self.gpus is not None else len(self.hosts) * gpus_per_host

    @field_validator("hosts", mode="before")
    @classmethod
    def _expand_count(cls, value: Any) -> Any:
        if isinstance(value, (bool, str, float)) or value is None:
            raise ValueError(f"hosts must be a count (e.g. 2) or a list of host names, got {value!r}")
        if isinstance(value, int):
            if value < 1 or value > MAX_HOSTS_PER_DC:
                raise ValueError(f"hosts must be between 1 and {MAX_HOSTS_PER_DC}, got {value}")
            return [f"h{i}" for i in range(1, value + 1)]
        if isinstance(value, list) and len(value) > MAX_HOSTS_PER_DC:
            raise ValueError(f"at most {MAX_HOSTS_PER_DC} hosts per DC (the emulation's naming and the DC's "
                             f"/24), got {len(value)}")
        return value

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        import re

        for name in value:
            if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
                raise ValueError(
                    f"host name {name!r} must be 1-6 lowercase letters/digits starting with a letter"
                )
        if len(set(value)) != len(value):
            raise ValueError("host names must be unique within a DC")
        return value


class LinkChange(_Model):
    """A step change of a WAN link at `at` seconds after the topology is up.

    ``down: true`` cuts the link (every frame dropped both ways: an outage on purpose)
    until ``duration`` has passed or a later change says ``down: false``."""

    at: Annotated[Duration, _within(0, MAX_CHANGE_AT_S, _seconds, "change time", "at most a day into the run")]
    rate: Rate | None = None  # the link's new rate, bits per second (null: unchanged)
    delay: Delay | None = None  # the link's new one-way delay, seconds (null: unchanged)
    jitter: Delay | None = None  # the link's new jitter, seconds, at most its delay (null: unchanged)
    loss: Fraction | None = None  # the link's new random loss per packet, 0 to 1 (null: unchanged)
    # true cuts the link (every frame dropped both ways), false restores a cut link (null: unchanged)
    down: bool | None = None
    # with down: true, how long the link stays cut, seconds; then it is restored (null: until a later down: false)
    duration: Annotated[Duration, _within(0.001, MAX_DOWN_S, _seconds, "down duration",
                                          "an outage on purpose lasts 1ms to an hour")] | None = None

    @field_validator("down", mode="before")
    @classmethod
    def _yes_no(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        raise ValueError(f"down is true (cut the link) or false (restore it), got {value!r}")

    @model_validator(mode="after")
    def _duration_needs_down(self) -> LinkChange:
        if self.duration is not None and self.down is not True:
            raise ValueError("duration is how long a link stays down: it goes with down: true "
                             "(or restore the link with a later change saying down: false)")
        return self

    def steps(self) -> list[LinkChange]:
        """This change as the steps the emulation applies: a ``down: true`` with a
        ``duration`` becomes the cut and, `duration` later, ``down: false``."""
        if self.duration is None:
            return [self]
        return [self.model_copy(update={"duration": None}), LinkChange(at=self.at + self.duration, down=False)]


class WanLink(_Model):
    between: tuple[str, str]  # the two DCs the link joins (names from `dcs`), different
    rate: Rate
    delay: Delay = Field(description="one-way delay; RTT is twice this")
    jitter: Delay = 0.0
    # random loss per packet (per segment of a GSO super-packet), each way: a fraction (0.001) or a percentage (0.1%)
    loss: Fraction = 0.0
    # Bytes of queue at the bottleneck; default one bandwidth-delay product.
    queue: Queue | Literal["auto"] = "auto"
    # step changes of the link's rate, delay, jitter, loss or state over the run, in increasing `at` order
    changes: list[LinkChange] = Field([], max_length=MAX_CHANGES)
    # A Mahimahi-style trace (one line per 1500-byte delivery opportunity, in ms),
    # relative to the topology file; turned into rate changes.
    trace: str | None = None
    trace_bin: Annotated[Duration, _within(TRACE_BIN_MIN_S, TRACE_BIN_MAX_S, _seconds, "trace_bin",
                                           "trace timestamps are milliseconds")] = 0.1

    @field_validator("queue", mode="before")
    @classmethod
    def _queue(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if value is None or isinstance(value, (bool, list, dict)):
            raise ValueError(f"queue must be 'auto' (one bandwidth-delay product) or a size in bytes like 4MB, "
                             f"got {value!r}")
        try:
            size = parse_size(value)
        except UnitError as exc:
            raise ValueError(f"queue must be 'auto' or a size: {exc}") from None
        if not QUEUE_MIN_BYTES <= size <= QUEUE_MAX_BYTES:
            raise ValueError(f"queue {_bytes(size)} is out of range: allowed "
                             f"{_bytes(QUEUE_MIN_BYTES)} to {_bytes(QUEUE_MAX_BYTES)} ({QUEUE_WHY})")
        return size

    @model_validator(mode="after")
    def _physical(self) -> WanLink:
        """Jitter within delay in every state of the link (its start and after each change)."""
        for where, _, delay, jitter in self._states():
            if jitter > delay:
                raise ValueError(f"{where}jitter ({_seconds(jitter)}) must not exceed delay ({_seconds(delay)}): "
                                 "the delay varies uniformly by +-jitter around delay")
        return self

    def _states(self) -> list[tuple[str, float, float, float]]:
        """(where, rate, delay, jitter) at the start and after each change."""
        rate, delay, jitter = self.rate, self.delay, self.jitter
        states = [("", rate, delay, jitter)]
        for i, change in enumerate(self.changes):
            rate = change.rate if change.rate is not None else rate
            delay = change.delay if change.delay is not None else delay
            jitter = change.jitter if change.jitter is not None else jitter
            states.append((f"changes.{i}: ", rate, delay, jitter))
        return states

    def emulation_problem(self) -> str | None:
        """Why the emulation could not carry this link (None when it can): the bytes in
        flight one way must fit the delay line's queue in every state. Checked for
        topologies that are emulated (with hosts), not for prediction-only ones."""
        for where, rate, delay, jitter in self._states():
            in_flight = rate * (delay + jitter) / 8
            if in_flight > MAX_IN_FLIGHT_BYTES:
                return (f"{where}rate x (delay + jitter) is {format_size(in_flight)} in flight one way, above the "
                        f"{format_size(MAX_IN_FLIGHT_BYTES)} the delay line can hold: lower the rate or the delay "
                        "(DCs given as GPU counts, for predictions only, have no such limit)")
        return None

    @field_validator("between")
    @classmethod
    def _distinct(cls, value: tuple[str, str]) -> tuple[str, str]:
        if value[0] == value[1]:
            raise ValueError(f"a WAN link joins two different DCs, got {value[0]!r} twice")
        return value

    @field_validator("changes")
    @classmethod
    def _ordered(cls, value: list[LinkChange]) -> list[LinkChange]:
        times = [c.at for c in value]
        if times != sorted(times):
            raise ValueError("changes must be listed in increasing 'at' order")
        down_until: tuple[int, float] | None = None  # (the change that cut the link, when it comes back)
        for i, change in enumerate(value):
            if down_until is not None and change.at >= down_until[1]:
                down_until = None
            if change.down is True:
                if down_until is not None:
                    raise ValueError(f"changes.{i}: the link is already down (since changes.{down_until[0]}): "
                                     "restore it first (down: false, or a duration that ends before this change)")
                down_until = (i, change.at + change.duration if change.duration is not None else float("inf"))
            elif change.down is False:
                if down_until is None:
                    raise ValueError(f"changes.{i}: down: false restores a link, but the link is not down at "
                                     f"{_seconds(change.at)} (take it down first with down: true)")
                down_until = None
        return value

    def steps(self) -> list[LinkChange]:
        """Every change as the emulation applies it, in time order (a down with a
        duration is followed by its restore)."""
        out = [step for change in self.changes for step in change.steps()]
        return sorted(out, key=lambda c: c.at)

    @property
    def rtt_s(self) -> float:
        return 2 * self.delay

    @property
    def queue_bytes(self) -> int:
        if self.queue != "auto":
            return int(self.queue)
        return bdp_bytes(self.rate, self.rtt_s + 2 * self.jitter)

    @property
    def name(self) -> str:
        return f"{self.between[0]}-{self.between[1]}"


def bdp_bytes(rate_bps: float, rtt_s: float, floor: int = 64 * 1024) -> int:
    """One bandwidth-delay product in bytes, never below a few GSO super-packets."""
    return max(floor, int(rate_bps * rtt_s / 8))


class Addressing(_Model):
    """Where the emulated networks live. Only the toolkit's own namespaces use them."""

    # IPv4 network (/16 or larger) the DC LANs are cut from: DC i (from 0) gets the /24 at lan_base + (i+1)*256
    lan_base: str = "10.200.0.0/16"
    # IPv4 network (/16 or larger, disjoint from lan_base) the WAN links are cut from: link k gets the /30 at
    # wan_base + 4k
    wan_base: str = "10.201.0.0/16"

    @field_validator("lan_base", "wan_base")
    @classmethod
    def _net(cls, value: str) -> str:
        try:
            net = ipaddress.ip_network(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 network like 10.200.0.0/16 ({exc})") from None
        if net.version != 4 or net.prefixlen > 16:
            raise ValueError(f"{value!r} must be an IPv4 network of /16 or larger")
        return value

    @model_validator(mode="after")
    def _disjoint(self) -> Addressing:
        if ipaddress.ip_network(self.lan_base).overlaps(ipaddress.ip_network(self.wan_base)):
            raise ValueError(f"lan_base {self.lan_base} and wan_base {self.wan_base} overlap: choose disjoint networks")
        return self


class Topology(_Model):
    name: str  # the topology's name: shown by `testbed topo show`; names a `testbed topo up --detach` emulation unless --name does
    description: str = ""  # free text: what the topology models (shown by `testbed topo show`)
    source: str = ""  # free text: where its figures come from (a measurement, a paper), shown by `testbed topo show`
    tcp: TcpSettings = TcpSettings()  # TCP settings of every host, unless its DC gives its own `tcp`
    # the datacenters: each with emulated hosts, or a GPU count for predictions only
    dcs: list[Datacenter] = Field(min_length=1, max_length=MAX_DCS)
    # the WAN links between DCs (at most one per pair); every DC must be reachable; traffic takes the
    # lowest-delay path
    wan: list[WanLink] = Field([], max_length=MAX_DCS * (MAX_DCS - 1) // 2)
    addressing: Addressing = Addressing()  # the IPv4 networks the emulation numbers its LANs and WAN links from
    # Optional: which server emulates which DC (testbed_core/servers.py); None = this machine.
    servers: ServerPlan | None = None

    @model_validator(mode="after")
    def _references(self) -> Topology:
        names = [dc.name for dc in self.dcs]
        if self.servers is not None:
            problem = self.servers.placement_problem(names)
            if problem:
                raise ValueError(problem)
        emulated = [dc for dc in self.dcs if dc.hosts]
        if len(emulated) > MAX_EMULATED_DCS:
            raise ValueError(f"at most {MAX_EMULATED_DCS} DCs with hosts (the emulation's interface names give "
                             f"each DC one base-36 digit), got {len(emulated)}")
        for i, link in enumerate(self.wan if emulated else []):
            problem = link.emulation_problem()
            if problem:
                raise ValueError(f"wan.{i}: {problem}")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"DC names must be unique; repeated: {', '.join(sorted(dup))}")
        seen: set[frozenset[str]] = set()
        for i, link in enumerate(self.wan):
            for end in link.between:
                if end not in names:
                    raise ValueError(
                        f"wan.{i}.between: unknown DC {end!r} (defined DCs: {', '.join(names)})"
                    )
            key = frozenset(link.between)
            if key in seen:
                raise ValueError(f"wan.{i}: a second link between {link.between[0]} and {link.between[1]}")
            seen.add(key)
        if len(self.dcs) > 1:
            unreachable = set(names) - _reachable(names[0], self.wan)
            if unreachable:
                raise ValueError(
                    f"DCs {', '.join(sorted(unreachable))} have no WAN path to {names[0]}: add WAN links"
                )
        return self

    def require_emulable(self) -> None:
        """Raise TopologyError when a DC is given as a GPU count (no hosts to build)."""
        sized = [dc for dc in self.dcs if not dc.hosts]
        if sized:
            names = ", ".join(f"{dc.name} ({dc.gpus} GPUs)" for dc in sized)
            raise TopologyError(
                f"topology {self.name}: DCs {names} are given as GPU counts, which predictions use "
                "(testbed whatif, testbed plan) but the emulation cannot build: it runs one worker per host. "
                "Give each DC `hosts:` (at most 64) to emulate it"
            )

    def dc(self, name: str) -> Datacenter:
        for dc in self.dcs:
            if dc.name == name:
                return dc
        raise KeyError(f"no DC named {name!r} (defined: {', '.join(d.name for d in self.dcs)})")

    def tcp_for(self, dc: str) -> TcpSettings:
        return self.dc(dc).tcp or self.tcp

    def link(self, a: str, b: str) -> WanLink:
        for link in self.wan:
            if set(link.between) == {a, b}:
                return link
        raise KeyError(f"no WAN link between {a!r} and {b!r}")

    def routes(self) -> dict[tuple[str, str], list[str]]:
        """Lowest-latency DC path for every ordered DC pair (Dijkstra on one-way delay)."""
        return {(a.name, b.name): shortest_path(a.name, b.name, self.wan)
                for a in self.dcs for b in self.dcs if a.name != b.name}

    def route(self, a: str, b: str) -> list[str]:
        """The lowest-latency DC path from `a` to `b` (Dijkstra on one-way delay)."""
        return shortest_path(a, b, self.wan)

    def path_delay(self, a: str, b: str) -> float:
        path = self.route(a, b)
        return sum(self.link(x, y).delay for x, y in zip(path, path[1:], strict=False))

    def bottleneck_rate(self, a: str, b: str) -> float | None:
        """The nominal rate of the slowest WAN link on the route between DCs `a` and
        `b` (None inside one DC)."""
        if a == b:
            return None
        path = self.route(a, b)
        return min(self.link(x, y).rate for x, y in zip(path, path[1:], strict=False))


def _reachable(start: str, links: list[WanLink]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        for link in links:
            if node in link.between:
                other = link.between[1] if link.between[0] == node else link.between[0]
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
    return seen


def shortest_path(a: str, b: str, links: list[WanLink]) -> list[str]:
    import heapq

    dist = {a: 0.0}
    prev: dict[str, str] = {}
    heap = [(0.0, a)]
    while heap:
        d, node = heapq.heappop(heap)
        if node == b:
            break
        if d > dist.get(node, float("inf")):
            continue
        for link in links:
            if node in link.between:
                other = link.between[1] if link.between[0] == node else link.between[0]
                nd = d + link.delay
                if nd < dist.get(other, float("inf")) - 1e-12:
                    dist[other] = nd
                    prev[other] = node
                    heapq.heappush(heap, (nd, other))
    if b not in dist:
        raise KeyError(f"no WAN path from {a} to {b}")
    path = [b]
    while path[-1] != a:
        path.append(prev[path[-1]])
    return path[::-1]


def load_trace(path: Path, bin_s: float) -> list[LinkChange]:
    """Turn a Mahimahi trace (ms timestamps of 1500-byte delivery opportunities,
    non-decreasing) into one rate step per `bin_s`, over one period of the trace.
    The file is read through `read_text` (at most MAX_TRACE_BYTES of UTF-8 text) and
    its period may give at most MAX_CHANGES steps."""
    text = read_text(path, "link trace", TopologyError, max_bytes=MAX_TRACE_BYTES)
    bin_ms = max(1, int(round(bin_s * 1000)))
    limit_ms = MAX_CHANGES * bin_ms
    counts: dict[int, int] = {}
    last = -1
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not line.isascii() or not line.isdigit():
            raise TopologyError(
                f"{path}:{lineno}: trace lines must be whole, non-negative millisecond timestamps, "
                f"got {line[:40]!r}"
            )
        ms = int(line)
        if ms < last:
            raise TopologyError(f"{path}:{lineno}: timestamp {ms} is before the previous one ({last}); "
                                "a trace lists delivery times in order")
        if ms >= limit_ms:
            raise TopologyError(
                f"{path}:{lineno}: timestamp {ms} ms is past {limit_ms} ms: a trace may give at most "
                f"{MAX_CHANGES} rate steps of trace_bin {_seconds(bin_s)}; raise trace_bin or shorten the trace"
            )
        last = ms
        counts[ms // bin_ms] = counts.get(ms // bin_ms, 0) + 1
    if not counts:
        raise TopologyError(f"{path}: the trace is empty (no timestamp lines)")
    period_ms = max(last, 1)
    bins = (period_ms + bin_ms - 1) // bin_ms
    counts[bins - 1] = counts.get(bins - 1, 0) + sum(n for k, n in counts.items() if k >= bins)
    changes = []
    for i in range(bins):
        rate = max(counts.get(i, 0), 1) * 1500 * 8 / (bin_ms / 1000)
        if rate > MAX_RATE_BPS:
            raise TopologyError(
                f"{path}: {counts[i]} deliveries in the {bin_ms} ms from {i * bin_ms} ms make "
                f"{format_rate(rate)}, above {format_rate(MAX_RATE_BPS)}; check the trace's timestamps"
            )
        changes.append(LinkChange(at=i * bin_ms / 1000, rate=rate))
    return changes


def parse_topology(data: Any, path: str = "<topology>") -> Topology:
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: a topology file must be a YAML mapping with 'name', 'dcs' and 'wan'")
    try:
        topo = Topology.model_validate(data)
    except ValidationError as exc:
        raise TopologyError(format_validation_error(path, exc, "topology")) from None
    base = Path(path).parent
    if topo.servers is not None:  # key paths are relative to the topology file
        topo = topo.model_copy(update={"servers": topo.servers.resolved(base)})
    links = []
    for i, link in enumerate(topo.wan):
        if link.trace:
            trace = (base / link.trace) if not Path(link.trace).is_absolute() else Path(link.trace)
            try:
                changes = load_trace(trace, link.trace_bin)
            except TopologyError as exc:
                raise TopologyError(f"{path}: wan.{i}.trace: {exc}") from None
            try:
                link = WanLink.model_validate({**link.model_dump(), "changes": changes})
            except ValidationError as exc:
                raise TopologyError(format_validation_error(path, exc, "topology", prefix=f"wan.{i}")) from None
            problem = link.emulation_problem() if any(dc.hosts for dc in topo.dcs) else None
            if problem:
                raise TopologyError(f"{path}: wan.{i}: {problem}")
        links.append(link)
    return topo.model_copy(update={"wan": links})


def load_topology(path: str | Path) -> Topology:
    path = Path(path)
    shipped = sorted(p.name for p in TOPOLOGIES_DIR.glob("*.yaml"))
    hint = f" (shipped topologies: {', '.join(shipped)})" if shipped else ""
    return parse_topology(read_yaml(path, "topology", TopologyError, missing_hint=hint), str(path))
