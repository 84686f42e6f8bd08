"""How a node is configured, one code path reached two ways.

Every change the emulation makes inside a node (addresses, routes, bridges, shapers,
sysctls, receive steering, MTU, a WAN link's new rate, reading its counters) is a
typed request (`NodeRequest`, pydantic) that `apply` carries out with pyroute2 and
the node's /proc/sys and /sys, given a `NodeNs` that says where those are:

* on this machine, `NodeNs.of_pid(pid)`: a netlink socket opened in the node's
  namespace through setns on /proc/PID/ns/net, sysctls written from a thread inside
  it, /sys read through /proc/PID/root (testbed/emulation/netns.py);
* on a server reached over SSH, that server's node agent (``python -m
  testbed.emulation.remote.nodeagent serve``, one per server, started over SSH) reads the
  same requests as JSON lines on stdin, each naming the node by its PID on that
  server, and calls `apply` with `NodeNs.of_pid(pid)` there: the same setns path,
  run on the node's own machine (`NodeNs.inside()` when a request names no PID).

No shell strings: the request is validated on both sides, and the agent answers each
request with one `NodeReply` line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from pyroute2 import IPRoute

    from testbed.emulation.shaping import NetemParams

Counters = dict[str, tuple[int, int]]  # interface -> (tx bytes, tx packets), as a reply carries them

T = TypeVar("T")

OPTIONAL_SYSCTL_PREFIXES = ("net.ipv6.",)  # absent on kernels without IPv6: skipped


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NetemSpec(_Op):
    delay_s: float = Field(ge=0)
    jitter_s: float = Field(0.0, ge=0)
    loss: float = Field(0.0, ge=0, le=1)


class SysctlsOp(_Op):
    """Write namespaced sysctls (dotted keys); the reply lists the ones that failed."""

    op: Literal["sysctls"] = "sysctls"
    values: dict[str, str]


class RpsOp(_Op):
    """Receive packet steering on every interface (see nodes.enable_rps)."""

    op: Literal["rps"] = "rps"
    mask: str = Field(pattern=r"^[0-9a-f,]{1,200}$")


class MtuOp(_Op):
    """Every interface but lo at `mtu`."""

    op: Literal["mtu"] = "mtu"
    mtu: int = Field(ge=576, le=65535)


class _LanOp(_Op):
    """What a node on a DC's LAN shapes its LAN port with; `where` names it in errors."""

    lan_rate: float = Field(gt=0)
    queue_bytes: int = Field(gt=0)
    where: str = ""


class HostOp(_LanOp):
    """A host's address, default route and LAN shaper."""

    op: Literal["host"] = "host"
    intf: str
    ip: str
    gateway_ip: str


class GatewayOp(_LanOp):
    """A gateway's LAN bridge over its host ports, WAN port addresses and routes."""

    op: Literal["gateway"] = "gateway"
    bridge: str
    host_ports: list[str]
    wan_ports: list[tuple[str, str]]  # (port, address/30)
    routes: list[tuple[str, str]]  # (destination prefix, via)
    lan_ip: str


class WanOp(_Op):
    """A WAN link node's egress shapers (with a netem leaf, and a bridge, under netem)."""

    op: Literal["wan"] = "wan"
    intfs: tuple[str, str]
    rate: float = Field(gt=0)
    queue_bytes: int = Field(gt=0)
    netem: NetemSpec | None = None
    bridge: str | None = None
    where: str = ""


class ChangeOp(_Op):
    """A WAN link changed in place: the shaper's rate and/or the netem leaf."""

    op: Literal["change"] = "change"
    intfs: tuple[str, str]
    rate: float | None = Field(None, gt=0)
    netem: NetemSpec | None = None
    netem_rate: float = Field(1.0, gt=0)
    queue_bytes: int = Field(1, gt=0)


class CountersOp(_Op):
    """(tx bytes, tx packets) of some interfaces."""

    op: Literal["counters"] = "counters"
    intfs: list[str]


NodeOp = Annotated[SysctlsOp | RpsOp | MtuOp | HostOp | GatewayOp | WanOp | ChangeOp | CountersOp,
                   Field(discriminator="op")]


