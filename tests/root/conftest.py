"""Shared by the root tests that run whole scenarios on the emulated topology."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture
def namespaces() -> Callable[[], set[str]]:
    """The named network namespaces now (a run must leave none of its own behind)."""
    return _namespaces
