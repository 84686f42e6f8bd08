"""The run's side of CPU weights (testbed/run/workers.py): which processes go in the
agents' cgroup, what is said when there is none, and the CPU accounting per kind
of process over the measured iterations."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import testbed.run.cpu as cpu
from testbed.run import workers


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)


def test_cpu_cores_per_kind_of_process() -> None:
    before = {"p0r0": 1.0, "p0r1": 2.0, "agent-p0r0": 0.5, "decode-dc1-h2": 0.1, "gone": 3.0}
    after = {"p0r0": 2.0, "p0r1": 2.5, "agent-p0r0": 0.7, "decode-dc1-h2": 0.2, "late": 9.0}
    cores = workers._cpu_cores(before, after, wall_s=2.0)
    assert cores == pytest.approx({"workers": 0.75, "agents": 0.1, "decode": 0.05})
    assert workers._cpu_cores(before, after, wall_s=0.0) is None


def test_no_weight_asked_no_group() -> None:
    log = Log()
    group, how = workers.weigh_agents(SimpleNamespace(), "atlas+bubbletea", None, [1, 2], log)
    assert group is None and how == "no CPU weights (runner.bubbletea_cpu_weight: null)"


def test_no_controller_is_logged_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "create_group", lambda name, weight, record, idle=False: (None, "no cpu cgroup controller"))
    log = Log()
    group, how = workers.weigh_agents(SimpleNamespace(), "atlas+bubbletea", 0.1, [1], log)
    assert group is None and how == "no cpu cgroup controller"
    assert log.lines == ["  atlas+bubbletea: no cpu cgroup controller"]


def test_group_named_with_the_run_prefix_recorded_and_filled(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    made: dict[str, object] = {}

    class FakeGroup:
        def __init__(self) -> None:
            self.pids: list[int] = []
            self.removed = False

        def add(self, pid: int) -> None:
            if pid == 666:
                raise cpu.CpuGroupError("cannot move process 666 into g: No such process")
            self.pids.append(pid)

        def remove(self) -> None:
            self.removed = True

    def create(name: str, weight: float, record: object, idle: bool = False) -> tuple[FakeGroup, str]:
        made.update(name=name, weight=weight, record=record)
        g = FakeGroup()
        made["group"] = g
        return g, "agents in cgroup v1"

    monkeypatch.setattr(cpu, "create_group", create)
    recorded: list[Path] = []
    net = SimpleNamespace(emu=SimpleNamespace(prefix="tbab1", record=SimpleNamespace(add_path=recorded.append)))
    group, how = workers.weigh_agents(net, "atlas+bubbletea", 0.1, [11, 12], Log())
    assert group is made["group"] and group.pids == [11, 12] and how == "agents in cgroup v1"
    assert str(made["name"]).startswith("tbab1-bubbletea-atlas-bubbletea-") and made["weight"] == 0.1
    assert made["record"] == recorded.append  # recorded in the run record before it is made
    log = Log()
    group, how = workers.weigh_agents(net, "atlas+bubbletea", 0.1, [11, 666], log)
    assert group is None and made["group"].removed and "No such process" in how
    assert "agents run without a CPU weight" in log.lines[0]


def test_idle_is_passed_on_and_recorded_typed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked: dict[str, object] = {}

    def create(name: str, weight: float, record: object, idle: bool = False) -> tuple[object, str]:
        asked.update(weight=weight, idle=idle)
        return SimpleNamespace(path=tmp_path / name, idle=idle, add=lambda pid: None), "agents in cgroup v1 g, idle"

    monkeypatch.setattr(cpu, "create_group", create)
    group, how = workers.weigh_agents(SimpleNamespace(), "atlas+bubbletea", 0.1, [1], Log(), idle=True)
    assert asked == {"weight": 0.1, "idle": True}
    rec = workers.agents_cpu_record(group, 0.1, how)
    assert rec.cgroup == group.path.name and rec.idle and rec.weight == 0.1 and rec.how == how
    assert rec.realtime_holds and rec.agent_nice < 0 < rec.decode_nice  # holds end on time; decode yields
    none = workers.agents_cpu_record(None, 0.1, "no cpu cgroup controller under /sys/fs/cgroup")
    assert none.cgroup is None and none.weight is None and not none.idle
