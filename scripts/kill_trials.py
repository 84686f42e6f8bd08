#!/usr/bin/env python3
"""Kill-anywhere trials (issue 32): SIGKILL a `testbed` command at a seeded moment of a
seeded phase, run `testbed clean`, and look at once for anything of the run left.

    sudo .venv/bin/python scripts/kill_trials.py --trials 20            (seeds 0..19, all commands)
    sudo .venv/bin/python scripts/kill_trials.py --command run-quickstart --seeds 3,4

Each trial starts one command (its output to a log file), watches that output for the
phase markers of the command (build, calibration, each variant, BubbleTea, teardown),
waits for the seeded phase, then a seeded 0-2.5 s more, and sends SIGKILL to the
`testbed` process alone (as `kill -9` would). A command that ends before the phase
it was given is recorded as such (it is cleaned and checked the same). Then `testbed
clean`, and at once (no sleep) the checks:

- processes: any live (not zombie) process that descended from the killed one (the
  tree is read just before the kill), carries one of the run's prefixes
  (TESTBED_RUN=<prefix> in its environment, a node shell's ``mininet:<prefix>``), names
  the killed process as its run's owner (TESTBED_OWNER), or sits in a network
  namespace of the run's;
- on disk and in the kernel: the run's records (/run/testbed/<prefix>.json), its temp
  folders and sockets (/tmp/<prefix>-*), links in the root namespace named with a
  prefix, cgroups named with a prefix, and the congestion-control sysctl changed
  while no other run is active.

The table (command, seed, kill moment, phase reached, clean time, leftovers) is printed
and the whole of it saved as JSON under results/kill-trials/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTBED = str(REPO / ".venv" / "bin" / "testbed")
RECORDS = Path("/run/testbed")
PREFIX = re.compile(r"\btb[0-9a-f]{3}\b")
SYSCTL = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
QUICK = ["--set", "workload.iterations=1", "--set", "workload.warmup=1"]

SWEEP_FILE = """name: kill-trial-sweep
description: two points of the quickstart, run two at a time (kill trials)
base: {base}
parameters:
  transport.streams: {{values: [1, 8]}}
mode: grid
repeat: 1
set:
  bubbletea.enabled: false
  workload.iterations: 1
  workload.warmup: 1
