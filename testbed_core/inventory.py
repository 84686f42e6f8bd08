"""Inventory: real machines that play a topology's hosts (``testbed run --inventory``).

With an inventory nothing is emulated: each host of the topology is a real machine
reached over SSH (key-based only), the workers and agents run there, and the WAN
between them is whatever network joins the machines (calibrated, never shaped unless
asked). Pure models, no I/O: testbed/run/inventory.py logs in and starts processes.

    ssh: {user: root, identity: keys/id_ed25519, known_hosts: keys/known_hosts}
    repo: /opt/geo-llm-testbed            # where the repository is on the machines
    python: /opt/geo-llm-testbed/.venv/bin/python
    machines:
      - {name: m1, address: 192.0.2.10, dcs: [dc1]}             # every host of dc1
      - {name: m2, address: 192.0.2.11, hosts: [dc2-h1]}        # one host
      - {name: m3, address: 192.0.2.12, hosts: [dc2-h2], data_address: 10.1.0.12}

A host is named as in the run (``<dc>-<host>``). `data_address` is where the other
machines reach this one for the run's traffic (default: `address`). Relative key
paths are read from the folder of the inventory file; `repo` and `python` default to
this repository's path and interpreter (the same layout on every machine).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from testbed_core.configfile import (
    ConfigError,
    ConfigModel,
    format_validation_error,
    read_yaml_mapping,
)
from testbed_core.servers import SERVER_NAME, SshSettings, keys_resolved

if TYPE_CHECKING:
    from testbed_core.topology import Topology


class InventoryError(ConfigError):
    """An inventory that cannot be used; names the file and the field."""


class _Model(ConfigModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _ipv4(value: str, what: str) -> str:
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address (e.g. 192.0.2.10); give the machine's {what}") from None
    if addr.version != 4 or addr.is_unspecified:
        raise ValueError(f"{value!r}: give a routable IPv4 address of the machine, not 0.0.0.0")
    return value


class Machine(_Model):
    """One real machine and the topology hosts it plays."""

    name: str = Field(pattern=SERVER_NAME, description="short lowercase name")
    address: str = Field(description="IPv4 address the controller logs in to over SSH")
    data_address: str | None = Field(None, description="IPv4 address the other machines reach it at "
                                     "for the run's traffic (default: address)")
    dcs: list[str] = Field(default_factory=list, description="DCs all of whose hosts run here")
    hosts: list[str] = Field(default_factory=list, description="single hosts (<dc>-<host>) that run here")
    ssh: SshSettings | None = None  # overrides the inventory's ssh settings
    repo: str | None = None  # overrides the inventory's repo
    python: str | None = None  # overrides the inventory's python

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _ipv4(value, "address for SSH")

    @field_validator("data_address")
    @classmethod
    def _data(cls, value: str | None) -> str | None:
        return None if value is None else _ipv4(value, "address on the network the machines share")

    @model_validator(mode="after")
    def _plays_something(self) -> Machine:
        if not self.dcs and not self.hosts:
            raise ValueError(f"machine {self.name} plays nothing: give `dcs:` (every host of those DCs) "
                             "or `hosts:` (e.g. [dc1-h1])")
        return self

    @property
    def ip(self) -> str:
        return self.data_address or self.address


class Inventory(_Model):
    """Which real machine plays which host, and how to log in and start Python there."""

    ssh: SshSettings = SshSettings()  # how to log in to every machine, unless a machine gives its own `ssh`
    repo: str | None = Field(None, description="the repository's path on the machines (default: this one's)")
    python: str | None = Field(None, description="the interpreter on the machines (default: this one's path)")
    machines: list[Machine] = Field(min_length=1, max_length=256)  # the real machines, each with the hosts it plays
    source: str | None = Field(None, exclude=True)  # the file it was read from (for messages)

    @model_validator(mode="after")
    def _unique(self) -> Inventory:
        names = [m.name for m in self.machines]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"machines: each machine needs its own name; repeated: {', '.join(dup)}")
        return self

    def ssh_for(self, machine: Machine) -> SshSettings:
        return machine.ssh or self.ssh

    def repo_for(self, machine: Machine, default: str) -> str:
        return machine.repo or self.repo or default

    def python_for(self, machine: Machine, default: str) -> str:
        return machine.python or self.python or default

    def where(self) -> str:
        return self.source or "inventory"

    def assignment(self, topology: Topology) -> dict[str, Machine]:
        """Each topology host (``<dc>-<host>``) and the machine that plays it; an
        InventoryError naming the file and field when a DC or host is unknown, a host
        is on two machines, or a host is on none."""
        hosts = {f"{dc.name}-{h}": dc.name for dc in topology.dcs for h in dc.hosts}
        dcs = [dc.name for dc in topology.dcs]
        out: dict[str, Machine] = {}
        where: dict[str, str] = {}
        for i, m in enumerate(self.machines):
            mine: list[tuple[str, str]] = []
            for j, dc in enumerate(m.dcs):
                if dc not in dcs:
                    raise InventoryError(f"{self.where()}: machines.{i}.dcs.{j}: unknown DC {dc!r} (topology "
                                         f"{topology.name} has {', '.join(dcs)}); name one of those")
                mine += [(h, f"machines.{i}.dcs.{j}") for h, d in hosts.items() if d == dc]
            for j, h in enumerate(m.hosts):
                if h not in hosts:
                    raise InventoryError(f"{self.where()}: machines.{i}.hosts.{j}: unknown host {h!r} (topology "
                                         f"{topology.name} has {', '.join(hosts)}); hosts are named <dc>-<host>")
                mine.append((h, f"machines.{i}.hosts.{j}"))
            for h, field in mine:
                if h in out and out[h].name != m.name:
                    raise InventoryError(f"{self.where()}: {field}: host {h} is already on machine {out[h].name} "
                                         f"({where[h]}); a host runs on exactly one machine")
                out[h], where[h] = m, field
        missing = [h for h in hosts if h not in out]
        if missing:
            raise InventoryError(f"{self.where()}: machines: hosts {', '.join(missing)} of topology "
                                 f"{topology.name} are on no machine; list them under a machine's `hosts:` "
                                 "or their DC under its `dcs:`")
        return out

    def resolved(self, base: Path) -> Inventory:
        """The inventory with relative key paths made absolute from `base` (its folder)."""
        return keys_resolved(self, base)


def parse_inventory(data: Any, path: str) -> Inventory:
    """An inventory (a mapping) read from `path`; errors name the file and the field."""
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: an inventory must be a mapping with `machines:` (a list of "
                             "{name, address, dcs or hosts}) and optionally `ssh:`, `repo:`, `python:`")
    try:
        inv = Inventory.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(format_validation_error(path, exc, "inventory")) from None
    return inv.resolved(Path(path).parent).model_copy(update={"source": path})


def load_inventory(path: str | Path) -> Inventory:
    """An inventory file (``testbed run --inventory FILE``)."""
    return parse_inventory(read_yaml_mapping(Path(path), "inventory", InventoryError), str(path))
