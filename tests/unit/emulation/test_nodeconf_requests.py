"""The node configuration requests (testbed/emulation/nodeconf.py): what the models
accept and refuse, how `apply` reports a failing operation (the same reply whether
the node is reached through its PID or through its agent over SSH) and the agent's
JSON-lines loop. The node agent's command line and the logins: tests/unit/emulation/remote/.
No root needed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from testbed.emulation.nodeconf import (
    CountersOp,
    HostOp,
    MtuOp,
    NodeNs,
    NodeReply,
    NodeRequest,
    RpsOp,
    SysctlsOp,
    WanOp,
    apply,
    serve,
)

HOST = {"op": "host", "intf": "h1-e0", "ip": "10.0.1.10", "gateway_ip": "10.0.1.1", "lan_rate": 1e10,
        "queue_bytes": 125000, "where": "dc1-h1"}


def test_a_request_round_trips_as_one_json_line() -> None:
    req = NodeRequest.model_validate({"ops": [HOST, {"op": "mtu", "mtu": 1450},
                                              {"op": "wan", "intfs": ["w-e0", "w-e1"], "rate": 1e9,
                                               "queue_bytes": 6250000, "netem": {"delay_s": 0.025}}]})
    line = req.model_dump_json()
    assert "\n" not in line
    again = NodeRequest.model_validate_json(line)
    assert again == req
    assert isinstance(again.ops[0], HostOp) and isinstance(again.ops[2], WanOp)
    assert again.ops[2].netem is not None and again.ops[2].netem.delay_s == 0.025


@pytest.mark.parametrize(("ops", "where"), [
    ([], "ops"),
    ([{"op": "reboot"}], "ops.0"),
    ([{**HOST, "lan_rate": 0}], "lan_rate"),
    ([{**HOST, "shell": "ip addr"}], "shell"),  # no free-form fields: no shell strings reach a node
    ([{"op": "rps", "mask": "ff; rm -rf /"}], "mask"),
    ([{"op": "mtu", "mtu": 100}], "mtu"),
    ([{"op": "wan", "intfs": ["a"], "rate": 1e9, "queue_bytes": 1}], "intfs"),
    ([{"op": "wan", "intfs": ["a", "b"], "rate": 1e9, "queue_bytes": 1, "netem": {"delay_s": 0.01, "loss": 2}}],
     "loss"),
])
def test_a_malformed_request_is_refused_naming_the_field(ops: list[dict[str, Any]], where: str) -> None:
    with pytest.raises(ValidationError) as err:
        NodeRequest.model_validate({"ops": ops})
    assert where in str(err.value)


class _FakeIpr:
    """pyroute2's IPRoute, stood in for: links by name, the calls made."""

    def __init__(self, links: dict[str, int]) -> None:
        self.links = links
        self.calls: list[tuple[str, tuple, dict]] = []
        self.closed = False

    def link_lookup(self, ifname: str) -> list[int]:
        return [self.links[ifname]] if ifname in self.links else []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self.calls.append((name, a, k))

    def get_links(self) -> list[Any]:
        def msg(name: str, idx: int) -> Any:
            attrs = {"IFLA_IFNAME": name, "IFLA_MTU": 1500, "IFLA_STATS64": {"tx_bytes": 100 * idx,
                                                                            "tx_packets": idx}}
            return SimpleNamespace(get_attr=attrs.get, __getitem__=None, index=idx)
        return [msg(n, i) for n, i in self.links.items()]

    def close(self) -> None:
        self.closed = True


def _ns(ipr: _FakeIpr) -> NodeNs:
    return NodeNs(lambda: ipr, lambda fn: fn(), Path("/nonexistent"))


def test_a_missing_interface_is_reported_in_the_reply_naming_node_and_interface() -> None:
    ipr = _FakeIpr({"lo": 1})
    reply = apply(NodeRequest(ops=[HostOp.model_validate(HOST)]), _ns(ipr))
    assert not reply.ok
    assert reply.error == "dc1-h1: interface h1-e0 is missing"
    assert ipr.closed  # the netlink socket is closed whatever happened


def test_counters_come_back_per_interface_and_a_failure_stops_the_later_operations() -> None:
    ipr = _FakeIpr({"lo": 1, "w-e0": 2, "w-e1": 3})
    reply = apply(NodeRequest(ops=[CountersOp(intfs=["w-e0", "w-e1"]), HostOp.model_validate(HOST),
                                   MtuOp(mtu=1400)]), _ns(ipr))
    assert reply.counters == {"w-e0": (200, 2), "w-e1": (300, 3)}
    assert not reply.ok and "h1-e0 is missing" in reply.error
    assert not any(name == "link" and k.get("mtu") == 1400 for name, _a, k in ipr.calls)


def test_sysctls_report_each_failure_and_skip_absent_ipv6_keys() -> None:
    reply = apply(NodeRequest(ops=[SysctlsOp(values={"net.ipv6.no_such_knob": "1",
                                                     "net.no_such_family.knob": "1"})]),
                  NodeNs(lambda: pytest.fail("sysctls need no netlink"), lambda fn: fn(), Path("/")))
    assert reply.ok
    assert len(reply.sysctl_errors) == 1 and reply.sysctl_errors[0].startswith("net.no_such_family.knob=1: ")


def test_rps_writes_the_mask_into_the_nodes_own_sysfs(tmp_path: Path) -> None:
    f = tmp_path / "sys/class/net/h1-e0/queues/rx-0/rps_cpus"
    f.parent.mkdir(parents=True)
    f.write_text("0")
    reply = apply(NodeRequest(ops=[RpsOp(mask="3")]), NodeNs(lambda: None, lambda fn: fn(), tmp_path))
    assert reply.ok and f.read_text() == "3"


def test_the_agent_loop_answers_each_line_and_refuses_a_malformed_one() -> None:
    stdin = io.StringIO(NodeRequest(ops=[CountersOp(intfs=["lo"])]).model_dump_json() + "\n"
                        + '{"ops": [{"op": "format-disk"}]}\n')
    stdout = io.StringIO()
    assert serve(stdin, stdout) == 0
    lines = stdout.getvalue().splitlines()
    assert json.loads(lines[0]) == {"ready": True}
    first, second = (NodeReply.model_validate_json(line) for line in lines[1:])
    assert first.ok and set(first.counters) == {"lo"}  # this process's own namespace, read for real
    assert not second.ok and second.error.startswith("invalid request")


def test_a_request_to_an_agent_names_its_node_by_a_real_pid() -> None:
    req = NodeRequest(ops=[MtuOp(mtu=1450)], pid=4242)
    assert NodeRequest.model_validate_json(req.model_dump_json()).pid == 4242
    for bad in (0, -1, "self"):
        with pytest.raises(ValidationError, match="pid"):
            NodeRequest.model_validate({"ops": [{"op": "mtu", "mtu": 1450}], "pid": bad})
