"""Servers: where the DCs of a topology are emulated when one machine is not enough.

A `servers:` section in a topology (or a file given with ``--servers``) places each
DC on one server reached over SSH; the emulation then builds that DC's hosts and
gateway there with Mininet's cluster edition. Links inside a DC stay on its server;
a WAN link between DCs on different servers keeps its WAN link node (shaper and
delay line) on the server of its first DC, and its far leg becomes a tunnel over the
servers' own network (the underlay). Pure models and arithmetic, no I/O: the
emulation layer (testbed/emulation/cluster.py) connects, probes and builds.

    servers:
      tunnel: vxlan            # vxlan | gre (what the servers' kernels must have)
      ssh: {user: root, identity: keys/id_ed25519, known_hosts: keys/known_hosts}
      python: python3          # the servers' Python with this package (the node agent)
      configure: auto          # auto | ssh (ssh: every server over SSH, even this machine's)
      machines:
        - {name: s1, address: 192.0.2.10, dcs: [dc1]}
        - {name: s2, address: 192.0.2.11, dcs: [dc2], underlay_rate: 10Gbit}

Relative key paths are read from the folder of the file that names them.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from testbed_core.configfile import (
    ConfigError,
    ConfigModel,
    format_validation_error,
    read_yaml_mapping,
)
from testbed_core.units import format_rate

if TYPE_CHECKING:  # the topology holds a servers plan: imported for the annotations only
    from testbed_core.topology import Topology, WanLink

SERVER_NAME = r"^[a-z][a-z0-9-]{0,15}$"
SSH_USER = r"^[a-z_][a-z0-9_-]{0,31}$"
TUNNEL_OVERHEAD = {  # bytes a tunnel adds to each inner Ethernet frame (outer IPv4)
    "vxlan": 14 + 8 + 8 + 20,  # inner Ethernet + VXLAN + UDP + IPv4
    "gre": 14 + 8 + 20,  # inner Ethernet + GRE with key + IPv4 (gretap)
}
ETHERNET_MTU = 1500
MIN_INNER_MTU = 1280  # below this the emulated hosts' IPv4/TCP would differ from a real WAN path
UNDERLAY_HEADROOM = 0.9  # the WAN rates that cross the underlay may use at most this share of it


class ServersError(ConfigError):
    """A servers section or file that cannot be used; names the file and field."""


class _Model(ConfigModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SshSettings(_Model):
    """How to log in to a server: key-based, never a password (BatchMode)."""

    user: str = Field("root", pattern=SSH_USER)  # the login name on the servers
    port: int = Field(22, ge=1, le=65535)  # the servers' SSH port
    identity: str | None = None  # private key; relative to the file that names it
    known_hosts: str | None = None  # a known_hosts file holding the servers' host keys

    def resolved(self, base: Path) -> SshSettings:
        """These settings with relative key paths made absolute from `base` (the folder of
        the file that names them)."""
        update = {k: str(base / v) for k, v in (("identity", self.identity), ("known_hosts", self.known_hosts))
                  if v is not None and not Path(v).is_absolute()}
        return self.model_copy(update=update)


class Server(_Model):
    name: str = Field(pattern=SERVER_NAME, description="short lowercase name")
    address: str  # IPv4 address on the underlay (Mininet's cluster edition connects by address)
    dcs: list[str] = Field(min_length=1)  # the topology's DCs this server emulates (each DC on exactly one server)
    # The underlay's capacity towards the other servers, bit/s; measured at start when absent.
    underlay_rate: float | None = Field(None, gt=0)
    ssh: SshSettings | None = None  # overrides the section's ssh settings
    python: str | None = Field(None, min_length=1)  # overrides the section's python

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        try:
            addr = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 address (e.g. 192.0.2.10); give the server's "
                             "address on the network the servers share") from None
        if addr.version != 4 or addr.is_loopback or addr.is_unspecified:
            raise ValueError(f"{value!r}: give a routable IPv4 address of the server, not loopback or 0.0.0.0")
        return value

    @field_validator("underlay_rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        from testbed_core.units import convert_unit, parse_rate

        return convert_unit(parse_rate, value)


class ServerPlan(_Model):
    """Which server emulates which DC, the tunnel kind and the SSH login."""

    # the tunnel that carries a WAN link between DCs on different servers over the underlay
    # (VXLAN adds 50 bytes to each frame, GRE 42: the emulated hosts' MTU is the underlay's less that, at most 1500)
    tunnel: Literal["vxlan", "gre"] = "vxlan"
    ssh: SshSettings = SshSettings()  # how to log in to every server, unless a server gives its own `ssh`
    machines: list[Server] = Field(min_length=1, max_length=64)  # the servers, each with the DCs it emulates
    # How nodes are configured and programs started in them: `auto` reaches the nodes of a
    # server that shares this machine's kernel through their PIDs (setns, /proc) and those of
    # any other server over its SSH (the node agent); `ssh` takes the SSH path for every
    # server (what the tests on one machine use to exercise it).
    configure: Literal["auto", "ssh"] = "auto"
    # The Python on the servers that has this package installed (the node agent runs in it).
    python: str = Field("python3", min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> ServerPlan:
        for what, values in (("name", [s.name for s in self.machines]),
                             ("address", [s.address for s in self.machines])):
            dup = sorted({v for v in values if values.count(v) > 1})
            if dup:
                raise ValueError(f"machines: each server needs its own {what}; repeated: {', '.join(dup)}")
        placed: dict[str, str] = {}
        for i, server in enumerate(self.machines):
            for dc in server.dcs:
                if dc in placed:
                    raise ValueError(f"machines.{i}.dcs: DC {dc!r} is already placed on server "
                                     f"{placed[dc]}; a DC lives on exactly one server")
                placed[dc] = server.name
        return self

    # -- placement

    def placement_problem(self, dc_names: list[str]) -> str | None:
        """Why this plan does not fit a topology's DCs (None when it does)."""
        for i, server in enumerate(self.machines):
            for dc in server.dcs:
                if dc not in dc_names:
                    return (f"servers.machines.{i}.dcs: unknown DC {dc!r} "
                            f"(the topology's DCs: {', '.join(dc_names)})")
        placed = {dc for s in self.machines for dc in s.dcs}
        missing = [dc for dc in dc_names if dc not in placed]
        if missing:
            return (f"servers.machines: DCs {', '.join(missing)} are on no server; "
                    "list each DC under the `dcs` of one server")
        return None

    def server_of(self, dc: str) -> Server:
        for server in self.machines:
            if dc in server.dcs:
                return server
        raise KeyError(f"DC {dc!r} is on no server")

    def ssh_for(self, server: Server) -> SshSettings:
        return server.ssh or self.ssh

    def python_for(self, server: Server) -> str:
        return server.python or self.python

    def resolved(self, base: Path) -> ServerPlan:
        """The plan with relative key paths made absolute from `base` (the file's folder)."""
        return keys_resolved(self, base)


