"""Where the processes of `testbed run` go: the hosts of the scenario's emulated
topology (network namespaces, built once per run: root needed), or, with
``runner.local``, this machine on 127.0.0.1 with no emulated network. The rest of the
runner sees only the `Network` and `Host` protocols.

The run's TCP ports are a network matter too: every emulated host has its own
namespace, so a fixed block serves, while local-mode runs share this machine's stack
and take a free block (`with_ports`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from testbed.emulation.memfs import memory_root
from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed.run.ports import PORT_SPAN, free_port_block
from testbed.run.scenario import EMULATED_BASE_PORT, Scenario, ScenarioDoc
from testbed_core.topology import Topology

if TYPE_CHECKING:
    from testbed.emulation.delayline.stats import RelaySnapshot
    from testbed.emulation.network import Emulation


class Host(Protocol):
    name: str
    ip: str

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen: ...

    def popen_warm(self, argv: Sequence[str], *, preload: Sequence[str], **kwargs: Any) -> Any:
        """`popen` of ``python -m MODULE ...``, forked from a process that imported
        `preload`, where the host is on this machine (testbed/emulation/warmstart.py)."""
        ...


@dataclass
class LocalHost:
    """A topology host played by this machine (local mode): 127.0.0.1, no namespace."""

    name: str
    dc: str
    net: LocalNetwork = field(repr=False)
    ip: str = "127.0.0.1"

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(list(argv), **{**kwargs, "env": _owner_env(kwargs)})

    def popen_warm(self, argv: Sequence[str], *, preload: Sequence[str], **kwargs: Any) -> Any:
        from testbed.emulation.warmstart import claim, warm_start

        folder = self.net.warm_folder()
        if not claim(folder, preload):  # another run of this process has the fork server
            return self.popen(argv, **kwargs)
        return warm_start(os.getpid(), argv, server=folder, **{**kwargs, "env": _owner_env(kwargs)})


def _owner_env(kwargs: dict[str, Any]) -> dict[str, str]:
    """The child's environment (`kwargs`' env, else ours) with this process named as its owner: the
    workers and agents end themselves once it is gone (testbed_runtime/lifetime.py), as
    under emulation (Emulation names itself the same way)."""
    from testbed_runtime.lifetime import OWNER_ENV, owner_mark

    env = dict(kwargs.get("env") or os.environ)
    env[OWNER_ENV] = owner_mark()
    return env


class Network(Protocol):
    delay_backend: str
    local: bool

    def host(self, name: str) -> Host: ...

    def temp_dir(self, purpose: str) -> Path:
        """A new private temporary folder for this run (removed by the caller; under
        emulation also by the teardown, or by `testbed clean` after a crash)."""
        ...

    def memory_dir(self, purpose: str) -> Path | None:
        """A new private folder on this machine's memory file system (testbed/emulation/memfs.py)
        for the files a variant's processes exchange at every step (device locks and leases,
        live status, slot feeds, transfer logs), removed like `temp_dir`'s; None when there is
        no such file system or the run's processes are not all on this machine (then those
        files stay in the results folder)."""
        ...

    def delay_line_stats(self) -> dict[str, RelaySnapshot]: ...

    def helper_pids(self) -> list[int] | None:
        """The run's processes on this machine besides its workers and this process (the
        delay lines), so the runner can tell its own CPU use from other programs'; None
        where the run's processes are not all on this machine (other servers, real machines)."""
        ...


@dataclass
class LocalNetwork:
    topology: Topology
    delay_backend: str = "none (local mode: loopback, no emulated WAN)"
    local: bool = True
    temp_dirs: list[Path] = field(default_factory=list)  # removed by open_network when the run ends
    warm: Path | None = None  # the fork server's folder (warm_folder)

    def host(self, name: str) -> Host:
        for dc in self.topology.dcs:
            for h in dc.hosts:
                if f"{dc.name}-{h}" == name:
                    return LocalHost(name, dc.name, self)
        raise RunnerError(f"no host {name!r} in topology {self.topology.name}")

    def temp_dir(self, purpose: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"tbrun-{purpose}-"))
        self.temp_dirs.append(path)
        return path

    def memory_dir(self, purpose: str) -> Path | None:
        root = memory_root()
        if root is None:
            return None
        path = Path(tempfile.mkdtemp(prefix=f"tbrun-{purpose}-", dir=root))
        self.temp_dirs.append(path)
        return path

    def delay_line_stats(self) -> dict[str, RelaySnapshot]:
        return {}

    def helper_pids(self) -> list[int] | None:
        return []

    def warm_folder(self) -> Path:
        """The folder of this run's fork server (warm starts), made on first use."""
        if self.warm is None:
            self.warm = self.temp_dir("warm")
        return self.warm


@dataclass
class EmulatedNetwork:
    emu: Emulation
    local: bool = False

    @property
    def delay_backend(self) -> str:
        return str(self.emu.delay_backend)

    def host(self, name: str) -> Host:
        try:
            return self.emu.node(name)
        except KeyError:
            raise RunnerError(f"no host {name!r} in the emulation of {self.emu.topology.name}") from None

    def temp_dir(self, purpose: str) -> Path:
        return self.emu.temp_dir(purpose)

    def memory_dir(self, purpose: str) -> Path | None:
        root = memory_root()
        if root is None or self.emu.cluster is not None:  # nodes on other servers write there too
            return None
        return self.emu.temp_dir(purpose, root=root)

    def delay_line_stats(self) -> dict[str, RelaySnapshot]:
        return self.emu.delay_line_stats()

    def helper_pids(self) -> list[int] | None:
        return None if self.emu.cluster is not None else self.emu.relay_pids()


