"""Shared by the root tests that run whole scenarios on the emulated topology."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest

from testbed.emulation.netns import named_netns

# testbed.emulation.netns.unique_netns_name: <prefix><pid>-<n>
_TEMPORARY = re.compile(r"[A-Za-z]+(\d+)-\d+")


def _namespaces() -> set[str]:
    """The named namespaces now, less the temporary ones of other processes (another test,
    another checkout's run of the suite, made with testbed.emulation.netns.temporary_netns)."""
    names = set(named_netns())
    return {n for n in names if not ((m := _TEMPORARY.fullmatch(n)) and int(m.group(1)) != os.getpid())}


@pytest.fixture
def namespaces() -> Callable[[], set[str]]:
    """The named network namespaces now (a run must leave none of its own behind);
    concurrent tests' temporary namespaces are not counted."""
    return _namespaces
