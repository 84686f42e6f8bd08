"""Hostile files, by class: every loader (topology, workload, scenario, sweep, link
trace, request trace) refuses what is not a usable file with the file named and what
is allowed, before anything is built, and never with a traceback or library internals.

The classes: not a file (missing, a directory, a pipe), too big, not text (binary,
not UTF-8), too deep, aliases that expand, recursive aliases, duplicate keys, merge
keys, YAML 1.1 coercions (yes/on, 1:30, 012), true/inf/nan where a number is expected.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bubbletea_agent.requests import TraceSource
from testbed.run.scenario import load_scenario
from testbed.sweep import load_sweep
from testbed_core.compute_model import load_profile
from testbed_core.configfile import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_NODES, ConfigError
from testbed_core.constants import SCENARIOS_DIR, TOPOLOGIES_DIR, WORKLOADS_DIR
from testbed_core.topology import load_topology, load_trace
from testbed_core.workload import load_workload

INTERNALS = ("function-after", "function-before", "functools", " at 0x", "For further information",
             "pydantic", "Traceback", "<unicode string>", "literal[")


def _scenario(path: Path) -> object:
    return load_scenario(path)


def _trace(path: Path) -> object:
    return load_trace(path, 0.1)


def _requests(path: Path) -> object:
    return TraceSource(path=path).requests()


LOADERS: dict[str, Callable[[Path], object]] = {
    "topology": load_topology,
    "workload": load_workload,
    "scenario": _scenario,
    "sweep": load_sweep,
    "link trace": _trace,
    "request trace": _requests,
    "profile": load_profile,  # a workload's gpu.profile
}
YAML_LOADERS = {k: v for k, v in LOADERS.items() if k in ("topology", "workload", "scenario", "sweep", "profile")}


def refused(load: Callable[[Path], object], path: Path, *needles: str) -> str:
    """The message of the ConfigError `load(path)` raises; it names the file, holds
    every needle and none of the library's internals."""
    with pytest.raises(ConfigError) as info:
        load(path)
    msg = str(info.value)
    assert path.name in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in:\n{msg}"
    for word in INTERNALS:
        assert word not in msg, f"{word!r} in:\n{msg}"
    return msg


# ---------------------------------------------------------------------------- not a file, not text


@pytest.mark.parametrize("kind", LOADERS)
def test_missing_file(kind: str, tmp_path: Path) -> None:
    refused(LOADERS[kind], tmp_path / "absent.yaml", "no such", kind)


