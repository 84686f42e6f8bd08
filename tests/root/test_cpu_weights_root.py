"""CPU weights on this machine's kernel (root, testbed/run/cpu.py): a group at 0.1
of a normal weight carries that weight in its cgroup file, takes the processes moved
into it, and is gone after `remove`, its processes back in the parent group and still
running. What the weight does under contention (a ratio of durations) is measured by
tests/floors/test_cpu_weights_floor.py (make floors)."""

from __future__ import annotations

import os
import subprocess

import pytest

from testbed.run.cpu import create_group, find_controller, weight_value

pytestmark = pytest.mark.root


def test_a_weighted_group_holds_its_processes_and_is_removed() -> None:
    found = find_controller()
    if found is None:
        pytest.skip("no cpu cgroup controller on this machine")
    version, base = found
    recorded = []
    proc = subprocess.Popen(["sleep", "60"])
    try:
        group, how = create_group(f"tbtest-weights-{os.getpid()}", 0.1, record=recorded.append)
        assert group is not None, how
        assert recorded == [group.path] and group.path.parent == base
        weight_file = "cpu.weight" if version == 2 else "cpu.shares"
        assert (group.path / weight_file).read_text().strip() == str(weight_value(version, 0.1))
        assert "0.1 of a normal" in how
        group.add(proc.pid)
        assert group.pids() == [proc.pid]
        group.remove()
        assert not group.path.exists()
        assert proc.poll() is None  # moved back to the parent group, not ended
    finally:
        proc.kill()
        proc.wait()
