"""Physically absurd values are refused when a file is validated, with the bound in
the message, including every limit the emulation's builder, shaper, delay line or
transport would otherwise hit only once built; and those limits still match the
emulation's own constants."""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bubbletea_agent.requests import TraceSource
from testbed.run.scenario import ScenarioError, validate_scenario
from testbed_core import topology as topo_mod
from testbed_core.configfile import ConfigError
from testbed_core.constants import WORKLOADS_DIR
from testbed_core.topology import TopologyError, load_trace, parse_topology
from testbed_core.workload import WorkloadError, parse_workload

INTERNALS = ("function-after", "function-before", "functools", " at 0x", "For further information", "literal[")


def base() -> dict[str, Any]:
    return {
        "name": "t",
        "dcs": [{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": 2}],
        "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}],
    }


def topo_error(data: dict[str, Any], *needles: str) -> str:
    with pytest.raises(TopologyError) as info:
        parse_topology(data, "t.yaml")
    msg = str(info.value)
    assert msg.startswith("t.yaml: ")
    for needle in needles:
        assert needle in msg, f"{needle!r} not in:\n{msg}"
    for word in INTERNALS:
        assert word not in msg, msg
    return msg


def with_link(**fields: Any) -> dict[str, Any]:
    data = base()
    data["wan"][0].update(fields)
    return data


# ---------------------------------------------------------------------------- topology


@pytest.mark.parametrize(("fields", "needles"), [
    ({"rate": "100Tbit"}, ("wan.0.rate", "rate 100Tbit is out of range: allowed 1kbit to 10Tbit")),
    ({"rate": "10bit"}, ("wan.0.rate", "allowed 1kbit to 10Tbit")),
    ({"rate": 0}, ("wan.0.rate", "greater than 0")),
    ({"delay": "1h"}, ("wan.0.delay", "unknown time unit 'h'")),
    ({"delay": "11s"}, ("wan.0.delay", "delay 11s is out of range: allowed 0s to 10s")),
    ({"jitter": "20s"}, ("wan.0.jitter", "allowed 0s to 10s")),
    ({"jitter": "30ms"}, ("jitter (30ms) must not exceed delay (25ms)",)),
    ({"loss": 1.5}, ("wan.0.loss", "less than or equal to 1")),
    ({"queue": 100}, ("wan.0.queue", "queue 100B is out of range: allowed 1514B to 2GiB")),
    ({"queue": -5}, ("wan.0.queue", "queue -5B is out of range: allowed 1514B to 2GiB")),
    ({"queue": "3GiB"}, ("wan.0.queue", "allowed 1514B to 2GiB", "bfifo")),
    ({"queue": True}, ("wan.0.queue", "queue must be 'auto'",)),
    ({"queue": "lots"}, ("wan.0.queue", "queue must be 'auto' or a size: 'lots' is not a size")),
    ({"rate": "10Tbit", "delay": "1s"}, ("in flight one way", "above the 256MiB the delay line can hold")),
    ({"trace_bin": "0.1ms"}, ("wan.0.trace_bin", "allowed 1ms to 10s")),
    ({"changes": [{"at": "2d"}]}, ("wan.0.changes.0.at", "unknown time unit")),
    ({"changes": [{"at": 100000}]}, ("wan.0.changes.0.at", "allowed 0s to 86400s")),
    ({"changes": [{"at": 1, "jitter": "40ms"}]}, ("changes.0: jitter (40ms) must not exceed delay (25ms)",)),
    ({"changes": [{"at": 1, "rate": "10Gbit"}, {"at": 2, "delay": "2s"}]},
     ("changes.1: rate x (delay + jitter)", "above the 256MiB")),
    ({"changes": [{"at": i} for i in range(10_001)]}, ("wan.0.changes", "at most 10000 items")),
])
def test_link_bounds(fields: dict[str, Any], needles: tuple[str, ...]) -> None:
    topo_error(with_link(**fields), *needles)


def test_prediction_only_topologies_have_no_delay_line_limit() -> None:
    data = with_link(rate="100Gbit", delay="100ms")  # 1.2GiB in flight: too much for the delay line
    topo_error(data, "wan.0: rate x (delay + jitter) is 1.16GiB in flight one way")
    data["dcs"] = [{"name": "dc1", "gpus": 4096}, {"name": "dc2", "gpus": 4096}]
    assert parse_topology(data).wan[0].rate == 100e9


def test_largest_sensible_link_is_accepted() -> None:
    topo = parse_topology(with_link(rate="10Gbit", delay="200ms", jitter="10ms", queue="64MiB"))
    assert topo.wan[0].rate == 10e9


@pytest.mark.parametrize(("tcp", "needle"), [
    ({"rmem_max": 1024}, "tcp.rmem_max: buffer 1024B is out of range: allowed 4096B to 2GiB"),
    ({"wmem_max": "4GiB"}, "tcp.wmem_max: buffer 4GiB is out of range"),
    ({"congestion_control": "warp"}, "tcp.congestion_control: Input should be 'cubic'"),
])
def test_tcp_bounds(tcp: dict[str, Any], needle: str) -> None:
    data = base()
    data["tcp"] = tcp
    topo_error(data, needle)


def test_host_and_dc_counts() -> None:
    data = base()
    data["dcs"][0]["hosts"] = 65
    topo_error(data, "dcs.0.hosts: hosts must be between 1 and 64, got 65")
    data["dcs"][0]["hosts"] = "yes"  # YAML 1.1 made it true, pydantic 1 host
    topo_error(data, "dcs.0.hosts: hosts must be a count (e.g. 2) or a list of host names, got 'yes'")
    data["dcs"][0]["hosts"] = [f"h{i}" for i in range(65)]
    topo_error(data, "dcs.0.hosts: at most 64 hosts per DC", "got 65")
    data = base()
    data["dcs"] = [{"name": f"d{i}", "hosts": 1} for i in range(37)]
    data["wan"] = [{"between": ["d0", f"d{i}"], "rate": "1Gbit", "delay": "1ms"} for i in range(1, 37)]
    topo_error(data, "at most 36 DCs with hosts", "got 37")
    data["dcs"] = [{"name": f"d{i}", "hosts": 1} for i in range(1001)]
    topo_error(data, "dcs: List should have at most 1000 items")


def test_addresses_must_not_overlap() -> None:
    data = base()
    data["addressing"] = {"lan_base": "10.0.0.0/8", "wan_base": "10.201.0.0/16"}
    topo_error(data, "addressing: lan_base 10.0.0.0/8 and wan_base 10.201.0.0/16 overlap")


def test_limits_match_the_emulation() -> None:
    """The bounds stated in topology files are the builder's, shaper's and delay
    line's own limits; if one of those changes, the bound must follow."""
    from testbed.emulation import naming, shaping
    from testbed.emulation.delayline import __main__ as relay_main
    from testbed.emulation.nodes import tcp_sysctls
    from testbed_core.units import parse_size

    assert topo_mod.MAX_EMULATED_DCS == naming.MAX_DCS
    assert topo_mod.MAX_HOSTS_PER_DC == naming.MAX_HOSTS_PER_DC
    assert topo_mod.QUEUE_MIN_BYTES == shaping.ETH_FRAME
    default = re.search(r'"--max-queue", default="([^"]+)"', inspect.getsource(relay_main))
    assert default is not None and parse_size(default.group(1)) == topo_mod.MAX_IN_FLIGHT_BYTES
    assert tcp_sysctls(8192, 8192, "cubic")["net.ipv4.tcp_rmem"].split()[0] == str(topo_mod.TCP_BUFFER_MIN)
    # the largest delay and jitter pass netem's own check, the smallest rate the shaper's
    slowest = shaping.NetemParams(delay_s=topo_mod.MAX_DELAY_S, jitter_s=topo_mod.MAX_DELAY_S)
    shaping.egress_shaper("x", topo_mod.MIN_RATE_BPS, topo_mod.QUEUE_MIN_BYTES, slowest)
    shaping.egress_shaper("x", topo_mod.MAX_RATE_BPS, topo_mod.QUEUE_MAX_BYTES, None)
    # netem's packet limit (a u32) for the most bytes in flight a link may have
    rate, delay = 8 * topo_mod.MAX_IN_FLIGHT_BYTES / 0.5, 0.25  # rate x (delay + jitter) / 8 at the bound
    limit = shaping.netem_limit_packets(rate, shaping.NetemParams(delay, delay), topo_mod.QUEUE_MAX_BYTES)
    assert limit < 2**32
    # a topology at the bounds builds its address plan and names
    from testbed.emulation.addressing import plan_addresses

    data = {"name": "big", "dcs": [{"name": f"d{i}", "hosts": 64} for i in range(36)],
            "wan": [{"between": ["d0", f"d{i}"], "rate": "1Gbit", "delay": "1ms"} for i in range(1, 36)]}
    plan = plan_addresses(parse_topology(data))
    assert len(plan.dcs) == 36 and len(plan.dcs[-1].host_ips) == 64
    names = naming.RunNames("tb3a7")
    longest = f"{names.gateway(35)}-eth{64 + 35}"
    assert len(longest) <= naming.IFNAMSIZ and len(f"{names.host(35, 63)}-eth0") <= naming.IFNAMSIZ


# ---------------------------------------------------------------------------- link traces


@pytest.mark.parametrize(("text", "needle"), [
    ("10\n-5\n", "2: trace lines must be whole, non-negative millisecond timestamps, got '-5'"),
    ("10\n1.5\n", "2: trace lines must be whole"),
    ("10\n5\n", "2: timestamp 5 is before the previous one (10)"),
    ("# only a comment\n\n", "the trace is empty"),
    ("0\n99999999999\n", "a trace may give at most 10000 rate steps of trace_bin 100ms; raise trace_bin"),
    ("1\n" * 200_000, "deliveries in the 100 ms from 0 ms make 24Gbit"),
])
def test_link_trace_content(text: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topo_mod, "MAX_RATE_BPS", 1e10)  # so that a short trace can overflow it
    path = tmp_path / "link.trace"
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        load_trace(path, 0.1)
    assert "link.trace" in str(info.value) and needle in str(info.value), str(info.value)


def test_link_trace_in_a_topology_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "link.trace").write_text("x\n")
    data = with_link(trace="link.trace")
    with pytest.raises(TopologyError) as info:
        parse_topology(data, str(tmp_path / "t.yaml"))
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 't.yaml'}: wan.0.trace: {tmp_path / 'link.trace'}:1: trace lines"), msg


