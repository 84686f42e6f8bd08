"""testbed/emulation/linkmeasure/iperf.py: the one in-node iperf3 client and server, run here on
loopback in two processes (the wrapper redirects its process's stdio)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("iperf3")

CLIENT = """
import json, sys
from testbed.emulation.linkmeasure.iperf import iperf3_client
r = iperf3_client("127.0.0.1", int(sys.argv[1]), streams=4, duration=1, connect_timeout=10.0)
print(json.dumps({"error": r.error, "bps": None if r.error else r.received_bps}))
"""
SERVER = """
import sys
from testbed.emulation.linkmeasure.iperf import iperf3_server
r = iperf3_server("127.0.0.1", int(sys.argv[1]))
sys.exit(0 if r is not None and not r.error else 1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_client_started_before_its_server_waits_for_it_and_measures() -> None:
    try:
        import iperf3  # noqa: F401  (loads libiperf)
    except OSError as exc:  # pragma: no cover - libiperf0 missing
        pytest.skip(f"libiperf is not installed: {exc}")
    port = _free_port()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)  # the client is retrying its connection by now
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        out, _ = client.communicate(timeout=30)
        assert server.wait(timeout=10) == 0
    finally:
        for p in (client, server):
            if p.poll() is None:
                p.kill()
    last = json.loads(out.strip().splitlines()[-1])
    assert last["error"] is None
    assert last["bps"] > 0
