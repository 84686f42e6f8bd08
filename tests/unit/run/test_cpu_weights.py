"""CPU weights for BubbleTea's processes (testbed/run/cpu.py) against fake cgroup
trees (v1 and v2), the reasons given when there is none, and CPU time from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.run.cpu import (
    RT_PERIOD_US,
    RT_RUNTIME_US,
    CpuGroupError,
    MachineReading,
    cpu_notes,
    cpu_seconds,
    create_group,
    find_controller,
    machine_busy_s,
    machine_cpu,
    machine_reading,
    weight_value,
)
from testbed_core.contracts.summary import MachineCpu


def v1_tree(tmp_path: Path) -> Path:
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.shares").write_text("1024\n")
    return tmp_path


def test_finds_v2_then_v1(tmp_path: Path) -> None:
    assert find_controller(tmp_path) is None
    v1_tree(tmp_path)
    assert find_controller(tmp_path) == (1, tmp_path / "cpu")
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert find_controller(tmp_path) == (2, tmp_path)
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")  # v2 without cpu: the v1 one
    assert find_controller(tmp_path) == (1, tmp_path / "cpu")


def test_weight_values_stay_in_the_kernel_bounds() -> None:
    assert weight_value(2, 0.1) == 10 and weight_value(2, 1e-6) == 1 and weight_value(2, 1.0) == 100
    assert weight_value(1, 0.1) == 102 and weight_value(1, 1e-6) == 2


def test_v1_group_gets_shares_and_a_realtime_budget(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    recorded: list[Path] = []

    def record(path: Path) -> None:
        recorded.append(path)
        assert not path.exists()  # recorded before it is made

    import testbed.run.cpu as cpu_mod

    real_mkdir = Path.mkdir

    def kernel_mkdir(self: Path, *a, **kw) -> None:  # noqa: ANN001 (the files the kernel makes in a cgroup)
        real_mkdir(self, *a, **kw)
        if self.parent == root / "cpu":
            for f in ("cgroup.procs", "cpu.shares", "cpu.rt_runtime_us", "cpu.rt_period_us"):
                (self / f).write_text("")

    mp = pytest.MonkeyPatch()
    mp.setattr(Path, "mkdir", kernel_mkdir)
    try:
        group, how = cpu_mod.create_group("tbx-bubbletea", 0.1, record, root=root)
    finally:
        mp.undo()
    assert group is not None and recorded == [root / "cpu" / "tbx-bubbletea"]
    assert (group.path / "cpu.shares").read_text() == "102\n"
    assert (group.path / "cpu.rt_runtime_us").read_text() == f"{RT_RUNTIME_US}\n"
    # a short real-time period: a group that spent its budget waits at most the rest of one
    assert (group.path / "cpu.rt_period_us").read_text() == f"{RT_PERIOD_US}\n"
    assert RT_RUNTIME_US < RT_PERIOD_US <= 20_000
    assert how == "agents in cgroup v1 tbx-bubbletea at 0.1 of a normal cpu.shares"
    group.add(4242)
    assert (group.path / "cgroup.procs").read_text() == "4242\n"


def test_v2_group_gets_a_weight(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    real_mkdir = Path.mkdir

    def kernel_mkdir(self: Path, *a, **kw) -> None:  # noqa: ANN001
        real_mkdir(self, *a, **kw)
        for f in ("cgroup.procs", "cpu.weight"):
            (self / f).write_text("")

    mp = pytest.MonkeyPatch()
    mp.setattr(Path, "mkdir", kernel_mkdir)
    try:
        group, how = create_group("tbx-bt", 0.25, root=tmp_path)
    finally:
        mp.undo()
    assert group is not None and group.version == 2
    assert (group.path / "cpu.weight").read_text() == "25\n" and "cgroup v2" in how


def test_no_controller_is_said_and_nothing_is_made(tmp_path: Path) -> None:
    group, why = create_group("tbx-bt", 0.1, root=tmp_path)
    assert group is None
    assert why == f"no cpu cgroup controller under {tmp_path}: agents run without a CPU weight"
    assert list(tmp_path.iterdir()) == []


def test_a_group_that_cannot_be_created_says_why(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    (root / "cpu" / "tbx-bt").mkdir()  # already there
    group, why = create_group("tbx-bt", 0.1, root=root)
    assert group is None and why.startswith(f"cannot create cgroup {root / 'cpu' / 'tbx-bt'} (File exists)")


def test_a_weight_outside_0_1_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cpu weight must be in \(0, 1\] of the default, got 1.5"):
        create_group("tbx-bt", 1.5, root=tmp_path)


def test_adding_to_a_vanished_group_names_the_process(tmp_path: Path) -> None:
    from testbed.run.cpu import CpuGroup

    group = CpuGroup(tmp_path / "gone", 1, 0.1)
    with pytest.raises(CpuGroupError, match=f"cannot move process 77 into {tmp_path / 'gone'}"):
        group.add(77)
    group.remove()  # nothing there: no error


def test_remove_moves_leftovers_to_the_parent(tmp_path: Path) -> None:
    from testbed.run.cpu import CpuGroup

    (tmp_path / "cgroup.procs").write_text("")
    path = tmp_path / "g"
    path.mkdir()
    (path / "cgroup.procs").write_text("11\n12\n")
    group = CpuGroup(path, 1, 0.1)
    assert group.pids() == [11, 12]
    (path / "cgroup.procs").unlink()  # a real cgroup's files vanish with rmdir; here: empty the folder
    group.remove()
    assert not path.exists()


def test_cpu_seconds_of_this_process_and_of_a_fake_one(tmp_path: Path) -> None:
    mine = cpu_seconds(os.getpid())
    assert mine is not None and mine >= 0
    fake = tmp_path / "123"
    fake.mkdir()
    tck = os.sysconf("SC_CLK_TCK")
    # comm with spaces and a parenthesis; utime and stime are the 14th and 15th fields
    (fake / "stat").write_text(f"123 (a (b) c) S 1 1 1 0 -1 0 0 0 0 0 {3 * tck} {tck} 0 0 20 0 1 0 5 0 0\n")
    assert cpu_seconds(123, proc=tmp_path) == pytest.approx(4.0)
    assert cpu_seconds(999, proc=tmp_path) is None


def test_machine_busy_time_leaves_idle_and_iowait_out(tmp_path: Path) -> None:
    tck = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    (tmp_path / "stat").write_text(f"cpu  {10 * tck} {tck} {2 * tck} {500 * tck} {40 * tck} 0 {tck} {tck} 0 0\n"
                                   "cpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n")
    assert machine_busy_s(tmp_path) == pytest.approx(15.0)
    (tmp_path / "stat").write_text("garbage\n")
    assert machine_busy_s(tmp_path) is None
    assert machine_busy_s(tmp_path / "missing") is None


def test_a_reading_counts_this_process_and_its_helpers(tmp_path: Path) -> None:
    tck = os.sysconf("SC_CLK_TCK")
    (tmp_path / "stat").write_text(f"cpu  {tck} 0 0 0 0 0 0 0 0 0\n")
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(f"77 (relay) S 1 1 1 0 -1 0 0 0 0 0 {2 * tck} {tck} 0 0 20 0 1 0 5 0 0\n")
    got = machine_reading([77, 999_999], proc=tmp_path)  # a helper that is gone counts nothing
    me = os.times()
    assert got is not None and got.busy_s == pytest.approx(1.0)
    assert 3.0 <= got.own_s <= 3.0 + me.user + me.system + 1.0


def test_outside_cores_are_what_the_run_did_not_use() -> None:
    before = MachineReading(at_s=50.0, busy_s=100.0, own_s=10.0)
    after = MachineReading(at_s=52.0, busy_s=103.0, own_s=10.5)
    # 3 busy CPU seconds over 2 s: 1.5 cores; the workers 1.2 CPU s (0.6 cores), the runner and relays 0.25
    got = machine_cpu(before, after, workers_cpu_s=1.2)
    assert got is not None
    assert (got.busy_cores, got.run_cores, got.outside_cores) == pytest.approx((1.5, 0.85, 0.65))
    assert machine_cpu(before, after, workers_cpu_s=4.0).outside_cores == 0.0  # never below 0
    assert machine_cpu(before, before, 1.2) is None


def _v1_kernel(root: Path, files: tuple[str, ...]) -> pytest.MonkeyPatch:
    """Path.mkdir that makes the files the kernel makes in a new v1 cpu group."""
    real_mkdir = Path.mkdir

    def kernel_mkdir(self: Path, *a, **kw) -> None:  # noqa: ANN001
        real_mkdir(self, *a, **kw)
        if self.parent == root / "cpu":
            for f in files:
                (self / f).write_text("")

    mp = pytest.MonkeyPatch()
    mp.setattr(Path, "mkdir", kernel_mkdir)
    return mp


def test_an_idle_group_sets_cpu_idle_and_says_so(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    mp = _v1_kernel(root, ("cgroup.procs", "cpu.shares", "cpu.idle"))
    try:
        group, how = create_group("tbx-idle", 0.1, root=root, idle=True)
    finally:
        mp.undo()
    assert group is not None and group.idle
    assert (group.path / "cpu.idle").read_text() == "1\n" and (group.path / "cpu.shares").read_text() == "102\n"
    assert how == "agents in cgroup v1 tbx-idle, idle (cpu.idle 1: SCHED_IDLE)"


def test_idle_on_a_kernel_without_cpu_idle_keeps_the_weight_and_says_so(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    mp = _v1_kernel(root, ("cgroup.procs", "cpu.shares"))
    try:
        group, how = create_group("tbx-old", 0.1, root=root, idle=True)
    finally:
        mp.undo()
    assert group is not None and not group.idle and not (group.path / "cpu.idle").exists()
    assert how == ("agents in cgroup v1 tbx-old at 0.1 of a normal cpu.shares (no cpu.idle in this kernel, "
                   "before Linux 5.15: not idle, weighted only)")


def test_not_idle_unless_asked(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    mp = _v1_kernel(root, ("cgroup.procs", "cpu.shares", "cpu.idle"))
    try:
        group, _ = create_group("tbx-w", 0.5, root=root)
    finally:
        mp.undo()
    assert group is not None and not group.idle and (group.path / "cpu.idle").read_text() == ""


def test_the_runner_notes_other_programs_and_a_near_cpu_bound_run() -> None:
    """Other programs' CPU from 0.25 cores; the run's own from 70% of the cores, unless
    BubbleTea's agents run (they fill idle cores by design); the note says what to do."""
    quiet = MachineCpu(cores=2, busy_cores=0.9, run_cores=0.85, outside_cores=0.05)
    assert cpu_notes("atlas", quiet) == []
    busy = MachineCpu(cores=2, busy_cores=1.7, run_cores=1.55, outside_cores=0.3)
    notes = cpu_notes("multi-tcp", busy)
    assert len(notes) == 2
    assert notes[0].startswith("multi-tcp: other programs used 0.30 of the machine's 2 cores")
    assert notes[1].startswith("multi-tcp: the run itself kept 1.55 of the machine's 2 cores busy")
    assert "lower the WAN rates and workload.scale together" in notes[1]
    assert cpu_notes("atlas+bubbletea", busy, agents=True) == [notes[0].replace("multi-tcp", "atlas+bubbletea")]
    assert cpu_notes("x", MachineCpu(cores=8, busy_cores=1.6, run_cores=1.55, outside_cores=0.05)) == []
