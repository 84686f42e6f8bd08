"""Topology files: datacenters, the WAN links between them, per-host TCP settings.

A file is validated in full when it is loaded, so a typo is reported before any
namespace exists. Errors name the file, the field (as a dotted path) and what is
allowed. See README.md ("Topology files") for the format.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from testbed_core.configfile import ConfigError, format_validation_error
from testbed_core.constants import TOPOLOGIES_DIR
from testbed_core.units import UnitError, parse_duration, parse_fraction, parse_rate, parse_size


class TopologyError(ConfigError):
    """A topology file that cannot be used, with the place and the fix in its message."""


def _unit(parser):
    def convert(value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, (str, int, float)):
            try:
                return parser(value)
            except UnitError as exc:
                raise ValueError(str(exc)) from None
        return value

    return BeforeValidator(convert)


Rate = Annotated[float, _unit(parse_rate), Field(gt=0, description="bits per second")]
Duration = Annotated[float, _unit(parse_duration), Field(ge=0, description="seconds")]
Size = Annotated[int, _unit(parse_size), Field(gt=0, description="bytes")]
Fraction = Annotated[float, _unit(parse_fraction), Field(ge=0, le=1)]

CongestionControl = Literal["cubic", "bbr", "reno", "htcp", "vegas", "dctcp"]
DC_NAME = r"^[a-z][a-z0-9]{0,7}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TcpSettings(_Model):
    """Per-host TCP settings, applied inside each host's own namespace."""

    congestion_control: CongestionControl = "cubic"
    # Maxima of net.ipv4.tcp_rmem / tcp_wmem: they cap one flow's window, hence its
    # rate to window/RTT, as per-flow limits do on real WAN paths.
    rmem_max: Size = 6 * 2**20
    wmem_max: Size = 4 * 2**20
    # net.ipv4.tcp_slow_start_after_idle (Linux default: on). On, a connection idle for
    # an RTO restarts from the initial window and slow-starts up to its ssthresh: after
    # one loss every tensor sent after a pipeline bubble ramps up slowly. Long-lived
    # bulk WAN connections often turn it off.
    slow_start_after_idle: bool = True

    def window_limited_rate(self, rtt_s: float) -> float:
        """Upper bound on one TCP flow's goodput over `rtt_s`, bits/s.

        Linux uses about half of tcp_rmem for the advertised window by default
        (tcp_adv_win_scale=1), hence the factor.
        """
        if rtt_s <= 0:
            return float("inf")
        return min(self.rmem_max / 2, self.wmem_max) * 8 / rtt_s


MAX_DC_GPUS = 10_000_000


class Datacenter(_Model):
    name: str = Field(pattern=DC_NAME, description="short lowercase name, used in host and interface names")
    # Either hosts (emulated, one per emulated worker) or gpus (a DC's size for prediction
    # at paper scale: `testbed whatif`, `testbed plan`; such a DC cannot be emulated).
    hosts: list[str] = []
    gpus: int | None = Field(None, ge=1, le=MAX_DC_GPUS, description="DC size in GPUs, instead of hosts")
    lan_rate: Rate = 10e9
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
        if isinstance(value, bool):
            raise ValueError("hosts must be a count (e.g. 2) or a list of host names")
        if isinstance(value, int):
            if value < 1 or value > 64:
                raise ValueError(f"hosts must be between 1 and 64, got {value}")
            return [f"h{i}" for i in range(1, value + 1)]
        return value

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        import re

        for name in value:
            if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
                raise ValueError(
                    f"host name {name!r} must be 1-6 lowercase letters/digits starting with a letter"
                )
        if len(set(value)) != len(value):
            raise ValueError("host names must be unique within a DC")
        return value


class LinkChange(_Model):
    """A step change of a WAN link at `at` seconds after the topology is up."""

    at: Duration
    rate: Rate | None = None
    delay: Duration | None = None
    jitter: Duration | None = None
    loss: Fraction | None = None


class WanLink(_Model):
    between: tuple[str, str]
    rate: Rate
    delay: Duration = Field(description="one-way delay; RTT is twice this")
    jitter: Duration = 0.0
    loss: Fraction = 0.0
    # Bytes of queue at the bottleneck; default one bandwidth-delay product.
    queue: Size | Literal["auto"] = "auto"
    changes: list[LinkChange] = []
    # A Mahimahi-style trace (one line per 1500-byte delivery opportunity, in ms),
    # relative to the topology file; turned into rate changes.
    trace: str | None = None
    trace_bin: Duration = 0.1

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
        return value

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

    lan_base: str = "10.200.0.0/16"
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


class Topology(_Model):
    name: str
    description: str = ""
    source: str = ""
    tcp: TcpSettings = TcpSettings()
    dcs: list[Datacenter] = Field(min_length=1)
    wan: list[WanLink] = []
    addressing: Addressing = Addressing()

    @model_validator(mode="after")
    def _references(self) -> Topology:
        names = [dc.name for dc in self.dcs]
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

    def path_delay(self, a: str, b: str) -> float:
        path = shortest_path(a, b, self.wan)
        return sum(self.link(x, y).delay for x, y in zip(path, path[1:], strict=False))


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
    """Turn a Mahimahi trace (ms timestamps of 1500-byte delivery opportunities)
    into one rate step per `bin_s`, over one period of the trace."""
    stamps: list[int] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            stamps.append(int(line))
        except ValueError:
            raise TopologyError(
                f"{path}:{lineno}: trace lines must be integer millisecond timestamps, got {line!r}"
            ) from None
    if not stamps:
        raise TopologyError(f"{path}: the trace is empty")
    period_ms = max(stamps[-1], 1)
    bin_ms = max(1, int(bin_s * 1000))
    counts = [0] * ((period_ms + bin_ms - 1) // bin_ms)
    for ms in stamps:
        counts[min(len(counts) - 1, ms // bin_ms)] += 1
    return [
        LinkChange(at=i * bin_ms / 1000, rate=max(count, 1) * 1500 * 8 / (bin_ms / 1000))
        for i, count in enumerate(counts)
    ]


def parse_topology(data: Any, path: str = "<topology>") -> Topology:
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: a topology file must be a YAML mapping with 'name', 'dcs' and 'wan'")
    try:
        topo = Topology.model_validate(data)
    except ValidationError as exc:
        raise TopologyError(format_validation_error(path, exc, "topology")) from None
    base = Path(path).parent
    links = []
    for i, link in enumerate(topo.wan):
        if link.trace:
            trace = (base / link.trace) if not Path(link.trace).is_absolute() else Path(link.trace)
            if not trace.exists():
                raise TopologyError(f"{path}: wan.{i}.trace: file {trace} does not exist")
            link = link.model_copy(update={"changes": load_trace(trace, link.trace_bin)})
        links.append(link)
    return topo.model_copy(update={"wan": links})


def load_topology(path: str | Path) -> Topology:
    path = Path(path)
    if not path.exists():
        shipped = sorted(p.name for p in TOPOLOGIES_DIR.glob("*.yaml"))
        hint = f" (shipped topologies: {', '.join(shipped)})" if shipped else ""
        raise TopologyError(f"{path}: no such topology file{hint}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML: {exc}") from None
    return parse_topology(data, str(path))
