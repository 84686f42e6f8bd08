"""Run-time detection of the kernel features the testbed relies on, and the choice of
delay backend (kernel netem, or the toolkit's userspace delay line).

Probes run in a private, unnamed network namespace on a veth pair created for the
purpose (never on a real interface); the namespace disappears with the probe. The
result is cached per process.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Literal

from testbed.emulation.netns import NetnsError, PrivateNetns, private_netns

DelayBackend = Literal["netem", "relay"]
BACKENDS: tuple[str, ...] = ("netem", "relay")

SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
TC_H_ROOT = 0xFFFFFFFF

_INSTALL_NETEM = (
    "load it with 'modprobe sch_netem' (Debian/Ubuntu ship it in "
    "linux-modules-extra-$(uname -r); in containers it must be loaded on the host), "
    "or let the toolkit use its userspace delay line (delay_backend: relay, or auto)"
)


@dataclass(frozen=True)
class KernelFeatures:
    """What this kernel can do for us. ``notes`` says why a feature is missing."""

    netns: bool
    veth: bool
    htb: bool
    tbf: bool
    netem: bool
    packet_vnet_hdr: bool
    packet_ignore_outgoing: bool
    kernel: str = ""
    notes: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class BackendError(RuntimeError):
    """The requested delay backend cannot run on this kernel."""


def _errtext(exc: BaseException) -> str:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    if code == errno.ENOENT:
        return "the kernel does not know this qdisc kind (module missing)"
    if code:
        return f"{os.strerror(code)} (errno {code})"
    return str(exc) or type(exc).__name__


def _probe_qdiscs(ns: PrivateNetns, notes: dict[str, str]) -> dict[str, bool]:
    found = {"veth": False, "htb": False, "tbf": False, "netem": False}
    with ns.iproute() as ipr:
        try:
            ipr.link("add", ifname="probe0", kind="veth", peer="probe1")
            index = ipr.link_lookup(ifname="probe0")[0]
            found["veth"] = True
        except Exception as exc:  # pragma: no cover - veth is everywhere we run
            notes["veth"] = f"cannot create a veth pair: {_errtext(exc)}"
            for kind in ("htb", "tbf", "netem"):
                notes[kind] = "not probed: no veth pair to probe on"
            return found
        probes = {
            "htb": {"default": 1},
            "tbf": {"rate": 125_000, "burst": 16_000, "latency": 50_000},
            "netem": {"delay": 1000, "limit": 1000},
        }
        for kind, params in probes.items():
            try:
                ipr.tc("add", kind, index, 0x10000, **params)
            except Exception as exc:
                notes[kind] = f"adding a {kind} qdisc failed: {_errtext(exc)}"
                continue
            found[kind] = True
            try:
                ipr.tc("del", index=index, parent=TC_H_ROOT)
            except Exception:  # the namespace is thrown away anyway
                pass
    return found


def _probe_packet_socket(notes: dict[str, str]) -> tuple[bool, bool]:
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except OSError as exc:
        notes["packet_vnet_hdr"] = f"cannot open an AF_PACKET socket: {_errtext(exc)}"
        notes["packet_ignore_outgoing"] = notes["packet_vnet_hdr"]
        return False, False
    with sock:
        result = []
        for name, opt in (("packet_vnet_hdr", PACKET_VNET_HDR), ("packet_ignore_outgoing", PACKET_IGNORE_OUTGOING)):
            try:
                sock.setsockopt(SOL_PACKET, opt, 1)
                result.append(True)
            except OSError as exc:
                notes[name] = f"setsockopt({name.upper()}) failed: {_errtext(exc)}"
                result.append(False)
    return result[0], result[1]


def probe_features() -> KernelFeatures:
    """Probe now (uncached). Needs root for everything but the kernel version."""
    notes: dict[str, str] = {}
    kernel = os.uname().release
    try:
        with private_netns() as ns:
            qdiscs = _probe_qdiscs(ns, notes)
            vnet, ignore_out = ns.run(lambda: _probe_packet_socket(notes))
        netns = True
    except NetnsError as exc:
        notes["netns"] = str(exc)
        for name in ("veth", "htb", "tbf", "netem"):
            notes.setdefault(name, "not probed: no network namespace (run as root)")
        qdiscs = dict.fromkeys(("veth", "htb", "tbf", "netem"), False)
        vnet, ignore_out = _probe_packet_socket(notes)
        netns = False
    return KernelFeatures(
        netns=netns,
        veth=qdiscs["veth"],
        htb=qdiscs["htb"],
        tbf=qdiscs["tbf"],
        netem=qdiscs["netem"],
        packet_vnet_hdr=vnet,
        packet_ignore_outgoing=ignore_out,
        kernel=kernel,
        notes=notes,
    )


@functools.cache
def detect_features() -> KernelFeatures:
    """`probe_features`, cached for the life of the process."""
    return probe_features()


def choose_delay_backend(features: KernelFeatures, prefer: str | None = None) -> DelayBackend:
    """netem where the kernel has it, the userspace relay otherwise.

    ``prefer``: None or "auto" chooses; "netem" or "relay" forces one and raises
    `BackendError` (saying what is missing and what to do) when it cannot run here.
    """
    choice = (prefer or "auto").strip().lower()
    if choice not in ("auto", *BACKENDS):
        raise BackendError(
            f"unknown delay backend {prefer!r} (allowed: auto, netem, relay)"
        )
    relay_ok = features.packet_vnet_hdr and features.htb
    if choice == "netem":
        if not features.netem:
            why = features.notes.get("netem", "sch_netem is not available")
            raise BackendError(
                f"delay backend 'netem' was requested but this kernel ({features.kernel}) "
                f"has no usable sch_netem: {why}. To fix: {_INSTALL_NETEM}."
            )
        return "netem"
    if choice == "relay" or not features.netem:
        if not relay_ok:
            missing = [
                f"{name}: {features.notes.get(name, 'missing')}"
                for name in ("packet_vnet_hdr", "htb")
                if not getattr(features, name)
            ]
            lead = (
                "delay backend 'relay' was requested, but the userspace delay line" if choice == "relay"
                else "no delay backend can run here: the kernel has no sch_netem, and the userspace delay line"
            )
            raise BackendError(
                f"{lead} needs AF_PACKET sockets with PACKET_VNET_HDR and the HTB qdisc, "
                f"which are missing here ({'; '.join(missing)}). Run as root on Linux >= 4.20 "
                f"with sch_htb, or {_INSTALL_NETEM.split(', or ')[0]}."
            )
        return "relay"
    return "netem"
