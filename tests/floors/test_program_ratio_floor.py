"""The pipelining example's targets (root, a quiet machine): with BACKEND=atlas its
seconds per step across the 2dc WAN are at most 1/4 of gloo's, and inside one DC
(topologies/1dc-lan.yaml) within 10% of gloo's. Asserted under `make floors` only
(TESTBED_FLOOR_TESTS=1); scripts/program_ratio.py prints and saves the same figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from testbed_core.constants import REPO_ROOT

pytestmark = [pytest.mark.root, pytest.mark.floor]


def _script():
    spec = importlib.util.spec_from_file_location("program_ratio", REPO_ROOT / "scripts" / "program_ratio.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["program_ratio"] = module
    spec.loader.exec_module(module)
    return module


def test_atlas_is_4x_faster_across_the_wan_and_as_fast_on_the_lan(tmp_path: Path) -> None:
    ratio = _script()
    wan = ratio.measure("wan", 6, tmp_path)
    lan = ratio.measure("lan", 6, tmp_path)
    figures = ratio.ratios(wan, lan)
    print(f"\n{figures}")
    assert figures["wan_atlas_over_gloo"] is not None and figures["wan_atlas_over_gloo"] <= 0.25, figures
    assert figures["lan_atlas_over_gloo"] is not None and figures["lan_atlas_over_gloo"] <= 1.10, figures
