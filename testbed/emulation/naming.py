"""Short, collision-free names for the nodes and interfaces of one emulation run.

Linux caps interface names at 15 characters and Mininet names interfaces
`<node>-eth<k>`, so node names must be short. Every run gets a prefix `tb` + 3 hex
digits, chosen at random and checked not to be in use, so two runs (two test
workers) never collide and `testbed clean` can tell the toolkit's objects from
everything else on the machine. Suffixes are index based:

    host k (1-based) of DC i   tb3a7d<i>h<k>    e.g. tb3a7d0h1-eth0 (14 chars)
    gateway of DC i            tb3a7g<i>        e.g. tb3a7g0-eth12
    WAN node of DCs i and j    tb3a7w<i><j>     e.g. tb3a7w01-eth1

where i, j are single base-36 digits (so at most 36 DCs). The mapping back to the
topology's names (dc1-h1, dc1-gw, wan-dc1-dc2) is kept for display.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

PREFIX_RE = re.compile(r"^tb[0-9a-f]{3}$")
MAX_DCS = 36
MAX_HOSTS_PER_DC = 64
IFNAMSIZ = 15  # usable characters of a Linux interface name
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


class NamingError(ValueError):
    """A topology or prefix that does not fit the naming scheme."""


def validate_prefix(prefix: str) -> str:
    if not PREFIX_RE.fullmatch(prefix):
        raise NamingError(
            f"run prefix {prefix!r} must be 'tb' followed by 3 lowercase hex digits, e.g. 'tb3a7'"
        )
    return prefix


def new_prefix(in_use: Callable[[str], bool], attempts: int = 64) -> str:
    """A random prefix for which `in_use(prefix)` is false."""
    for _ in range(attempts):
        prefix = f"tb{secrets.randbelow(16**3):03x}"
        if not in_use(prefix):
            return prefix
    raise NamingError(
        f"no free run prefix after {attempts} tries: are many runs alive? "
        "`testbed clean` removes the leftovers of crashed ones"
    )


def _digit(i: int, what: str) -> str:
    if not 0 <= i < len(_DIGITS):
        raise NamingError(f"{what} index {i} is out of range (at most {MAX_DCS} DCs)")
    return _DIGITS[i]


@dataclass(frozen=True)
class RunNames:
    """Node and interface names of one run with prefix `prefix`."""

    prefix: str

    def __post_init__(self) -> None:
        validate_prefix(self.prefix)

    def host(self, dc_index: int, host_index: int) -> str:
        """Host `host_index` (0-based) of DC `dc_index` (0-based)."""
        if not 0 <= host_index < MAX_HOSTS_PER_DC:
            raise NamingError(f"host index {host_index} out of range (at most {MAX_HOSTS_PER_DC} per DC)")
        return f"{self.prefix}d{_digit(dc_index, 'DC')}h{host_index + 1}"

    def gateway(self, dc_index: int) -> str:
        return f"{self.prefix}g{_digit(dc_index, 'DC')}"

    def wan(self, a_index: int, b_index: int) -> str:
        return f"{self.prefix}w{_digit(a_index, 'DC')}{_digit(b_index, 'DC')}"

    @staticmethod
    def intf(node: str, k: int) -> str:
        name = f"{node}-eth{k}"
        if len(name) > IFNAMSIZ:
            raise NamingError(f"interface name {name!r} is longer than {IFNAMSIZ} characters")
        return name

    @staticmethod
    def bridge(node: str) -> str:
        return f"{node}-br"


def check_topology_fits(n_dcs: int, hosts_per_dc: list[int]) -> None:
    """Raise NamingError, naming the limit, when a topology is too large to name."""
    if n_dcs > MAX_DCS:
        raise NamingError(f"the topology has {n_dcs} DCs; the emulator supports at most {MAX_DCS}")
    for i, n in enumerate(hosts_per_dc):
        if n > MAX_HOSTS_PER_DC:
            raise NamingError(f"DC #{i + 1} has {n} hosts; at most {MAX_HOSTS_PER_DC} per DC")


def display_host(dc: str, host: str) -> str:
    return f"{dc}-{host}"


def display_gateway(dc: str) -> str:
    return f"{dc}-gw"


def display_wan(a: str, b: str) -> str:
    return f"wan-{a}-{b}"
