"""The emulated device holds for the time it is asked to, within 20 ms (the unit tests,
tests/unit/runtime/test_device.py, check only that it never holds for less): how late a
sleeping thread wakes depends on the machine's load, so the upper bound is a floor,
asserted under `make floors` (TESTBED_FLOOR_TESTS=1, on a quiet machine)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testbed_core.compute_model import ComputeModel, gpu_spec
from testbed_runtime.device import Device

pytestmark = pytest.mark.floor


def test_modelled_work_holds_the_device_for_its_duration(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path, time_scale=1.0)
    rec = dev.run("forward", "train:p0r0", duration_s=0.05, label="F0")
    print(f"\n0.05 s of modelled work held the device {rec.duration:.4f} s")
    assert rec.duration == pytest.approx(0.05, abs=0.02)


def test_time_scale_shrinks_the_wall_time(tmp_path: Path) -> None:
    cm = ComputeModel(gpu_spec("A100"), "bf16", efficiency=0.5)
    dev = Device("gpu0", tmp_path, compute=cm, time_scale=0.5)
    rec = dev.run("backward", "me", flops=156e12 * 0.1)  # 0.1 model seconds
    assert rec.duration == pytest.approx(0.05, abs=0.02)  # half of it on the wall clock


def test_work_with_a_function_holds_for_its_duration_and_reports_the_overrun(tmp_path: Path) -> None:
    dev = Device("gpu0", tmp_path, time_scale=1.0)
    rec = dev.run("forward", "me", duration_s=0.03, fn=lambda: 41 + 1)
    assert rec.duration == pytest.approx(0.03, abs=0.02)
    slow = dev.run("forward", "me", duration_s=0.01, fn=lambda: time.sleep(0.05))
    assert slow.overrun_s == pytest.approx(0.04, abs=0.02)