@pytest.mark.parametrize("kind", LOADERS)
def test_directory(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    refused(LOADERS[kind], folder, "is a directory", f"a {kind} file is expected")


@pytest.mark.parametrize("kind", LOADERS)
def test_pipe_is_not_read(kind: str, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    refused(LOADERS[kind], fifo, "not a regular file")


@pytest.mark.parametrize("kind", LOADERS)
def test_binary(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"name: x\n\x00\x01\x02\xff")
    refused(LOADERS[kind], path, "binary data", "NUL byte at offset 8", "UTF-8 text")


@pytest.mark.parametrize("kind", LOADERS)
def test_not_utf8(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\ndescription: caf\u00e9\n".encode("latin-1"))
    refused(LOADERS[kind], path, "not UTF-8 text", "byte 0xe9 on line 2", "save the")


@pytest.mark.parametrize("kind", YAML_LOADERS)
def test_too_big(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    refused(LOADERS[kind], path, "too big", "at most 1MiB")


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + (TOPOLOGIES_DIR / "2dc.yaml").read_bytes())
    assert load_topology(path).name == "2dc"


@pytest.mark.parametrize("kind", ["link trace", "request trace"])
def test_trace_too_big(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bubbletea_agent.requests
    import testbed_core.topology

    monkeypatch.setattr(testbed_core.topology, "MAX_TRACE_BYTES", 1000)
    monkeypatch.setattr(bubbletea_agent.requests, "MAX_TRACE_BYTES", 1000)
    path = tmp_path / "big.trace"
    path.write_text("TIMESTAMP,ContextTokens\n" + "1,1\n" * 1000)
    refused(LOADERS[kind], path, "too big", f"a {kind} file", "at most 1000B")


# ---------------------------------------------------------------------------- structure


def _write(tmp_path: Path, text: str, name: str = "doc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("kind", YAML_LOADERS)
def test_flow_nesting_too_deep_is_refused_fast(kind: str, tmp_path: Path) -> None:
    # PyYAML's scanner is quadratic in flow depth: 100k '[' took minutes before the cap
    path = _write(tmp_path, "name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    refused(LOADERS[kind], path, f"nesting deeper than {MAX_DEPTH} levels", "line 1")


def test_block_nesting_too_deep(tmp_path: Path) -> None:
    text = "name: x\ndeep:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)) + "  " * 40 + "v: 1\n"
    refused(load_topology, _write(tmp_path, text), "nesting deeper than")


@pytest.mark.parametrize("kind", YAML_LOADERS)
def test_alias_bomb(kind: str, tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    refused(LOADERS[kind], path, f"more than {MAX_NODES} values", "aliases")


def test_alias_chain_too_deep(tmp_path: Path) -> None:
    # each alias adds 30 levels: few nodes, but a document too deep for json.dumps or deepcopy
    lines = ["a0: &a0 " + "[" * 30 + "x" + "]" * 30]
    lines += [f"a{i}: &a{i} " + "[" * 30 + f"*a{i - 1}" + "]" * 30 for i in range(1, 60)]
    refused(load_sweep, _write(tmp_path, "\n".join(lines) + "\n"), f"aliases nest the document deeper than {MAX_DEPTH}")


def test_modest_aliases_are_fine(tmp_path: Path) -> None:
    text = (TOPOLOGIES_DIR / "2dc.yaml").read_text().replace("tcp:\n", "tcp: &tcp\n")
    text = text.replace("    lan_rate: 10Gbit\n", "    lan_rate: 10Gbit\n    tcp: *tcp\n")
    topo = load_topology(_write(tmp_path, text))
    assert topo.dcs[0].tcp == topo.tcp


def test_recursive_alias(tmp_path: Path) -> None:
    refused(load_topology, _write(tmp_path, "name: &n [a, *n]\n"), "refers to the mapping or list that contains it")


def test_undefined_alias(tmp_path: Path) -> None:
    refused(load_topology, _write(tmp_path, "name: *nowhere\n"), "undefined alias", "line 1")


@pytest.mark.parametrize("kind", YAML_LOADERS)
def test_duplicate_keys(kind: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "name: first\ndescription: d\nname: second\n")
    refused(LOADERS[kind], path, "duplicate key 'name'", "first given on line 1", "line 3")


def test_duplicate_keys_deep_inside(tmp_path: Path) -> None:
    text = (TOPOLOGIES_DIR / "2dc.yaml").read_text().replace("    delay: 25ms", "    delay: 25ms\n    delay: 5ms")
    refused(load_topology, _write(tmp_path, text), "duplicate key 'delay'")


def test_merge_keys_refused(tmp_path: Path) -> None:
    refused(load_topology, _write(tmp_path, "base: &b {rate: 1Gbit}\nlink:\n  <<: *b\n"),
            "merge keys ('<<') are not supported")


def test_several_documents(tmp_path: Path) -> None:
    refused(load_workload, _write(tmp_path, "name: a\n---\nname: b\n"), "expected a single document")


def test_not_a_mapping(tmp_path: Path) -> None:
    refused(load_topology, _write(tmp_path, "- a\n- b\n"), "must be a YAML mapping")
    refused(load_workload, _write(tmp_path, "", "empty.yaml"), "got an empty file")


def test_unsafe_tags_refused(tmp_path: Path) -> None:
    refused(load_topology, _write(tmp_path, "name: !!python/object:os.system ls\n"),
            "could not determine a constructor")


def test_huge_integer_literal(tmp_path: Path) -> None:
    text = yaml.safe_dump(yaml.safe_load((WORKLOADS_DIR / "tiny.yaml").read_text()))
    text = text.replace("layers: ", "layers: " + "9" * 5000 + " #", 1)
    refused(load_workload, _write(tmp_path, text), "more than 100 digits")


# ---------------------------------------------------------------------------- coercions


def _topology_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (TOPOLOGIES_DIR / "2dc.yaml").read_text()
    assert old in text
    return _write(tmp_path, text.replace(old, new))


@pytest.mark.parametrize("word", ["yes", "on", "Off", "n"])
def test_yaml11_words_are_not_rates(word: str, tmp_path: Path) -> None:
    # YAML 1.1 read these as booleans and pydantic took true as 1 bit/s
    refused(load_topology, _topology_with(tmp_path, "rate: 1Gbit", f"rate: {word}"),
            "wan.0.rate", f"{word!r} is not a rate")


def test_sexagesimal_is_not_a_number(tmp_path: Path) -> None:
    # YAML 1.1 read 1:30 as 90 (seconds, silently)
    refused(load_topology, _topology_with(tmp_path, "delay: 25ms", "delay: 1:30"),
            "wan.0.delay", "'1:30' is not a duration")


def test_true_is_not_a_number(tmp_path: Path) -> None:
    refused(load_topology, _topology_with(tmp_path, "rate: 1Gbit", "rate: true"), "true is a yes/no value")
    wl = (WORKLOADS_DIR / "tiny.yaml").read_text()
    assert "iterations: 3\n" in wl
    path = _write(tmp_path, wl.replace("iterations: 3\n", "iterations: true\n"), "w.yaml")
    refused(load_workload, path, "iterations: true is a yes/no value; this field takes a number")


def test_leading_zero_is_decimal(tmp_path: Path) -> None:
    topo = load_topology(_topology_with(tmp_path, "hosts: 2\n    lan_rate: 10Gbit\n  - name: dc2",
                                        "hosts: 010\n    lan_rate: 10Gbit\n  - name: dc2"))
    assert len(topo.dcs[0].hosts) == 10  # YAML 1.1 read 010 as octal 8


def test_yes_is_still_a_yes_for_yes_no_fields(tmp_path: Path) -> None:
    path = _topology_with(tmp_path, "  wmem_max: 1MB", "  wmem_max: 1MB\n  slow_start_after_idle: no")
    assert load_topology(path).tcp.slow_start_after_idle is False


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999"])
def test_infinities_and_nans(value: str, tmp_path: Path) -> None:
    refused(load_topology, _topology_with(tmp_path, "rate: 1Gbit", f"rate: {value}"), "wan.0.rate", "not a finite")


def test_inf_in_a_plain_number_field(tmp_path: Path) -> None:
    wl = (WORKLOADS_DIR / "tiny.yaml").read_text()
    assert "scale: 1.0" in wl
    refused(load_workload, _write(tmp_path, wl.replace("scale: 1.0", "scale: .nan")), "scale: must be a finite number")


# ---------------------------------------------------------------------------- the files that contain others


def test_scenario_names_the_inner_file(tmp_path: Path) -> None:
    inner = _write(tmp_path, "name: t\nname: u\n", "topo.yaml")
    scenario = (SCENARIOS_DIR / "quickstart.yaml").read_text()
    text = "\n".join(f"topology: {inner}" if line.startswith("topology:") else line
                     for line in scenario.splitlines())
    text = text.replace("workload: workloads/", f"workload: {WORKLOADS_DIR}/")
    msg = refused(load_scenario, _write(tmp_path, text, "s.yaml"), "duplicate key 'name'")
    assert "topo.yaml" in msg


def test_sweep_grid_too_big(tmp_path: Path) -> None:
    text = (f"name: big\nbase: {SCENARIOS_DIR / 'quickstart.yaml'}\nparameters:\n"
            "  transport.streams: {from: 1, to: 64, steps: 64}\n"
            "  topology.wan.0.delay: {from: 1ms, to: 200ms, steps: 200}\n")
    refused(load_sweep, _write(tmp_path, text, "sweep.yaml"), "12800 runs (64 x 200)", "more than 10000")


def test_sweep_steps_capped(tmp_path: Path) -> None:
    text = (f"name: big\nbase: {SCENARIOS_DIR / 'quickstart.yaml'}\nparameters:\n"
            "  transport.streams: {from: 1, to: 8, steps: 1000000000}\n")
    refused(load_sweep, _write(tmp_path, text, "sweep.yaml"), "steps", "less than or equal to 10000")


def test_sweep_repeat_capped(tmp_path: Path) -> None:
    text = (f"name: big\nbase: {SCENARIOS_DIR / 'quickstart.yaml'}\nrepeat: 100000\nparameters:\n"
            "  transport.streams: [1, 2]\n")
    refused(load_sweep, _write(tmp_path, text, "sweep.yaml"), "at most 1000 runs per point")