@contextlib.contextmanager
def open_network(scenario: Scenario, progress: Progress) -> Iterator[Network]:
    """The emulated topology (root needed), loopback in local mode, or the real
    machines of ``runner.inventory`` (testbed/run/inventory.py)."""
    if scenario.runner.local:
        net = LocalNetwork(scenario.topology)
        try:
            yield net
        finally:  # the run's control sockets and the like: nothing of a local run stays in /tmp
            if net.warm is not None:
                from testbed.emulation.warmstart import release

                release(net.warm)
            for path in net.temp_dirs:
                shutil.rmtree(path, ignore_errors=True)
        return
    if getattr(scenario.runner, "inventory", None):
        from testbed.run.inventory import open_inventory

        with open_inventory(scenario, progress) as net:
            yield net
        return
    if os.geteuid() != 0:
        raise RunnerError("emulating the topology needs root: run as root (sudo), or set runner.local: true "
                          "(testbed run --local) to run the workers on 127.0.0.1 without an emulated WAN")
    base = scenario.runner.base_port
    ports = (base, base + PORT_SPAN - 1) if isinstance(base, int) else None
    with built_emulation(scenario.topology, progress, scenario.runner.slow_start_after_idle, ports) as emu:
        yield EmulatedNetwork(emu)


@contextlib.contextmanager
def built_emulation(topology: Topology, progress: Progress, slow_start_after_idle: bool = False,
                    run_ports: tuple[int, int] | None = None) -> Iterator[Emulation]:
    """`topology` emulated (root needed), torn down on exit. Unless
    `slow_start_after_idle`, every host's TCP keeps its window across idle periods
    (``runner.slow_start_after_idle: false``): a pipeline's transfers come in bursts.
    `run_ports` (first, last), the run's port block, is reserved on every host
    (``net.ipv4.ip_local_reserved_ports``, per namespace): the block lies inside Linux's
    ephemeral range, and an outgoing connection could otherwise take a port a worker
    is about to listen on."""
    from testbed.emulation.network import Emulation, EmulationError

    try:
        emu = Emulation(topology, progress=progress.log)
        emu.start()
    except EmulationError as exc:
        raise RunnerError(f"building topology {topology.name}: {exc}") from None
    try:
        values = [] if slow_start_after_idle else ["net.ipv4.tcp_slow_start_after_idle=0"]
        if run_ports is not None:
            values.append(f"net.ipv4.ip_local_reserved_ports={run_ports[0]}-{run_ports[1]}")
        if values:
            for h in emu.hosts():
                h.run(["sysctl", "-q", "-w", *values], check=True, timeout=10)
        yield emu
    finally:
        emu.stop()


def with_servers(scenario: Scenario, resolved: ScenarioDoc, path: Path,
                 local: bool = False) -> tuple[Scenario, ScenarioDoc]:
    """The scenario with its topology's DCs placed on the servers of ``--servers FILE``
    (testbed_core/servers.py), and the resolved scenario recording them."""
    from testbed_core.servers import ServersError, load_servers, place_topology

    if local or scenario.runner.local:
        raise ServersError(f"--servers {path}: a local run (--local, runner.local) emulates nothing; drop one of them")
    plan = load_servers(path)
    topology = place_topology(scenario.topology, plan, str(path))
    resolved = dict(resolved)
    if isinstance(resolved.get("topology"), dict):
        resolved["topology"] = {**resolved["topology"], "servers": plan.model_dump(mode="json")}
    return scenario.model_copy(update={"topology": topology}), resolved


def with_inventory(scenario: Scenario, resolved: ScenarioDoc, path: Path,
                   other_mode: bool = False) -> tuple[Scenario, ScenarioDoc]:
    """The scenario run on the real machines of the inventory ``path`` (checked against
    the topology's hosts now, before anything starts)."""
    from testbed_core.inventory import InventoryError, load_inventory

    if other_mode or scenario.runner.local or scenario.topology.servers is not None:
        raise InventoryError(f"--inventory {path}: real machines replace the emulation; --local, --servers and a "
                             "topology's servers section cannot go with it: drop one of them")
    load_inventory(path).assignment(scenario.topology)
    runner = scenario.runner.model_copy(update={"inventory": str(Path(path).resolve())})
    resolved = dict(resolved)
    resolved["runner"] = {**(resolved.get("runner") or {}), "inventory": runner.inventory}
    return scenario.model_copy(update={"runner": runner}), resolved


def with_ports(scenario: Scenario, progress: Progress) -> Scenario:
    """The scenario with its port block fixed (``runner.base_port: auto``): the
    emulated block under emulation, a block free right now on 127.0.0.1 in local mode."""
    if scenario.runner.base_port != "auto":
        return scenario
    if scenario.runner.local:
        port = free_port_block(PORT_SPAN)
        progress.log(f"local mode: ports {port}-{port + PORT_SPAN - 1} on 127.0.0.1")
    else:
        port = EMULATED_BASE_PORT
    runner = scenario.runner.model_copy(update={"base_port": port})
    return scenario.model_copy(update={"runner": runner})