def test_link_trace_is_turned_into_steps(tmp_path: Path) -> None:
    (tmp_path / "link.trace").write_text("".join(f"{ms}\n" for ms in range(0, 1000, 2)))  # 6 Mbit/s
    topo = parse_topology(with_link(trace="link.trace", trace_bin="100ms"), str(tmp_path / "t.yaml"))
    steps = topo.wan[0].changes
    assert len(steps) == 10 and all(c.rate == pytest.approx(6e6) for c in steps[:-1])


# ---------------------------------------------------------------------------- request traces


@pytest.mark.parametrize(("text", "needle"), [
    ("TIMESTAMP,ContextTokens\n1,100000000\n", ":2: ContextTokens '100000000' is above 16777216 tokens"),
    ("TIMESTAMP,ContextTokens\n1,1e400\n", ":2: ContextTokens '1e400' is not a whole, non-negative token count"),
    ("TIMESTAMP,ContextTokens\n1," + "9" * 200_000 + "\n", "not a CSV trace (field larger than field limit"),
])
def test_request_trace_content(text: str, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "req.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        TraceSource(path=path).requests()
    assert needle in str(info.value), str(info.value)


def test_request_trace_row_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bubbletea_agent.requests as req

    monkeypatch.setattr(req, "MAX_TRACE_REQUESTS", 3)
    path = tmp_path / "req.csv"
    path.write_text("TIMESTAMP,ContextTokens\n" + "1,5\n" * 4)
    with pytest.raises(ConfigError, match=r"req.csv:5: more than 3 requests"):
        TraceSource(path=path).requests()


# ---------------------------------------------------------------------------- workloads and scenarios


def tiny() -> dict[str, Any]:
    return yaml.safe_load((WORKLOADS_DIR / "tiny.yaml").read_text())


@pytest.mark.parametrize(("path", "value", "needle"), [
    (("model", "layers"), 10**9, "model.layers: Input should be less than or equal to 10000"),
    (("model", "hidden"), 2**40, "model.hidden: Input should be less than or equal to 1048576"),
    (("parallelism", "dp"), 10**7, "parallelism.dp: Input should be less than or equal to 100000"),
    (("parallelism", "num_micro_batches"), 10**9, "less than or equal to 65536"),
    (("gpu", "efficiency"), float("inf"), "gpu.efficiency: must be a finite number"),
    (("iterations",), 10**12, "iterations: Input should be less than or equal to 100000"),
    (("model", "layers"), 4.5, "model.layers: Input should be a valid integer, got a number with a "
                                "fractional part (got 4.5)"),
])
def test_workload_bounds(path: tuple[str, ...], value: Any, needle: str) -> None:
    data = tiny()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(WorkloadError) as info:
        parse_workload(data, "w.yaml")
    assert needle in str(info.value), str(info.value)


def scenario(**changes: Any) -> dict[str, Any]:
    data = {"name": "s", "topology": base(), "workload": tiny(), "source": "s.yaml"}
    for dotted, value in changes.items():
        node = data
        keys = dotted.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return copy.deepcopy(data)


@pytest.mark.parametrize(("changes", "needle"), [
    ({"name": "../../etc"}, "name: String should match pattern"),
    ({"transport__chunk": "1GiB"}, "transport.chunk: chunk must be between 4096 bytes and 256MiB"),
    ({"transport__chunk": "1KiB"}, "transport.chunk: chunk must be between 4096 bytes"),
    ({"transport__streams": 1000}, "transport.streams: streams must be between 1 and 64"),
    ({"transport__congestion": "warp"}, "transport.congestion: Input should be 'cubic'"),
    ({"runner__setup_timeout": 1e9}, "runner.setup_timeout: Input should be less than or equal to 86400"),
    ({"seed": -1}, "seed: Input should be greater than or equal to 0"),
    ({"workload__model__seq_len": 2**24, "workload__model__hidden": 2**20, "workload__model__heads": 4},
     "above the transport's 16GiB per tensor: lower micro_batch or scale"),
    ({"bubbletea__enabled": True, "bubbletea__requests__rate": 1e9},
     "bubbletea.requests.rate: 1e+09 requests/s is above 100000"),
])
def test_scenario_bounds(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as info:
        validate_scenario(scenario(**changes))
    msg = str(info.value)
    assert needle in msg, msg
    for word in INTERNALS:
        assert word not in msg, msg


def test_request_trace_is_read_when_the_scenario_is_validated(tmp_path: Path) -> None:
    trace = tmp_path / "req.csv"
    trace.write_bytes(b"TIMESTAMP,ContextTokens\n\xff\xfe\n")
    data = scenario(bubbletea__enabled=True, bubbletea__requests__trace=str(trace))
    with pytest.raises(ScenarioError, match=r"s.yaml: bubbletea.requests.trace: .*req.csv: not UTF-8 text"):
        validate_scenario(data)
    trace.write_text("TIMESTAMP,ContextTokens\n1,5\n")
    assert validate_scenario(data).bubbletea.requests.trace == str(trace)
