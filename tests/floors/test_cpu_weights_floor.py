"""CPU weights on this machine's kernel (root): busy processes at an agent's nice level
(-10) next to a worker-like process (2 ms of CPU, then a 3 ms sleep), with and
without their cgroup at 0.1 of a normal weight (testbed/run/cpu.py). Without
it the worker's CPU work stretches many times over; with it, far less. A ratio of
durations that depends on the machine and its load: asserted under `make floors`
(TESTBED_FLOOR_TESTS=1, on a quiet machine) and printed; the default suite checks the
group itself (tests/root/test_cpu_weights_root.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.run.cpu import create_group, find_controller

pytestmark = [pytest.mark.root, pytest.mark.floor]

WORKER = r"""
import time
def spin(s):
    t = time.thread_time()
    while time.thread_time() - t < s:
        pass
ratios, end = [], time.time() + {seconds}
while time.time() < end:
    t0 = time.perf_counter(); spin(0.002); ratios.append((time.perf_counter() - t0) / 0.002); time.sleep(0.003)
ratios.sort()
print(ratios[len(ratios) // 2])
"""


def _worker_stretch(seconds: float) -> float:
    out = subprocess.run([sys.executable, "-c", WORKER.format(seconds=seconds)], capture_output=True, text=True,
                         check=True, timeout=60)
    return float(out.stdout)


def _stretch_next_to_busy_agents(weight: float | None) -> float:
    busy = [subprocess.Popen(["nice", "-n", "-10", sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]
    group = None
    try:
        if weight is not None:
            group, how = create_group(f"tbtest-weights-{os.getpid()}", weight)
            assert group is not None, how
            for p in busy:
                group.add(p.pid)
        return _worker_stretch(2.0)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if group is not None:
            group.remove()
            assert not group.path.exists()


@pytest.mark.timeout(120)
def test_agents_weight_keeps_the_worker_running() -> None:
    if find_controller() is None:
        pytest.skip("no cpu cgroup controller on this machine")
    plain = _stretch_next_to_busy_agents(None)
    weighed = _stretch_next_to_busy_agents(0.1)
    print(f"worker's 2 ms of CPU took {plain:.1f}x next to busy nice -10 processes, {weighed:.1f}x with them "
          "in a cgroup at 0.1 of a normal weight (median)")
    assert weighed < plain / 3, (plain, weighed)
    assert not list(Path(find_controller()[1]).glob(f"tbtest-weights-{os.getpid()}"))
