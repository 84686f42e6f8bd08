"""The UDP train of `topo check` (testbed.emulation.linkmeasure.probe) between two namespaces: an
end that starts seconds after the other loses nothing (each end sends only once it
has heard the other's HELLO)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.emulation.netns import temporary_netns

pytestmark = [pytest.mark.root, pytest.mark.alone]  # named namespaces, datagrams counted: run alone


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


def test_a_late_peer_loses_no_datagram(tmp_path: Path) -> None:
    with temporary_netns("tbprA") as a, temporary_netns("tbprB") as b:
        sh("ip", "link", "add", "p0", "netns", a, "type", "veth", "peer", "name", "p1", "netns", b)
        for ns, dev, ip in ((a, "p0", "10.250.81.1/24"), (b, "p1", "10.250.81.2/24")):
            sh("ip", "-n", ns, "addr", "add", ip, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")

        def train(ns: str, peer: str, tag: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "testbed.emulation.linkmeasure.probe", "train", "--peer", peer,
                 "--port", "47010", "--count", "300", "--pps", "1000", "--linger", "0.3",
                 "--out", str(tmp_path / f"{tag}.bin")], stdout=subprocess.PIPE, text=True)

        first = train(a, "10.250.81.2", "a")
        time.sleep(2.0)  # longer than the whole train: without the handshake all of a's would be lost
        second = train(b, "10.250.81.1", "b")
        reports = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in (first, second)]
    assert [r["sent"] for r in reports] == [300, 300]
    assert [r["received"] for r in reports] == [300, 300]
    assert [r["foreign"] for r in reports] == [0, 0]
