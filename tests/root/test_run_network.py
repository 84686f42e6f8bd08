"""The emulated network `testbed run` opens (testbed/run/network.py, root): every host
keeps the run's port block out of its ephemeral range, so no outgoing connection takes
a port a worker is about to listen on (a DP-gradient port once did, in CI)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.network import open_network
from testbed.run.ports import PORT_SPAN
from testbed.run.scenario import load_scenario

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_every_emulated_host_reserves_the_runs_port_block(namespaces) -> None:
    before = namespaces()
    scenario, _ = load_scenario(ROOT / "scenarios/atlas-2dc.yaml", {"runner.base_port": 39000})
    progress = Progress(label="t", stream=io.StringIO(), tty=False)
    with open_network(scenario, progress) as net:
        hosts = net.emu.hosts()
        assert hosts
        for host in hosts:
            done = host.run(["sysctl", "-n", "net.ipv4.ip_local_reserved_ports",
                             "net.ipv4.tcp_slow_start_after_idle"], check=True, timeout=10)
            assert done.stdout.split() == [f"39000-{39000 + PORT_SPAN - 1}", "0"], host.name
    assert namespaces() <= before
