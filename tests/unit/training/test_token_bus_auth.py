"""The token bus takes only datagrams signed with the run's secret: a stranger's forged
token, or one from another run, is dropped unread and counted."""

from __future__ import annotations

import json
import socket
import time

import pytest

from testbed.training.transport_comm import CommError, TokenBus


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_only_the_runs_datagrams_reach_the_sender() -> None:
    ports = {"a": _port(), "b": _port(), "other": _port()}
    peers = {w: ("127.0.0.1", p) for w, p in ports.items()}
    got: list[dict] = []
    a = TokenBus("127.0.0.1", ports["a"], peers, got.append, secret="run-1")
    b = TokenBus("127.0.0.1", ports["b"], peers, lambda m: None, secret="run-1")
    other = TokenBus("127.0.0.1", ports["other"], peers, lambda m: None, secret="run-2")
    try:
        forged = {"link": "dc1->dc2", "iteration": 0, "index": 0, "until": 0.0}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(json.dumps(forged).encode(), peers["a"])  # no signature at all
            s.sendto(b"\0" * 32 + json.dumps(forged).encode(), peers["a"])  # a made-up one
        other.send("a", {**forged, "from": "another run"})
        b.send("a", {**forged, "from": "b"})
        deadline = time.monotonic() + 5
        while (not got or a.refused < 3) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [{**forged, "from": "b"}] and a.refused == 3
    finally:
        for bus in (a, b, other):
            bus.close()


def test_a_bus_without_the_secret_says_so() -> None:
    with pytest.raises(CommError, match="secret is empty"):
        TokenBus("127.0.0.1", 0, {}, lambda m: None, secret="")
