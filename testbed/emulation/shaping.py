"""Egress shaping of WAN links with tc through pyroute2 (never the ``tc`` binary).

Layout on an interface (handles as tc writes them)::

    1:   htb root, default class 1:1
    1:1  htb class, rate = ceil = link rate (64-bit rates: 10 Gbit/s and more work)
    10:  leaf: bfifo limited to the queue size in bytes (one BDP by default),
         or netem (delay, jitter, loss) whose packet limit covers BDP + queue

The ``*_shaper``/``change_*`` functions are pure: they return the list of `TcRequest`
that `apply` sends, so the netem path is testable on kernels without sch_netem.
Rates are bits per second, sizes bytes, times seconds (as in `testbed_core.units`).
"""

from __future__ import annotations

import errno
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import plugins as _tc_plugins
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo

from testbed_core.shaper import ETH_FRAME, GSO_MAX, burst_bytes

if TYPE_CHECKING:
    from pyroute2 import IPRoute

# pyroute2 0.9.7 knows "pfifo" but not "bfifo"; both use the same netlink options
# (struct tc_fifo_qopt { u32 limit; }), only the unit differs (packets vs bytes).
_tc_plugins.setdefault("bfifo", sched_pfifo)

TC_H_ROOT = 0xFFFFFFFF
ROOT_HANDLE = 0x10000  # 1:
CLASS_HANDLE = 0x10001  # 1:1
LEAF_HANDLE = 0x100000  # 10:

QUEUE_FLOOR_BYTES = 2 * GSO_MAX + 4 * ETH_FRAME  # never below two GSO packets and a few MTUs
NETEM_SMALL_PACKET = 512  # netem limit counts packets: assume small ones while in flight
NETEM_MIN_LIMIT = 1000  # netem's own default
_TICKS_PER_US = 15.625  # psched ticks are 64 ns (Linux >= 2.6.31)
_U32 = 2**32


class ShapingError(RuntimeError):
    """A shaping request was invalid or the kernel refused it."""


@dataclass(frozen=True)
class NetemParams:
    """Delay, jitter (uniform +-jitter, netem's default) and loss probability (0..1)."""

    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    limit: int | None = None  # packets; None sizes it from BDP + queue

    def __post_init__(self) -> None:
        for name in ("delay_s", "jitter_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ShapingError(f"netem {name} must be a finite number >= 0 seconds, got {value!r}")
        if (self.delay_s + self.jitter_s) * 1e6 * _TICKS_PER_US >= _U32:
            raise ShapingError(f"netem delay+jitter {self.delay_s + self.jitter_s:g}s exceeds netem's limit of ~274 s")
        if not (0.0 <= self.loss <= 1.0):
            raise ShapingError(f"netem loss is a probability between 0 and 1, got {self.loss!r} (1% is 0.01)")
        if self.limit is not None and self.limit < 1:
            raise ShapingError(f"netem limit must be a positive packet count, got {self.limit!r}")


@dataclass(frozen=True)
class TcRequest:
    """One pyroute2 ``ipr.tc(command, kind, index, handle, parent=..., **params)`` call."""

    command: str
    kind: str
    handle: int
    parent: int
    params: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        opts = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.command} {self.kind} {_h(self.handle)} parent {_h(self.parent)} {opts}".strip()


@dataclass(frozen=True)
class ShaperState:
    """What `read_shaper` found on an interface."""

    rate_bps: float | None
    ceil_bps: float | None
    leaf_kind: str | None
    queue_bytes: int | None  # bfifo limit
    netem: NetemParams | None


def _h(handle: int) -> str:
    if handle == TC_H_ROOT:
        return "root"
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}" if handle & 0xFFFF else f"{handle >> 16:x}:"