class NodeRequest(_Op):
    """One request to a node: the operations, applied in order."""

    ops: list[NodeOp] = Field(min_length=1)
    pid: int | None = Field(None, ge=1)  # to an agent: the node, by its PID on the agent's machine


class NodeReply(_Op):
    ok: bool
    error: str = ""  # the first operation that failed, and why
    sysctl_errors: list[str] = Field(default_factory=list)
    counters: dict[str, tuple[int, int]] = Field(default_factory=dict)


class NodeConfError(RuntimeError):
    """An operation the node refused; the message names the node and the interface."""


@dataclass(frozen=True)
class NodeNs:
    """Where a node's netlink, /proc/sys and /sys are, from the caller's point of view."""

    iproute: Callable[[], IPRoute]  # a new IPRoute in the node's namespace (caller closes it)
    run: Callable[[Callable[[], Any]], Any]  # call fn inside the namespace (for /proc/sys)
    root: Path  # the node's / (its own /sys mount)

    @classmethod
    def of_pid(cls, pid: int) -> NodeNs:
        """A node of this machine, reached through /proc/PID (setns)."""
        from testbed.emulation.netns import open_iproute, run_in_netns

        return cls(lambda: open_iproute(pid), lambda fn: run_in_netns(pid, fn), Path(f"/proc/{pid}/root"))

    @classmethod
    def inside(cls) -> NodeNs:
        """The namespace this process runs in (the node agent's)."""
        from pyroute2 import IPRoute

        return cls(lambda: IPRoute(groups=0), lambda fn: fn(), Path("/"))


# --------------------------------------------------------------------------- applying


def apply(request: NodeRequest, ns: NodeNs) -> NodeReply:
    """Carry out `request`'s operations in order; the first failure stops and is
    reported in the reply (never raised), so local and remote callers see the same."""
    from testbed.emulation.shaping import ShapingError

    errors: list[str] = []
    counters: Counters = {}
    try:
        with contextlib.ExitStack() as stack:
            ipr = None
            for op in request.ops:
                if isinstance(op, SysctlsOp):
                    errors += ns.run(lambda op=op: _write_sysctls(op.values))
                    continue
                if isinstance(op, RpsOp):
                    _rps(ns.root, op.mask)
                    continue
                if ipr is None:
                    ipr = stack.enter_context(_closing(ns.iproute()))
                _NETLINK[type(op)](ipr, op, counters)
    except (NodeConfError, ShapingError, OSError) as exc:
        return NodeReply(ok=False, error=str(exc), sysctl_errors=errors, counters=counters)
    except Exception as exc:  # netlink errors and the like: reported with their type
        return NodeReply(ok=False, error=f"{type(exc).__name__}: {exc}", sysctl_errors=errors, counters=counters)
    return NodeReply(ok=True, sysctl_errors=errors, counters=counters)


@contextlib.contextmanager
def _closing(ipr: IPRoute) -> Iterator[IPRoute]:
    try:
        yield ipr
    finally:
        ipr.close()


def _write_sysctls(values: dict[str, str]) -> list[str]:
    errors = []
    for key, value in values.items():
        path = Path("/proc/sys") / key.replace(".", "/")
        if not path.exists() and key.startswith(OPTIONAL_SYSCTL_PREFIXES):
            continue
        try:
            with open(path, "w") as fh:
                fh.write(value)
        except OSError as exc:
            errors.append(f"{key}={value}: {exc.strerror or exc}")
    return errors


def _rps(root: Path, mask: str) -> None:
    for f in (root / "sys/class/net").glob("*/queues/rx-*/rps_cpus"):
        try:
            f.write_text(mask)
        except OSError:  # kernels without CONFIG_RPS: nothing to do
            return


