"""CPU weights: keep the emulator's own processes ahead of BubbleTea's agents.

On a small machine (two cores) every process of a run competes for the same cores:
the training workers (their compute is a sleep, but their transport threads move
the tensors), the relay delay lines, the decode servers and the BubbleTea agents. An
agent that takes a core when a worker needs it delays training: a slowdown that no
device timeline shows. So a run puts its agents (and decode servers) in a cgroup of
their own with a small CPU weight: under contention the kernel gives them a small
share, and when a core is free they still get all of it.

* cgroup v2 (``/sys/fs/cgroup`` with the ``cpu`` controller): ``cpu.weight`` (the
  default of every other group is 100);
* cgroup v1 (``/sys/fs/cgroup/cpu``): ``cpu.shares`` (default 1024), and, where the
  kernel schedules real-time tasks per group (``cpu.rt_runtime_us`` exists), a
  real-time budget, so that an agent's device holds can still run at SCHED_FIFO
  (they must end on time: on an emulated GPU a hold ends when its thread wakes);
* with `idle` (``runner.bubbletea_cpu_idle``), ``cpu.idle`` 1 (v1 and v2, Linux 5.15+):
  the whole group is scheduled like SCHED_IDLE tasks. A weight only shares the cores
  out in proportion; an idle group runs its normal (CFS) threads only on a core no
  other process wants, and a waking worker preempts them at once. Its real-time
  threads (the holds) are untouched: idle concerns the normal class only. Where the
  file is missing (an older kernel) the group keeps its weight and says so.

The group is named with the run's prefix and recorded in the run record before it is
created (testbed/emulation/records.py), so the teardown, or `testbed clean` after a
crash, removes it; `CpuGroup.remove` removes it at the end of the variant. Where no
writable cpu controller exists (no root, a container without one), `create_group`
returns None and says why: the run goes on without weights.

`cpu_seconds` reads a process's CPU time from /proc (the runner's accounting of
what agents and workers used over the measured iterations); `machine_busy_s` the
machine's busy CPU time, so that a run can say what programs outside it took of the
cores while it measured (`machine_cpu`'s outside_cores): the prediction assumes the run has the
machine to itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed_core.contracts.summary import MachineCpu

CGROUP_ROOT = Path("/sys/fs/cgroup")
V2_DEFAULT_WEIGHT = 100
V1_DEFAULT_SHARES = 1024
RT_RUNTIME_US = 3_000
"""cgroup v1 with real-time group scheduling: the agents' group may run SCHED_FIFO for
this many microseconds per `RT_PERIOD_US` (30% of a core): their holds mostly sleep."""
RT_PERIOD_US = 10_000
"""The group's real-time period. A group that used its budget waits for the next period:
with the kernel's 1 s period and a 100 ms budget agents woke up to 0.47 s late inside
their holds (idle devices in the bubbles); a 10 ms period bounds that wait to 7 ms."""


class CpuGroupError(RuntimeError):
    """A cgroup that could not be created or written."""


@dataclass
class CpuGroup:
    """One cgroup with a CPU weight: add processes, then remove it."""

    path: Path
    version: int
    weight: float
    """Relative to a default group or process (1.0: the same share)."""
    idle: bool = False
    """cpu.idle 1: the group's normal threads run only where no other process wants the core."""
    note: str = ""
    """What was asked but could not be set (an idle group on a kernel without cpu.idle)."""

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into the group."""
        try:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:
            raise CpuGroupError(f"cannot move process {pid} into {self.path}: {exc.strerror}") from None

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Move what is left to the parent group and remove the group (a cgroup is
        removed with rmdir, never by deleting its files)."""
        if not self.path.exists():
            return
        parent = self.path.parent / "cgroup.procs"
        for pid in self.pids():
            with contextlib.suppress(OSError):
                parent.write_text(f"{pid}\n")
        for _ in range(20):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.05)
        # still busy: a process that died in it and is not reaped yet (an agent killed
        # mid-run is a zombie until its parent waits for it); the run's teardown removes
        # the group (records.py), after the processes are reaped

    def describe(self) -> str:
        what = "cpu.weight" if self.version == 2 else "cpu.shares"
        if self.idle:
            return f"agents in cgroup v{self.version} {self.path.name}, idle (cpu.idle 1: SCHED_IDLE)"
        return f"agents in cgroup v{self.version} {self.path.name} at {self.weight:g} of a normal {what}{self.note}"


