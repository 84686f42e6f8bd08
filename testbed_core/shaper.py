"""The emulated WAN links' shaper, as figures the planner and the emulation share.

testbed/emulation/shaping.py sets each link's HTB class with this token bucket; the
planner (testbed_core/planning/network.py) and the program predictor
(testbed_core/program/predict.py) model what an idle link lets through at once with the
same formula, so that the two cannot drift apart.
"""

from __future__ import annotations

ETH_FRAME = 1514  # bytes of a full-MTU Ethernet frame (1500 + 14)
GSO_MAX = 65536  # largest GSO super-packet on veth by default
BURST_TIME_S = 0.001  # HTB bucket: 1 ms of line rate (tc's rate/HZ), at least one GSO packet


def burst_bytes(rate_bps: float) -> float:
    """The token bucket's depth at line rate `rate_bps`: 1 ms of it (so 10 Gbit/s does
    not starve on timer granularity), at least one GSO super-packet plus one frame. An
    idle link passes this much at once, above its rate."""
    return max(rate_bps / 8 * BURST_TIME_S, GSO_MAX + ETH_FRAME)