"""


@dataclass(frozen=True)
class Command:
    """A command of the trials and its phases, in order: (name, regex on its output)."""

    name: str
    argv: tuple[str, ...]
    phases: tuple[tuple[str, str], ...]
    limit_s: float = 240.0  # a trial whose phase never comes is killed at this time


def commands(work: Path) -> dict[str, Command]:
    """The commands, small and quick versions of what a user runs."""
    sweep = work / "sweep.yaml"
    sweep.write_text(SWEEP_FILE.format(base=REPO / "scenarios" / "quickstart.yaml"))
    run_phases = (("build", r"creating nodes"), ("calibration", r"calibrating \d+ WAN"),
                  ("baseline", r"start baseline"), ("multi-tcp", r"start multi-tcp"),
                  ("atlas", r"start atlas$"), ("bubbletea-idle", r"start atlas\+bubbletea: agents idle"),
                  ("bubbletea", r"start atlas\+bubbletea$"), ("teardown", r"\] atlas\+bubbletea ok in"))
    return {c.name: c for c in (
        Command("run-quickstart", (TESTBED, "run", "scenarios/quickstart.yaml", *QUICK, "--out", str(work / "run")),
                run_phases),
        Command("run-bubbletea", (TESTBED, "run", "scenarios/quickstart.yaml", "--variants", "atlas,atlas+bubbletea", *QUICK,
                                  "--out", str(work / "bt")),
                (("build", r"creating nodes"), ("calibration", r"calibrating \d+ WAN"), ("atlas", r"start atlas$"),
                 ("bubbletea-idle", r"start atlas\+bubbletea: agents idle"), ("bubbletea", r"start atlas\+bubbletea$"),
                 ("teardown", r"\] atlas\+bubbletea ok in"))),
        Command("sweep", (TESTBED, "sweep", str(sweep), "-j", "2", "--out", str(work / "sweep")),
                (("points", r"\[0/2\] start p00"), ("build", r"creating nodes"),
                 ("calibration", r"calibrating \d+ WAN"), ("variant", r"start (baseline|multi-tcp|atlas)"),
                 ("point-done", r"\[1/2\]"))),
        Command("topo-check", (TESTBED, "topo", "check", "topologies/2dc.yaml", "--no-tcp"),
                (("build", r"creating nodes"), ("delay-lines", r"starting \d+ delay line"),
                 ("rtt", r": RTT "), ("train", r"UDP train"), ("blast", r"UDP blast"), ("teardown", r"tearing down"))),
        Command("bench-transport", (TESTBED, "bench", "transport", "--topology", "topologies/2dc.yaml", "--size",
                                    "8MiB", "--streams", "1,8", "--repeat", "1", "--rounds", "1", "--methods",
                                    "atlas,tcp,iperf3", "--iperf-seconds", "1", "--no-loopback", "--out",
                                    str(work / "bench")),
                (("build", r"wan: building"), ("atlas", r"wan atlas N=1:"), ("tcp", r"wan tcp N=1:"),
                 ("iperf3", r"wan iperf3 N=1:"), ("teardown", r"wan iperf3 N=8"))),
        Command("demo", (TESTBED, "demo", "--quick", "--out", str(work / "demo")),
                (("bench", r"start transport bench"), ("bench-measure", r"transport: atlas N=1"),
                 ("quickstart", r"start quickstart run"), ("build", r"creating nodes"),
                 ("calibration", r"calibrating \d+ WAN"), ("baseline", r"^baseline: \d+ workers"),
                 ("atlas", r"^atlas: \d+ workers"), ("bubbletea", r"^atlas\+bubbletea: \d+ workers")),
                limit_s=400.0),
    )}


# ----------------------------------------------------------------------------- /proc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start) of `pid`, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = text[text.rfind(")") + 2:].split()
    return f[0], int(f[1]), int(f[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(root: int) -> dict[int, int]:
    """{pid: start} of every live descendant of `root` (and `root`)."""
    table = {pid: s for pid in _pids() if (s := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            out[pid] = table[pid][2]
            todo += children.get(pid, [])
    return out


# ----------------------------------------------------------------------------- trial


@dataclass
class Trial:
    command: str
    seed: int
    target_phase: str
    delay_s: float
    kill_at_s: float | None = None  # seconds after the start
    phase_reached: str = "launch"
    ended_by_itself: bool = False
    exit_status: int | None = None
    prefixes: list[str] = field(default_factory=list)
    clean_s: float = 0.0
    clean_rc: int = 0
    clean_output: str = ""
    leftovers: list[str] = field(default_factory=list)
    zombies: int = 0
    log_tail: str = ""


def run_trial(cmd: Command, seed: int, work: Path, phase: str | None = None) -> Trial:
    """One trial of `cmd` with `seed` (the phase and the delay after its marker are drawn
    from it unless `phase` is given)."""
    rng = random.Random(f"{cmd.name}:{seed}")
    names = [p for p, _ in cmd.phases]
    target = phase or rng.choice(names)
    trial = Trial(cmd.name, seed, target, round(rng.uniform(0.0, 2.5), 2))
    before = {p.stem for p in RECORDS.glob("*.json")}
    sysctl_before = SYSCTL.read_text().strip() if SYSCTL.exists() else ""
    log = work / f"{cmd.name}-{seed}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # each trial its own result folder (a sweep resumes in one it finds)
    argv = [a + f"-{seed}" if a.startswith(f"{work}{os.sep}") and not a.endswith(".yaml") else a for a in cmd.argv]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    start = _stat(proc.pid)
    t0 = time.monotonic()
    prefixes: set[str] = set()
    reached, seen_at = "launch", None  # no phase seen yet
    tree: dict[int, int] = {}
    existing: dict[int, int] = {}  # every process at the kill: {pid: start}
    netns: set[int] = set()
    host_ns = {_netns(1), _netns(os.getpid()), _netns(proc.pid)}  # never the run's own
    while True:
        text = log.read_text(errors="replace")
        prefixes |= set(PREFIX.findall(text))
        prefixes |= {p.stem for p in RECORDS.glob("*.json") if p.stem not in before and _owner(p) in tree}
        lines = text.splitlines()
        for name, pattern in cmd.phases[names.index(reached) + 1 if reached in names else 0:]:
            if any(re.search(pattern, line) for line in lines):
                reached = name
        if seen_at is None and (reached == target or (reached in names and names.index(reached) > names.index(target))):
            seen_at = time.monotonic()
        if proc.poll() is not None:
            trial.ended_by_itself = True
            break
        found = descendants(proc.pid)
        tree.update(found)
        netns |= {ns for pid in found if (ns := _netns(pid)) is not None and ns not in host_ns}
        now = time.monotonic()
        if (seen_at is not None and now >= seen_at + trial.delay_s) or now - t0 > cmd.limit_s:
            tree.update(descendants(proc.pid))
            existing = {pid: st[2] for pid in _pids() if (st := _stat(pid)) is not None}
            os.kill(proc.pid, signal.SIGKILL)
            trial.kill_at_s = round(now - t0, 2)
            break
        time.sleep(0.05)
    trial.exit_status = proc.wait()
    trial.phase_reached = reached
    trial.prefixes = sorted(p for p in prefixes if p not in before)
    c0 = time.monotonic()
    res = subprocess.run([TESTBED, "clean"], cwd=REPO, capture_output=True, text=True, check=False)
    trial.clean_s = round(time.monotonic() - c0, 2)
    trial.clean_rc = res.returncode
    trial.clean_output = res.stdout + res.stderr
    # the checks, at once
    trial.leftovers, trial.zombies = leftovers(trial.prefixes, proc.pid, start[2] if start else 0, tree, netns,
                                               sysctl_before, existing)
    trial.log_tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
    return trial


def leftovers(prefixes: list[str], owner: int, owner_start: int, tree: dict[int, int], netns: set[int],
              sysctl_before: str, existing: dict[int, int]) -> tuple[list[str], int]:
    """What of the run is still alive or on disk, and how many of its processes are
    zombies (gone, not yet reaped by PID 1). A process counts as in the run's network
    namespace only if it already ran at the kill (`existing`): the kernel reuses a
    freed namespace's number for the next one made, by any run."""
    found: list[str] = []
    zombies = 0
    me = os.getpid()
    marks = [f"TESTBED_RUN={p}".encode() for p in prefixes]
    owner_tail = f":{owner}:{owner_start}".encode()
    for pid in _pids():
        st = _stat(pid)
        if st is None or pid == me:
            continue
        state, _, start = st
        why = ""
        if tree.get(pid) == start:
            why = "descended from the killed command"
        elif any(m in _environ(pid) for m in marks):
            why = "carries TESTBED_RUN of the run"
        elif any(f"mininet:{p}" in _cmdline(pid) for p in prefixes):
            why = "a node shell of the run"
        elif any(e.startswith(b"TESTBED_OWNER=") and e.endswith(owner_tail) for e in _environ(pid)):
            why = "names the killed command as its owner"
        elif existing.get(pid) == start and _netns(pid) in netns:
            why = "in a network namespace of the run"
        if not why:
            continue
        if state == "Z":
            zombies += 1
            continue
        found.append(f"process {pid} ({why}): {_cmdline(pid)[:100]}")
    for p in prefixes:
        if (RECORDS / f"{p}.json").exists():
            found.append(f"record {RECORDS / p}.json")
        found += [f"temp {path}" for path in Path(tempfile.gettempdir()).glob(f"{p}-*")]
        found += [f"temp {path}" for path in Path("/dev/shm").glob(f"{p}*")]
        found += [f"link {path.name}" for path in Path("/sys/class/net").glob(f"{p}*")]
        for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct")):
            found += [f"cgroup {path}" for path in base.glob(f"{p}*") if path.is_dir()]
    others_active = any(_record_active(path) for path in RECORDS.glob("*.json"))
    now = SYSCTL.read_text().strip() if SYSCTL.exists() else ""
    if now != sysctl_before and not others_active:
        found.append(f"sysctl {SYSCTL}: {sysctl_before!r} -> {now!r}")
    return found, zombies


