"""The machine-wide list of TCP congestion controls a network namespace may pick.

A namespace can set ``net.ipv4.tcp_congestion_control`` only to an algorithm in
``net.ipv4.tcp_allowed_congestion_control``, a list shared by the whole machine that
only root in the machine's initial network namespace can change (the kernel's own
default algorithm and reno are in it; on a machine whose default is bbr, cubic is
not). `allow_congestion_controls` adds what a run needs, recorded in the run's record
with the value before any live run changed it, so the last run to end (or `testbed
clean`) restores the machine's own setting.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from testbed.emulation.cleanup import shared_sysctl_origin
from testbed.emulation.errors import EmulationError
from testbed.emulation.records import RunRecord

KEY = "net.ipv4.tcp_allowed_congestion_control"
PROC = Path("/proc/sys/net/ipv4")


def allow_congestion_controls(wanted: Iterable[str] | None, record: RunRecord, why: str,
                              base: Path = PROC) -> list[str]:
    """Add `wanted` (None: every algorithm the kernel has) to the allowed list; return
    what was added. `why` names where they were asked for, for the messages.
    EmulationError where one is not available on this kernel, or the list cannot be
    changed from here."""
    try:
        allowed = (base / "tcp_allowed_congestion_control").read_text().split()
        available = (base / "tcp_available_congestion_control").read_text().split()
    except OSError:
        return []
    missing = sorted(set(available if wanted is None else wanted) - set(allowed))
    # Another live run may have widened the list already: take over its original
    # value too, so whichever run ends last restores the machine's own setting.
    inherited = shared_sysctl_origin(KEY, record)
    if not missing:
        if inherited is not None:
            record.add_sysctl(KEY, inherited, " ".join(allowed))
        return []
    unavailable = [cc for cc in missing if cc not in available]
    if unavailable:
        raise EmulationError(
            f"TCP congestion control {', '.join(unavailable)} ({why}) is not available on this kernel "
            f"(available: {' '.join(available)}): load it with modprobe tcp_{unavailable[0]}"
        )
    new = " ".join(allowed + missing)
    try:
        (base / "tcp_allowed_congestion_control").write_text(new)
    except OSError as exc:
        raise EmulationError(
            f"TCP congestion control {', '.join(missing)} ({why}) is not in this machine's {KEY} "
            f"({' '.join(allowed)}), and this process cannot add it ({exc.strerror or exc}: only root in the "
            f"machine's initial network namespace can): run testbed there, or add it first with "
            f"sysctl -w {KEY}=\"{new}\", or pick one of {' '.join(allowed)} in the topology"
        ) from None
    record.add_sysctl(KEY, inherited if inherited is not None else " ".join(allowed), new)
    return missing
