"""Random documents fed to every loader (topology, workload, scenario, sweep, link
trace, request trace, gpu profile): each either loads or raises the toolkit's own
ConfigError, whose message names the file and holds none of the libraries' internals. Anything else (a
traceback, a hang, a MemoryError) fails the test.

Three kinds of input: random bytes and text as a file; random YAML documents; and
valid documents with one field replaced by a random value (which reaches the
validators behind the first level of checks).

Each test draws 20 examples from a fixed seed (a few seconds in all); for a deeper run,
``TESTBED_FUZZ_EXAMPLES=600 TESTBED_FUZZ_RANDOM=1 pytest tests/unit/core/test_hostile_fuzz.py``."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubbletea_agent.requests import TraceSource
from testbed.run.scenario import load_scenario
from testbed.sweep import load_sweep
from testbed_core.compute_model import load_profile
from testbed_core.configfile import ConfigError
from testbed_core.constants import TOPOLOGIES_DIR, WORKLOADS_DIR
from testbed_core.topology import load_topology, load_trace
from testbed_core.workload import load_workload

INTERNALS = ("function-after", "function-before", "functools", " at 0x", "For further information",
             "Traceback", "<unicode string>")
FUZZ = settings(max_examples=int(os.environ.get("TESTBED_FUZZ_EXAMPLES", "20")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                derandomize=not os.environ.get("TESTBED_FUZZ_RANDOM"))

_counter = itertools.count()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "base.yaml").write_text(yaml.safe_dump(scenario_doc()))
    return root


def topology_doc() -> dict[str, Any]:
    doc = yaml.safe_load((TOPOLOGIES_DIR / "2dc.yaml").read_text())
    doc["wan"][0]["changes"] = [{"at": "1s", "rate": "500Mbit"}, {"at": "2s", "delay": "30ms", "jitter": "1ms"}]
    doc["addressing"] = {"lan_base": "10.200.0.0/16", "wan_base": "10.201.0.0/16"}
    return doc


def workload_doc() -> dict[str, Any]:
    doc = yaml.safe_load((WORKLOADS_DIR / "tiny.yaml").read_text())
    doc["iterations"], doc["warmup"] = 1, 0
    return doc


def scenario_doc() -> dict[str, Any]:
    return {"name": "fz", "topology": topology_doc(), "workload": workload_doc(),
            "variants": ["baseline", "atlas"], "transport": {"streams": 4, "chunk": "1MiB"},
            "bubbletea": {"enabled": False, "requests": {"rate": 5}}, "runner": {"local": True}}


def sweep_doc() -> dict[str, Any]:
    return {"name": "fz", "base": "base.yaml", "parameters": {"transport.streams": [1, 2]},
            "set": {"topology.wan.0.delay": "5ms"}}


def check(load: Callable[[Path], object], path: Path) -> None:
    """`load(path)` succeeds or raises ConfigError with a clean message."""
    try:
        load(path)
    except ConfigError as exc:
        msg = str(exc)
        assert msg.strip(), "an empty message"
        for word in INTERNALS:
            assert word not in msg, f"{word!r} in:\n{msg}"


def write(folder: Path, data: bytes | str, suffix: str = ".yaml") -> Path:
    path = folder / f"doc{next(_counter)}{suffix}"
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def _trace(path: Path) -> object:
    return load_trace(path, 0.1)


def _requests(path: Path) -> object:
    return TraceSource(path=path).requests()


YAML_LOADERS: dict[str, Callable[[Path], object]] = {
    "topology": load_topology, "workload": load_workload, "scenario": load_scenario, "sweep": load_sweep,
    "profile": load_profile,
}
ALL_LOADERS = {**YAML_LOADERS, "link trace": _trace, "request trace": _requests}

# ---------------------------------------------------------------------------- strategies

TRICKY = ["1Gbit", "25ms", "auto", "yes", "on", "off", "no", "1:30", "0x10", "0o17", "012", ".inf", "-.inf",
          ".nan", "-5ms", "1e999", "1e-999", "100Tbit", "5MBps", "1Gbyte", "", " ", "~", "null", "true",
          "1_000", "2001-12-14", "<<", "&a", "*a", "!!binary aGk=", "10%", "-1", "0", "18446744073709551617",
          "dc1", "dc9", "h1", "../x", "/dev/zero", "/etc/passwd", "base.yaml"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(TRICKY),
)
documents = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8) | st.sampled_from(TRICKY),
                                                              kids, max_size=4),
    max_leaves=20,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, prefix + (i,))
    return out


def mutated(doc: dict[str, Any], draw: Any) -> dict[str, Any]:
    """`doc` with one field (or a new key at some level) replaced by a random value."""
    doc = copy.deepcopy(doc)
    path = draw(st.sampled_from(_paths(doc)))
    value = draw(documents)
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, dict) and draw(st.booleans()):
        node[draw(st.sampled_from(TRICKY + ["rate", "delay", "hosts", "dp", "seed"]))] = value
    else:
        node[path[-1]] = value
    return doc


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("kind", ALL_LOADERS)
@FUZZ
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_random_bytes(folder: Path, kind: str, data: bytes) -> None:
    check(ALL_LOADERS[kind], write(folder, data))


@pytest.mark.parametrize("kind", YAML_LOADERS)
@FUZZ
@given(doc=documents)
def test_random_documents(folder: Path, kind: str, doc: Any) -> None:
    check(YAML_LOADERS[kind], write(folder, yaml.safe_dump(doc)))


def profile_doc() -> dict[str, Any]:
    return {"ops": {"forward": 0.01, "backward": 0.02}}


_VALID = {"topology": topology_doc, "workload": workload_doc, "scenario": scenario_doc, "sweep": sweep_doc,
          "profile": profile_doc}


@pytest.mark.parametrize("kind", YAML_LOADERS)
@FUZZ
@given(data=st.data())
def test_one_field_replaced(folder: Path, kind: str, data: st.DataObject) -> None:
    doc = mutated(_VALID[kind](), data.draw)
    check(YAML_LOADERS[kind], write(folder, yaml.safe_dump(doc)))


@FUZZ
@given(lines=st.lists(st.integers(min_value=-5, max_value=10**7).map(str) | st.sampled_from(TRICKY), max_size=30))
def test_random_link_traces(folder: Path, lines: list[str]) -> None:
    check(_trace, write(folder, "\n".join(lines) + "\n", ".trace"))


@FUZZ
@given(rows=st.lists(st.tuples(scalars.map(str), scalars.map(str)), max_size=20))
def test_random_request_traces(folder: Path, rows: list[tuple[str, str]]) -> None:
    text = "TIMESTAMP,ContextTokens\n" + "".join(f"{a},{b}\n" for a, b in rows)
    check(_requests, write(folder, text, ".csv"))


def test_the_valid_documents_load(folder: Path) -> None:
    """The fuzzing starts from documents that load, so a mutation reaches the field."""
    for kind, make in _VALID.items():
        path = write(folder, yaml.safe_dump(make()))
        YAML_LOADERS[kind](path)
