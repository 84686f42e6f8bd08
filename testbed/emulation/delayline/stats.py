"""What a relay delay line did during a window of a run, from two of its STATS
snapshots (testbed/emulation/delayline/relay.py `stats`): frames and bytes per direction, and
the drops split by who dropped them. ``queue_drops`` are the emulated link's own tail
drops (the kernel refused the frame: the shaper's queue was full), ``loss_model`` the
configured random loss, ``down_drops`` the frames of a link taken down on purpose; ``relay_drops`` (the relay's own queue overflowing, the packet
socket's ring overflowing, truncated frames) are the emulator's fault: the link lost
more than it was told to, and results taken while they grow are suspect."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTERS = ("rx_frames", "rx_bytes", "tx_frames", "tx_bytes", "lost_frames", "lost_segments", "split_frames",
            "overflow_drops", "send_drops", "send_errors", "truncated", "down_drops")


def _direction(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in COUNTERS}


def window(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The counters of one relay between two snapshots, with the drops attributed."""
    out: dict[str, Any] = {}
    relay_drops = 0
    for key, src, dst in (("a2b", "a", "b"), ("b2a", "b", "a")):
        d = _direction(before.get(key, {}), after.get(key, {}))
        kernel = int(after.get("kernel_drops", {}).get(src, 0)) - int(before.get("kernel_drops", {}).get(src, 0))
        d["socket_drops"] = kernel  # frames the packet socket dropped before the relay read them
        d["queue_drops"] = d["send_drops"]
        d["loss_model"] = d["lost_segments"]
        d["relay_drops"] = d["overflow_drops"] + d["truncated"] + kernel
        relay_drops += d["relay_drops"]
        out[f"{after.get(src, src)}->{after.get(dst, dst)}"] = d
    out["relay_drops"] = relay_drops
    return out


def windows(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`window` for every link of `after` (by WAN link name)."""
    return {name: window(before.get(name, {}), snap) for name, snap in after.items()}
