"""Topology `changes` that take a link down and up: validation messages, the steps the
emulation applies, and how `Emulation.change_link` drives the delay line (no root: the
relay's pipe and the shaper are stood in for)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from testbed.emulation.network import Emulation, EmulationError
from testbed_core.constants import TOPOLOGIES_DIR
from testbed_core.topology import TopologyError, parse_topology


def _topology(changes: list[dict[str, Any]]) -> Any:
    data = yaml.safe_load((TOPOLOGIES_DIR / "2dc.yaml").read_text())
    data["wan"][0]["changes"] = changes
    return parse_topology(data, "t.yaml")


def test_down_for_a_duration_becomes_cut_and_restore() -> None:
    link = _topology([{"at": "5s", "down": True, "duration": "2s"}, {"at": "10s", "delay": "40ms"}]).wan[0]
    steps = [(c.at, c.down, c.delay) for c in link.steps()]
    assert steps == [(5.0, True, None), (7.0, False, None), (10.0, None, 0.04)]


@pytest.mark.parametrize(("changes", "message"), [
    ([{"at": "5s", "duration": "2s"}], "changes.0: duration is how long a link stays down: it goes with down: true"),
    ([{"at": "5s", "down": False}], "changes.0: down: false restores a link, but the link is not down at 5s"),
    ([{"at": "1s", "down": True}, {"at": "2s", "down": True, "duration": "1s"}],
     "changes.1: the link is already down \\(since changes.0\\)"),
    ([{"at": "1s", "down": True, "duration": "7200s"}],
     "down duration 7200s is out of range: allowed 1ms to 3600s \\(an outage on purpose lasts 1ms to an hour\\)"),
    ([{"at": "1s", "down": "sometimes"}], "down is true \\(cut the link\\) or false \\(restore it\\)"),
])
def test_bad_down_changes_are_refused_with_file_field_and_bound(changes: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(TopologyError, match=message) as info:
        _topology(changes)
    assert "t.yaml" in str(info.value) and "wan.0.changes" in str(info.value)


def test_down_then_up_by_later_change_and_again_is_valid() -> None:
    link = _topology([{"at": "1s", "down": True}, {"at": "3s", "down": False},
                      {"at": "4s", "down": True, "duration": "1s"}]).wan[0]
    assert [c.down for c in link.steps()] == [True, False, True, False]


class _Relay:
    def __init__(self) -> None:
        self.stdin = io.StringIO()


def _emulation(topology: Any) -> tuple[Emulation, _Relay]:
    emu = Emulation(topology)
    relay = _Relay()
    link = topology.wan[0]
    emu.delay_backend = "relay"
    emu._wans = [SimpleNamespace(link=link, name="wan0", intfs=[], pid=0, relay=relay,
                                 configure=lambda *ops: None)]  # type: ignore[list-item]
    emu._link_state[link.name] = (link.rate, link.delay, link.jitter, link.loss, False)
    return emu, relay


def test_change_link_sends_down_and_up_to_the_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    import testbed.emulation.netns as netns

    monkeypatch.setattr(netns, "open_iproute", lambda pid: contextlib.nullcontext(None))
    emu, relay = _emulation(_topology([]))
    emu.change_link("dc1-dc2", down=True)
    assert emu.link_state("dc1-dc2")[4] is True
    emu.change_link("dc1-dc2", delay=0.2)  # a delay spike while down keeps it down
    emu.change_link("dc1-dc2", down=False, delay=0.025)
    lines = relay.stdin.getvalue().splitlines()
    assert lines == ["set both delay=25ms jitter=0ms loss=0.0 down=on",
                     "set both delay=200ms jitter=0ms loss=0.0 down=on",
                     "set both delay=25ms jitter=0ms loss=0.0 down=off"]
    with pytest.raises(EmulationError, match="no WAN link 'dc1-dc3' \\(links: dc1-dc2\\)"):
        emu.change_link("dc1-dc3", down=True)


def test_netem_backend_takes_a_link_down_as_total_loss_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    import testbed.emulation.netns as netns
    from testbed.emulation import shaping

    seen: list[Any] = []
    monkeypatch.setattr(netns, "open_iproute", lambda pid: contextlib.nullcontext(None))
    monkeypatch.setattr(shaping, "change_netem", lambda params, rate, queue: seen.append(params) or [])
    monkeypatch.setattr(shaping, "apply", lambda ipr, intf, requests: None)
    emu, relay = _emulation(_topology([]))
    emu.delay_backend = "netem"
    emu._wans[0].intfs = ["eth0", "eth1"]  # type: ignore[misc]
    from pathlib import Path

    from testbed.emulation.nodeconf import NodeNs, NodeRequest, apply

    here = NodeNs(lambda: SimpleNamespace(close=lambda: None), lambda fn: fn(), Path("/"))  # the node, stood in for
    emu._wans[0].configure = lambda *ops: apply(NodeRequest(ops=list(ops)), here)  # type: ignore[misc]
    emu.change_link("dc1-dc2", down=True)
    emu.change_link("dc1-dc2", down=False)
    assert [p.loss for p in seen] == [1.0, 1.0, 0.0, 0.0]  # both interfaces, then restored
    assert relay.stdin.getvalue() == ""