def _check_rate(where: str, rate_bps: float) -> int:
    if not (isinstance(rate_bps, int | float) and math.isfinite(rate_bps) and rate_bps >= 8):
        raise ShapingError(f"{where}: rate must be a number of bits per second >= 8, got {rate_bps!r}")
    return int(rate_bps // 8)


def _check_queue(where: str, queue_bytes: int) -> int:
    if not (isinstance(queue_bytes, int | float) and queue_bytes >= ETH_FRAME):
        raise ShapingError(
            f"{where}: queue must hold at least one full frame ({ETH_FRAME} bytes), got {queue_bytes!r}"
        )
    if queue_bytes >= 2**31:
        raise ShapingError(f"{where}: queue of {queue_bytes} bytes is too large (bfifo limit is < 2 GiB)")
    return int(queue_bytes)


def queue_bytes_for(rate_bps: float, rtt_s: float, floor_bytes: int = QUEUE_FLOOR_BYTES) -> int:
    """One bandwidth-delay product in bytes, never below ``floor_bytes`` (two GSO packets
    and a few MTUs: a smaller byte queue would drop every TSO super-packet)."""
    rate = _check_rate("queue_bytes_for", rate_bps)
    if not (math.isfinite(rtt_s) and rtt_s >= 0):
        raise ShapingError(f"queue_bytes_for: rtt must be >= 0 seconds, got {rtt_s!r}")
    return max(int(math.ceil(rate * rtt_s)), int(floor_bytes))


def htb_burst_bytes(rate_bps: float) -> int:
    """Token bucket depth: 1 ms at line rate (so 10 Gbit/s does not starve on timer
    granularity) and at least one GSO super-packet plus one frame."""
    return int(math.ceil(burst_bytes(_check_rate("htb_burst_bytes", rate_bps) * 8)))


def _htb_class_params(rate_bps: float) -> dict[str, int]:
    rate = _check_rate("htb class", rate_bps)
    burst = htb_burst_bytes(rate_bps)
    # quantum only matters between sibling classes; set it so the kernel does not
    # derive (and complain about) one from r2q at high rates.
    quantum = min(200_000, max(ETH_FRAME, rate // 1000))
    return {"rate": rate, "ceil": rate, "burst": burst, "cburst": burst, "quantum": quantum, "prio": 0}


def netem_limit_packets(rate_bps: float, netem: NetemParams, queue_bytes: int) -> int:
    """netem's queue holds every packet still in its delay plus the backlog waiting for
    HTB tokens; its default of 1000 packets drops on high-BDP paths."""
    if netem.limit is not None:
        return netem.limit
    rate = _check_rate("netem limit", rate_bps)
    in_flight = rate * (netem.delay_s + 2 * netem.jitter_s) / NETEM_SMALL_PACKET
    backlog = queue_bytes / ETH_FRAME
    return max(NETEM_MIN_LIMIT, int(math.ceil(in_flight + backlog)))


def _netem_params(rate_bps: float, netem: NetemParams, queue_bytes: int) -> dict[str, int | float]:
    return {
        "delay": int(round(netem.delay_s * 1e6)),  # pyroute2 takes microseconds
        "jitter": int(round(netem.jitter_s * 1e6)),
        "loss": netem.loss * 100.0,  # pyroute2 takes percent
        "limit": netem_limit_packets(rate_bps, netem, queue_bytes),
    }


def _leaf(command: str, rate_bps: float, queue_bytes: int, netem: NetemParams | None) -> TcRequest:
    if netem is None:
        return TcRequest(command, "bfifo", LEAF_HANDLE, CLASS_HANDLE, {"limit": queue_bytes})
    return TcRequest(command, "netem", LEAF_HANDLE, CLASS_HANDLE, _netem_params(rate_bps, netem, queue_bytes))


def egress_shaper(
    ifname: str, rate_bps: float, queue_bytes: int, netem: NetemParams | None = None
) -> list[TcRequest]:
    """HTB root + class at ``rate_bps`` with a bfifo leaf of ``queue_bytes`` (or a netem
    leaf when ``netem`` is given). The interface must have no root qdisc of ours yet."""
    where = f"egress shaper on {ifname}"
    _check_rate(where, rate_bps)
    queue = _check_queue(where, queue_bytes)
    return [
        TcRequest("add", "htb", ROOT_HANDLE, TC_H_ROOT, {"default": CLASS_HANDLE & 0xFFFF, "r2q": 10}),
        TcRequest("add-class", "htb", CLASS_HANDLE, ROOT_HANDLE, _htb_class_params(rate_bps)),
        _leaf("add", rate_bps, queue, netem),
    ]


def change_rate(rate_bps: float, queue_bytes: int | None = None) -> list[TcRequest]:
    """Change the link rate in place (no qdisc rebuild, queued packets stay); with
    ``queue_bytes`` also resize the bfifo leaf."""
    reqs = [TcRequest("change-class", "htb", CLASS_HANDLE, ROOT_HANDLE, _htb_class_params(rate_bps))]
    if queue_bytes is not None:
        reqs.append(_leaf("change", rate_bps, _check_queue("change_rate", queue_bytes), None))
    return reqs


def change_netem(netem: NetemParams, rate_bps: float, queue_bytes: int) -> list[TcRequest]:
    """Change delay/jitter/loss of the netem leaf in place (rate and queue size it)."""
    _check_rate("change_netem", rate_bps)
    return [_leaf("change", rate_bps, _check_queue("change_netem", queue_bytes), netem)]


def _ifindex(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise ShapingError(
            f"no interface named {ifname!r} in this network namespace "
            "(is the IPRoute opened in the node's namespace? see testbed.emulation.netns.open_iproute)"
        )
    return int(found[0])


def _explain(req: TcRequest, ifname: str, exc: NetlinkError) -> str:
    what = f"tc {req.describe()} on {ifname} failed: {exc.args[1] if len(exc.args) > 1 else exc}"
    if exc.code == errno.ENOENT and req.command.startswith("add") and req.kind == "netem":
        return f"{what}. This kernel has no sch_netem: use the relay delay backend (testbed.emulation.kernel.choose_delay_backend)"
    if exc.code == errno.ENOENT:
        return f"{what}. The qdisc/class to change does not exist (apply egress_shaper first) or the kernel lacks sch_{req.kind}"
    if exc.code == errno.EEXIST:
        return f"{what}. {ifname} already has a qdisc there: call remove_shaper() first"
    if exc.code == errno.EPERM:
        return f"{what}. Shaping needs root (CAP_NET_ADMIN)"
    return what


def apply(ipr: IPRoute, ifname: str, requests: Iterable[TcRequest]) -> None:
    """Send the requests in order to ``ifname`` through ``ipr`` (an IPRoute opened in
    the interface's namespace). If a request fails after this call added a root qdisc,
    that root is removed again before `ShapingError` is raised."""
    index = _ifindex(ipr, ifname)
    added_root = False
    for req in requests:
        try:
            ipr.tc(req.command, req.kind, index, req.handle, parent=req.parent, **dict(req.params))
        except NetlinkError as exc:
            if added_root:  # do not leave a half-built shaper behind
                try:
                    ipr.tc("del", index=index, parent=TC_H_ROOT)
                except NetlinkError:
                    pass
            raise ShapingError(_explain(req, ifname, exc)) from exc
        added_root = added_root or (req.command == "add" and req.parent == TC_H_ROOT)


def remove_shaper(ipr: IPRoute, ifname: str) -> bool:
    """Delete the root qdisc (and with it the whole shaper); False if there was none."""
    index = _ifindex(ipr, ifname)
    try:
        ipr.tc("del", index=index, parent=TC_H_ROOT)
    except NetlinkError as exc:
        if exc.code in (errno.ENOENT, errno.EINVAL):
            return False
        raise ShapingError(f"removing the root qdisc of {ifname} failed: {exc}") from exc
    return True


def read_shaper(ipr: IPRoute, ifname: str) -> ShaperState:
    """Read back rate, ceil, queue limit and netem settings of our shaper."""
    index = _ifindex(ipr, ifname)
    rate = ceil = None
    for msg in ipr.get_classes(index=index):
        if msg["handle"] != CLASS_HANDLE or msg.get_attr("TCA_KIND") != "htb":
            continue
        opts = msg.get_attr("TCA_OPTIONS")
        parms = opts.get_attr("TCA_HTB_PARMS")
        rate = 8.0 * (opts.get_attr("TCA_HTB_RATE64") or parms["rate"])
        ceil = 8.0 * (opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"])
    leaf_kind = None
    queue = None
    netem = None
    for msg in ipr.get_qdiscs(index=index):
        if msg["handle"] != LEAF_HANDLE:
            continue
        leaf_kind = msg.get_attr("TCA_KIND")
        opts = msg.get_attr("TCA_OPTIONS")
        if leaf_kind == "bfifo":
            queue = int(opts["limit"])
        elif leaf_kind == "netem":
            netem = NetemParams(
                delay_s=opts["delay"] / _TICKS_PER_US / 1e6,
                jitter_s=opts["jitter"] / _TICKS_PER_US / 1e6,
                loss=opts["loss"] / (_U32 - 1),
                limit=int(opts["limit"]),
            )
    return ShaperState(rate_bps=rate, ceil_bps=ceil, leaf_kind=leaf_kind, queue_bytes=queue, netem=netem)
