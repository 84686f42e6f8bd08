"""Test-suite wiring: tests marked `root` need root and network namespaces and are
skipped (with the reason) elsewhere."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root and network namespaces (run as root, e.g. sudo make test)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)