Logins = TypeVar("Logins", bound=ConfigModel)


def keys_resolved(plan: Logins, base: Path) -> Logins:
    """`plan` (a servers plan or an inventory: its own ``ssh`` and its ``machines``'
    each) with relative key paths made absolute from `base` (the file's folder)."""
    def fix(ssh: SshSettings | None) -> SshSettings | None:
        return None if ssh is None else ssh.resolved(base)

    machines = [m.model_copy(update={"ssh": fix(m.ssh)}) for m in getattr(plan, "machines")]  # noqa: B009
    return plan.model_copy(update={"ssh": fix(getattr(plan, "ssh")), "machines": machines})  # noqa: B009


# --------------------------------------------------------------------------- underlay checks


def inner_mtu(underlay_mtu: int, tunnel: str) -> int:
    """The largest IP packet an emulated interface can send through a tunnel whose
    outer packets travel over an underlay of `underlay_mtu` (capped at Ethernet's 1500)."""
    return min(ETHERNET_MTU, underlay_mtu - TUNNEL_OVERHEAD[tunnel])


def mtu_problem(server: str, device: str, underlay_mtu: int, tunnel: str) -> str | None:
    inner = inner_mtu(underlay_mtu, tunnel)
    if inner >= MIN_INNER_MTU:
        return None
    return (f"server {server}: the underlay device {device} has MTU {underlay_mtu}, which leaves {inner} "
            f"bytes inside a {tunnel} tunnel ({TUNNEL_OVERHEAD[tunnel]} bytes of headers); at least "
            f"{MIN_INNER_MTU} are needed: raise the MTU of {device} to {MIN_INNER_MTU + TUNNEL_OVERHEAD[tunnel]} "
            "or more (jumbo frames give the emulation a full 1500)")