def find_controller(root: Path = CGROUP_ROOT) -> tuple[int, Path] | None:
    """(cgroup version, folder to create groups in) of a mounted cpu controller."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return 2, root
    v1 = root / "cpu"
    if (v1 / "cpu.shares").is_file():
        return 1, v1
    return None


def weight_value(version: int, weight: float) -> int:
    """The file value for `weight` times the default: cpu.weight 1..10000, cpu.shares >= 2."""
    if version == 2:
        return max(1, min(10000, round(V2_DEFAULT_WEIGHT * weight)))
    return max(2, round(V1_DEFAULT_SHARES * weight))


def create_group(name: str, weight: float, record: Callable[[Path], None] | None = None,
                 root: Path = CGROUP_ROOT, idle: bool = False) -> tuple[CpuGroup | None, str]:
    """A new cgroup `name` with `weight` times the default CPU weight (and with `idle`,
    ``cpu.idle`` 1 where the kernel has it), recorded with `record(path)` before it is
    created. Returns (group, how) or (None, why not)."""
    if not 0 < weight <= 1:
        raise ValueError(f"cpu weight must be in (0, 1] of the default, got {weight}")
    found = find_controller(root)
    if found is None:
        return None, f"no cpu cgroup controller under {root}: agents run without a CPU weight"
    version, base = found
    path = base / name
    try:
        if record is not None:
            record(path)
        path.mkdir()
    except OSError as exc:
        return None, f"cannot create cgroup {path} ({exc.strerror}): agents run without a CPU weight"
    group = CpuGroup(path, version, weight)
    try:
        if version == 2:
            (path / "cpu.weight").write_text(f"{weight_value(2, weight)}\n")
        else:
            (path / "cpu.shares").write_text(f"{weight_value(1, weight)}\n")
            rt = path / "cpu.rt_runtime_us"
            if rt.exists():
                (path / "cpu.rt_period_us").write_text(f"{RT_PERIOD_US}\n")  # first: the budget must fit
                rt.write_text(f"{RT_RUNTIME_US}\n")
        if idle:
            if (path / "cpu.idle").exists():
                (path / "cpu.idle").write_text("1\n")
                group.idle = True
            else:
                group.note = " (no cpu.idle in this kernel, before Linux 5.15: not idle, weighted only)"
    except OSError as exc:
        group.remove()
        return None, f"cannot set the CPU weight of {path} ({exc.strerror}): agents run without one"
    return group, group.describe()


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """User + system CPU seconds process `pid` has used (None when it is gone)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # after the comm: state is field 3; utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s(proc: Path = Path("/proc")) -> float | None:
    """CPU seconds this machine's cores have spent busy since boot (/proc/stat's first
    line: user, nice, system, irq, softirq and steal; idle and iowait left out), None
    where it cannot be read."""
    try:
        first = (proc / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in first[1:8])
    steal = int(first[8]) if len(first) > 8 else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class MachineReading:
    """One reading of this machine's CPU: when (monotonic seconds), the busy seconds of
    all its cores, and of them the run's own outside its workers (this process and its
    helpers, e.g. the delay lines)."""

    at_s: float
    busy_s: float
    own_s: float


def machine_reading(helper_pids: list[int], proc: Path = Path("/proc")) -> MachineReading | None:
    busy = machine_busy_s(proc)
    if busy is None:
        return None
    me = os.times()
    own = me.user + me.system + sum(used for pid in helper_pids if (used := cpu_seconds(pid, proc)) is not None)
    return MachineReading(time.monotonic(), busy, own)


def machine_cpu(before: MachineReading, after: MachineReading, workers_cpu_s: float) -> MachineCpu | None:
    """This machine's busy cores between two readings, the run's and other programs'
    (summary ``machine_cpu``): the run's are its workers' CPU seconds between them
    (agents and decode servers included, `workers_cpu_s`) and its own process's and
    helpers', over the time between the readings; outside is what is left of the busy
    cores (never below 0). None when no time passed between them."""
    wall_s = after.at_s - before.at_s
    if wall_s <= 0:
        return None
    busy = (after.busy_s - before.busy_s) / wall_s
    run = (workers_cpu_s + after.own_s - before.own_s) / wall_s
    return MachineCpu(cores=os.cpu_count() or 1, busy_cores=round(busy, 3), run_cores=round(run, 3),
                      outside_cores=round(max(0.0, busy - run), 3))


OUTSIDE_CORES_NOTED = 0.25  # other programs' CPU over a variant's measured iterations that the run reports
RUN_SHARE_NOTED = 0.7  # the share of the machine's cores a variant's own run may keep busy unreported


def cpu_notes(name: str, mc: MachineCpu, agents: bool = False) -> list[str]:
    """What the runner says about variant `name`'s CPU over its measured iterations (`mc`):
    other programs' use where it reaches OUTSIDE_CORES_NOTED, and the run's own where it
    reaches RUN_SHARE_NOTED of the cores without BubbleTea agents (`agents`: theirs fill idle
    cores by design). A run whose own packet work keeps the cores that busy is near CPU-bound
    emulation: its workers, delay lines and the kernel's packet path wait for one another,
    which the prediction (network and modelled compute, no CPU limit) does not hold; held-back
    runs there measured from about as predicted to 75% slower (docs/results/fidelity.md)."""
    notes = []
    if mc.outside_cores >= OUTSIDE_CORES_NOTED:
        notes.append(f"{name}: other programs used {mc.outside_cores:.2f} of the machine's {mc.cores} cores "
                     f"during its measured iterations (the run {mc.run_cores:.2f}): its times are slowed by "
                     "them, and its prediction assumes the run has the machine to itself")
    if not agents and mc.run_cores >= RUN_SHARE_NOTED * mc.cores:
        notes.append(f"{name}: the run itself kept {mc.run_cores:.2f} of the machine's {mc.cores} cores busy during "
                     "its measured iterations (workers, delay lines, the kernel's packet path): the emulation is "
                     "near CPU-bound here, which its prediction does not hold (held-back runs in this regime "
                     "measured up to 75% slower than predicted, docs/results/fidelity.md); fewer packets per second "
                     "keep it faithful: lower the WAN rates and workload.scale together (the rates stand for "
                     "rate / scale), or run on a machine with more cores")
    return notes
