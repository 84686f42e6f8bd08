"""An unknown field's message points at the page that describes the format, and that page exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed_core.configfile import FORMAT_PAGES, format_page
from testbed_core.topology import TopologyError, parse_topology

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("kind", sorted(FORMAT_PAGES))
def test_every_format_page_named_exists(kind: str) -> None:
    assert (REPO / format_page(kind)).is_file()


def test_an_unknown_topology_field_names_the_topology_page() -> None:
    with pytest.raises(TopologyError) as err:
        parse_topology({"name": "t", "dcs": [{"name": "a", "hosts": 1}], "wan": [], "colour": "red"}, "t.yaml")
    assert "colour: unknown field (check the spelling; the topology format: docs/reference/formats/topology.md)" \
        in str(err.value)