def crossing_links(topology: Topology, plan: ServerPlan) -> list[tuple[WanLink, str, str]]:
    """(WAN link, server of its first DC, server of its second) for each WAN link whose
    DCs are on different servers: the links that become tunnels."""
    out = []
    for link in topology.wan:
        a, b = (plan.server_of(dc).name for dc in link.between)
        if a != b:
            out.append((link, a, b))
    return out


def underlay_demand(topology: Topology, plan: ServerPlan) -> dict[tuple[str, str], float]:
    """Per pair of servers (sorted names), the sum of the peak rates of the WAN links
    tunnelled between them: what the underlay must carry in each direction."""
    demand: dict[tuple[str, str], float] = {}
    for link, a, b in crossing_links(topology, plan):
        peak = max([link.rate, *(c.rate for c in link.steps() if c.rate is not None)])
        key = (min(a, b), max(a, b))
        demand[key] = demand.get(key, 0.0) + peak
    return demand


def underlay_problem(pair: tuple[str, str], demand_bps: float, capacity_bps: float, how: str) -> str | None:
    """A message when `capacity_bps` (declared or measured, `how`) cannot carry
    `demand_bps` with the headroom a shaper needs above the rate it shapes to."""
    if demand_bps <= capacity_bps * UNDERLAY_HEADROOM:
        return None
    return (f"the underlay between servers {pair[0]} and {pair[1]} carries {format_rate(capacity_bps)} ({how}), "
            f"but the WAN links tunnelled over it add up to {format_rate(demand_bps)}; at most "
            f"{UNDERLAY_HEADROOM:.0%} of the underlay can be shaped faithfully: lower those WAN rates, put "
            "their DCs on one server, or use a faster network between the servers")


# --------------------------------------------------------------------------- files


def parse_servers(data: Any, path: str, prefix: str = "") -> ServerPlan:
    """A servers section (a mapping) from `path`; errors name the file and the field."""
    if not isinstance(data, dict):
        where = f"{prefix}: " if prefix else ""
        raise ServersError(f"{path}: {where}a servers section must be a mapping with `machines:` "
                           "(a list of {name, address, dcs}) and optionally `tunnel:` and `ssh:`")
    try:
        plan = ServerPlan.model_validate(data)
    except ValidationError as exc:
        raise ServersError(format_validation_error(path, exc, "servers section", prefix=prefix)) from None
    return plan.resolved(Path(path).parent)


def load_servers(path: str | Path) -> ServerPlan:
    """A servers file (``--servers FILE``): the section's content at its top level."""
    return parse_servers(read_yaml_mapping(Path(path), "servers", ServersError), str(path))


def place_topology(topology: Topology, plan: ServerPlan, path: str) -> Topology:
    """`topology` with `plan` as its servers (``--servers FILE`` over a topology file);
    refused, naming `path`, when the plan's DCs do not match the topology's."""
    problem = plan.placement_problem([dc.name for dc in topology.dcs])
    if problem:
        raise ServersError(f"{path}: {problem.removeprefix('servers.')}")
    return topology.model_copy(update={"servers": plan})
