"""Issue targets on how fast the emulation builds and tears down (root): the
3dc-triangle (12 hosts, 18 nodes) built in under 10 s and torn down in under 5 s.
Durations that depend on the machine's speed and load: asserted under `make floors`
(TESTBED_FLOOR_TESTS=1, on a quiet machine) and printed; the default suite checks the
same build for correctness (tests/root/test_emulation.py) and prints its times."""

from __future__ import annotations

import pytest

from testbed.emulation.network import Emulation
from testbed_core.constants import TOPOLOGIES_DIR

pytestmark = [pytest.mark.root, pytest.mark.floor]


def test_triangle_builds_in_under_10_s_and_tears_down_in_under_5_s() -> None:
    with Emulation.from_file(TOPOLOGIES_DIR / "3dc-triangle.yaml") as emu:
        assert len(emu.hosts()) == 12
    print(f"\n3dc-triangle: built in {emu.build_s:.2f} s, torn down in {emu.teardown_s:.2f} s")
    assert emu.build_s < 10, f"built in {emu.build_s:.2f} s; the issue's target is under 10 s"
    assert emu.teardown_s is not None and emu.teardown_s < 5, (
        f"torn down in {emu.teardown_s} s; the issue's target is under 5 s")