def _index(ipr: IPRoute, ifname: str, where: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NodeConfError(f"{where}: interface {ifname} is missing")
    return int(found[0])


def _up(ipr: IPRoute, ifname: str) -> None:
    found = ipr.link_lookup(ifname=ifname)
    if found:
        ipr.link("set", index=found[0], state="up")


def _netem(spec: NetemSpec | None) -> NetemParams | None:
    from testbed.emulation.shaping import NetemParams

    return None if spec is None else NetemParams(delay_s=spec.delay_s, jitter_s=spec.jitter_s, loss=spec.loss)


def _mtu(ipr: IPRoute, op: MtuOp, _c: Counters) -> None:
    for link in ipr.get_links():
        if link.get_attr("IFLA_IFNAME") != "lo" and link.get_attr("IFLA_MTU") != op.mtu:
            ipr.link("set", index=link["index"], mtu=op.mtu)


def _host(ipr: IPRoute, op: HostOp, _c: Counters) -> None:
    from testbed.emulation import shaping

    _up(ipr, "lo")
    idx = _index(ipr, op.intf, op.where)
    ipr.addr("add", index=idx, address=op.ip, prefixlen=24)
    _up(ipr, op.intf)
    ipr.route("add", dst="0.0.0.0/0", gateway=op.gateway_ip)
    shaping.apply(ipr, op.intf, shaping.egress_shaper(op.intf, op.lan_rate, op.queue_bytes))


def _gateway(ipr: IPRoute, op: GatewayOp, _c: Counters) -> None:
    from testbed.emulation import shaping

    _up(ipr, "lo")
    ipr.link("add", ifname=op.bridge, kind="bridge")
    br = _index(ipr, op.bridge, op.where)
    for port in op.host_ports:
        ipr.link("set", index=_index(ipr, port, op.where), master=br)
        shaping.apply(ipr, port, shaping.egress_shaper(port, op.lan_rate, op.queue_bytes))
    ipr.addr("add", index=br, address=op.lan_ip, prefixlen=24)
    _up(ipr, op.bridge)
    for port, address in op.wan_ports:
        ipr.addr("add", index=_index(ipr, port, op.where), address=address, prefixlen=30)
        _up(ipr, port)
    for dst, via in op.routes:
        ipr.route("add", dst=dst, gateway=via)


def _wan(ipr: IPRoute, op: WanOp, _c: Counters) -> None:
    from testbed.emulation import shaping

    _up(ipr, "lo")
    for intf in op.intfs:
        _up(ipr, intf)
        shaping.apply(ipr, intf, shaping.egress_shaper(intf, op.rate, op.queue_bytes, _netem(op.netem)))
    if op.bridge is not None:
        ipr.link("add", ifname=op.bridge, kind="bridge")
        br = _index(ipr, op.bridge, op.where)
        for intf in op.intfs:
            ipr.link("set", index=_index(ipr, intf, op.where), master=br)
        _up(ipr, op.bridge)


def _change(ipr: IPRoute, op: ChangeOp, _c: Counters) -> None:
    from testbed.emulation import shaping

    for intf in op.intfs:
        if op.rate is not None:
            shaping.apply(ipr, intf, shaping.change_rate(op.rate))
        if op.netem is not None:
            shaping.apply(ipr, intf, shaping.change_netem(_netem(op.netem), op.netem_rate, op.queue_bytes))


def _counters(ipr: IPRoute, op: CountersOp, out: Counters) -> None:
    for msg in ipr.get_links():
        name = msg.get_attr("IFLA_IFNAME")
        if name in op.intfs:
            stats = msg.get_attr("IFLA_STATS64")
            out[name] = (int(stats["tx_bytes"]), int(stats["tx_packets"]))


_NETLINK: dict[type, Callable[[IPRoute, Any, Counters], None]] = {
    MtuOp: _mtu, HostOp: _host, GatewayOp: _gateway, WanOp: _wan, ChangeOp: _change, CountersOp: _counters,
}


def serve(stdin: TextIO, stdout: TextIO) -> int:
    """The node agent's loop: one `NodeRequest` JSON line in, one `NodeReply` line out,
    until stdin ends (the SSH session that started it is gone). A request's `pid`
    names the node (on this machine); without one, this process's own namespace."""
    from pydantic import ValidationError

    here = NodeNs.inside()
    stdout.write('{"ready": true}\n')
    stdout.flush()
    for line in stdin:
        if not line.strip():
            continue
        try:
            request = NodeRequest.model_validate_json(line)
            reply = apply(request, here if request.pid is None else NodeNs.of_pid(request.pid))
        except ValidationError as exc:
            reply = NodeReply(ok=False, error=f"invalid request: {exc.errors()[:3]}")
        stdout.write(reply.model_dump_json() + "\n")
        stdout.flush()
    return 0
