"""What a relay delay line did during a window of a run, from two of its STATS
snapshots (testbed/emulation/delayline/relay.py `stats`): frames and bytes per direction, and
the drops split by who dropped them. ``queue_drops`` are the emulated link's own tail
drops (the kernel refused the frame: the shaper's queue was full), ``loss_model`` the
configured random loss, ``down_drops`` the frames of a link taken down on purpose; ``relay_drops`` (the relay's own queue overflowing, the packet
socket's ring overflowing, truncated frames) are the emulator's fault: the link lost
more than it was told to, and results taken while they grow are suspect."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from testbed_core.contracts.summary import DelayLineDirection, DelayLineWindow

COUNTERS = ("rx_frames", "rx_bytes", "tx_frames", "tx_bytes", "lost_frames", "lost_segments", "split_frames",
            "overflow_drops", "send_drops", "send_errors", "truncated", "down_drops")


class RelayCounters(BaseModel):
    """One direction of a STATS snapshot: the relay's running counters (bytes are L2
    bytes, vnet header excluded), its queue length and its parameters as text. A counter
    an older relay does not report reads 0."""

    model_config = ConfigDict(extra="ignore")

    rx_frames: int = 0
    rx_bytes: int = 0
    tx_frames: int = 0
    tx_bytes: int = 0
    lost_frames: int = 0
    lost_segments: int = 0
    split_frames: int = 0
    overflow_drops: int = 0
    send_drops: int = 0
    send_errors: int = 0
    truncated: int = 0
    down_drops: int = 0
    queued: int = 0
    params: str | None = None


class RelaySnapshot(BaseModel):
    """One relay's answer to ``stats`` (relay.py `Relay.stats`, one JSON line): its two
    ports' names, both directions' counters, the frames each port's packet socket dropped
    before the relay read them, and the relay's CPU seconds so far (absent from an older
    relay)."""

    model_config = ConfigDict(extra="ignore")

    a: str = "a"
    b: str = "b"
    a2b: RelayCounters = Field(default_factory=RelayCounters)
    b2a: RelayCounters = Field(default_factory=RelayCounters)
    kernel_drops: dict[str, int] = Field(default_factory=dict)
    cpu_s: float | None = None
    wakeups: int | None = None

    def direction(self, key: str) -> RelayCounters:
        return self.a2b if key == "a2b" else self.b2a


def window(before: RelaySnapshot | None, after: RelaySnapshot) -> DelayLineWindow:
    """The counters of one relay between two snapshots (`before` None: since it
    started), with the drops attributed."""
    before = before or RelaySnapshot()
    directions: dict[str, DelayLineDirection] = {}
    relay_drops = 0
    for key, src in (("a2b", "a"), ("b2a", "b")):
        was, now = before.direction(key), after.direction(key)
        d = {k: getattr(now, k) - getattr(was, k) for k in COUNTERS}
        kernel = after.kernel_drops.get(src, 0) - before.kernel_drops.get(src, 0)
        d["socket_drops"] = kernel  # frames the packet socket dropped before the relay read them
        d["queue_drops"] = d["send_drops"]
        d["loss_model"] = d["lost_segments"]
        d["relay_drops"] = d["overflow_drops"] + d["truncated"] + kernel
        relay_drops += d["relay_drops"]
        name = f"{after.a}->{after.b}" if key == "a2b" else f"{after.b}->{after.a}"
        directions[name] = DelayLineDirection.model_validate(d)
    return DelayLineWindow.of(directions, relay_drops)


def windows(before: Mapping[str, RelaySnapshot], after: Mapping[str, RelaySnapshot]) -> dict[str, DelayLineWindow]:
    """`window` for every link of `after` (by WAN link name)."""
    return {name: window(before.get(name), snap) for name, snap in after.items()}