def _owner(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["owner"]["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_active(path: Path) -> bool:
    try:
        owner = json.loads(path.read_text())["owner"]
    except (OSError, ValueError, KeyError):
        return False
    st = _stat(int(owner["pid"]))
    return st is not None and st[2] == int(owner["start"]) and st[0] != "Z"


# ----------------------------------------------------------------------------- main


def table(trials: list[Trial]) -> str:
    rows = [f"{'command':<16}{'seed':>5}  {'target':<15}{'kill at':>8}  {'reached':<15}{'clean':>7}  leftovers"]
    for t in trials:
        kill = f"{t.kill_at_s:.1f}s" if t.kill_at_s is not None else "ended"
        rows.append(f"{t.command:<16}{t.seed:>5}  {t.target_phase:<15}{kill:>8}  {t.phase_reached:<15}"
                    f"{t.clean_s:>6.1f}s  {len(t.leftovers) or 'none'}" + (f" ({t.zombies} zombies)" if t.zombies else ""))
        rows += [f"{'':>24}- {x}" for x in t.leftovers]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials in all, the commands taken in turn")
    ap.add_argument("--command", action="append", help="only these commands (repeatable)")
    ap.add_argument("--seeds", help="comma-separated seeds (default: 0..trials-1)")
    ap.add_argument("--phase", help="kill in this phase instead of a seeded one")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "kill-trials")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("kill trials build emulations: run as root", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kill-trials-"))
    cmds = commands(work)
    chosen = a.command or list(cmds)
    unknown = [c for c in chosen if c not in cmds]
    if unknown:
        print(f"unknown command(s) {', '.join(unknown)}; known: {', '.join(cmds)}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else list(range(a.trials))
    trials = []
    for i, seed in enumerate(seeds):
        cmd = cmds[chosen[i % len(chosen)]]
        trial = run_trial(cmd, seed, work, a.phase)
        trials.append(trial)
        print(table([trial]).splitlines()[1:][0] if not trial.leftovers else table([trial]), flush=True)
    print()
    print(table(trials))
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"kill-trials-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    print(f"\n{sum(1 for t in trials if not t.leftovers)} of {len(trials)} trials left nothing; {path}")
    return 0 if all(not t.leftovers for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
