"""Run prefixes and node/interface names: the limits that keep them under IFNAMSIZ."""

from __future__ import annotations

import pytest

from testbed.emulation.naming import (
    IFNAMSIZ,
    NamingError,
    RunNames,
    check_topology_fits,
    new_prefix,
    validate_prefix,
)


def test_names_fit_ifnamsiz_at_the_limits():
    names = RunNames("tbfff")
    worst = [names.host(35, 63), names.gateway(35), names.wan(34, 35)]
    assert worst == ["tbfffdzh64", "tbfffgz", "tbfffwyz"]
    for node in worst:
        assert len(RunNames.intf(node, 99 if "g" in node[5] else 1)) <= IFNAMSIZ
    assert RunNames.intf(names.host(0, 0), 0) == "tbfffd0h1-eth0"
    with pytest.raises(NamingError, match="at most 36 DCs"):
        names.gateway(36)
    with pytest.raises(NamingError, match="at most 64 per DC"):
        names.host(0, 64)
    with pytest.raises(NamingError, match="longer than 15"):
        RunNames.intf("tbfffd0h64xyz", 0)


def test_prefix_rules():
    assert validate_prefix("tb3a7") == "tb3a7"
    with pytest.raises(NamingError, match="'tb' followed by 3 lowercase hex digits"):
        validate_prefix("xx123")
    taken = {f"tb{i:03x}" for i in range(4095)}  # all but tbfff
    assert new_prefix(lambda p: p in taken, attempts=100000) == "tbfff"
    with pytest.raises(NamingError, match="testbed clean"):
        new_prefix(lambda p: True, attempts=5)
    with pytest.raises(NamingError, match="at most 36"):
        check_topology_fits(37, [1] * 37)
