"""The TCP and UDP ports of one run, all handed out from the run's base port
(``runner.base_port``).

A run uses one block of `PORT_SPAN` ports above its base, cut into ranges of
`RANGE_SIZE` ports, one per part of the run, so that no two parts ever pick the same
port (under emulation every host has its own network stack, but in local mode all
processes share 127.0.0.1):

====================  =========================================================
channels              one per (pipeline, boundary) channel (testbed/run/jobs.py)
tokens                one UDP token bus per worker, by worker name (Atlas)
calibration           one per calibration probe pair (testbed/run/calibration.py)
decode                one per BubbleTea decode server (testbed/run/bubbletea.py)
dp_gradients          one per pair of DP replicas of a rank (the DP all-reduce)
store                 torch-gloo: the process group's store (testbed/training/gloo_comm.py)
====================  =========================================================

`free_port_block` finds a base whose ranges are free, for local runs with
``runner.base_port: auto``.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass

from testbed.run.common import RunnerError

RANGE_SIZE = 1000  # ports per part of the run
RANGES = ("channels", "tokens", "calibration", "decode", "dp_gradients", "store")  # in this order above the base
PORT_SPAN = RANGE_SIZE * len(RANGES)  # ports a run uses above its base
PORTS_CHECKED = 64  # of each range, checked free by free_port_block (a run rarely uses more)


@dataclass(frozen=True)
class PortRange:
    """`size` consecutive ports from `first`, for one part of the run."""

    name: str
    first: int
    size: int = RANGE_SIZE

    def port(self, k: int) -> int:
        """The k-th port of the range; RunnerError when the part needs more than it has."""
        if not 0 <= k < self.size:
            raise RunnerError(f"the run needs more than {self.size} {self.name} ports (asked for number {k}); "
                              "use fewer pipelines, stages or hosts")
        return self.first + k


class _Range:
    """A range of a `PortPlan` read as an attribute of the same name (``plan.channels``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        if name not in RANGES:
            raise TypeError(f"PortPlan.{name}: not one of the run's ranges {RANGES}")
        self.name = name

    def __get__(self, plan: PortPlan, owner: type | None = None) -> PortRange:
        return plan._range(self.name)


@dataclass(frozen=True)
class PortPlan:
    """The ranges of a run with base port `base` (see the module doc)."""

    base: int
    channels = _Range()
    tokens = _Range()
    calibration = _Range()
    decode = _Range()
    dp_gradients = _Range()
    store = _Range()

    def _range(self, name: str) -> PortRange:
        return PortRange(name, self.base + RANGE_SIZE * RANGES.index(name))

    def ranges(self) -> list[PortRange]:
        """Every range of the run, in port order."""
        return [self._range(name) for name in RANGES]


def free_port_block(span: int = PORT_SPAN, host: str = "127.0.0.1", attempts: int = 50,
                    rng: random.Random | None = None) -> int:
    """A base port whose ranges (the first `PORTS_CHECKED` ports of each) are free on
    `host` right now: local-mode runs share one network stack, so two runs (or two
    test workers) on fixed ports would collide. Racy only against a process that binds
    the same ports between this check and the run's own listeners."""
    rng = rng or random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 60000 - span)
        if all(_bindable(host, r.first + k) for r in PortPlan(base).ranges() for k in range(PORTS_CHECKED)):
            return base
    raise RunnerError(f"no free block of ports on {host} after {attempts} tries: too many ports in use; "
                      "set runner.base_port to a free range")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
