"""The pure part of `testbed launch`: which host each rank runs on, and its environment.

No I/O beyond reading the caller's PATH and the machine's memory size: the CLI checks
every input here before it builds a topology, so bad input costs nothing and leaves
nothing behind, and the unit tests check each message without root.

Ranks follow torchrun's conventions (one "node" of torchrun = one emulated host):
hosts in topology order (DCs in file order, hosts in DC order) or in the order of
``--hosts``; ``--nproc-per-host N`` gives each host N consecutive ranks, so
``RANK = GROUP_RANK * N + LOCAL_RANK``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ISSUE = "issue 28"
RANK_MEMORY_BYTES = 256 * 2**20  # what one rank is budgeted (a Python process that imported torch)
MIN_MAX_RANKS = 64


class LaunchError(RuntimeError):
    """Input `testbed launch` cannot run (raised before anything starts), or a launch
    that could not start its ranks. A rank that fails once started is not an error
    here: `run_launch` returns a report with ``ok=False`` and a `failure` message."""


@dataclass(frozen=True)
class HostSlot:
    """One emulated host a rank can run on: display name (dc1-h1), DC, address and the
    name of its interface inside its namespace (what gloo must bind to)."""

    name: str
    dc: str
    ip: str
    intf: str


@dataclass(frozen=True)
class RankPlan:
    """One rank: torchrun's numbers and where it runs."""

    rank: int
    local_rank: int
    local_world_size: int
    group_rank: int  # the host's position in the launch's host order
    host: HostSlot


def max_ranks(mem_bytes: int | None = None) -> int:
    """The most ranks one launch may start: max(64, memory / 256 MiB). Each rank is a
    process of its own (a Python that imported torch takes a few hundred MB); beyond
    this the machine swaps or the OOM killer ends ranks at random."""
    if mem_bytes is None:
        mem_bytes = _mem_total()
    return max(MIN_MAX_RANKS, mem_bytes // RANK_MEMORY_BYTES)


def _mem_total() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def plan_ranks(slots: Sequence[HostSlot], hosts: Sequence[str] | None, nproc_per_host: int,
               limit: int | None = None) -> list[RankPlan]:
    """The ranks of a launch on `slots` (every host of the topology, in topology order).

    `hosts` picks and orders hosts by display name (None: all of them);
    `nproc_per_host` ranks go on each. LaunchError names what is wrong: an unknown or
    repeated host (listing the valid ones), a count below 1, more ranks than `limit`
    (default `max_ranks()`)."""
    if nproc_per_host < 1:
        raise LaunchError(f"--nproc-per-host {nproc_per_host}: give 1 or more ranks per host")
    by_name = {s.name: s for s in slots}
    valid = ", ".join(s.name for s in slots) or "none"
    if hosts is None:
        chosen = list(slots)
    else:
        if not hosts:
            raise LaunchError(f"--hosts is empty: name one or more hosts, separated by commas (hosts: {valid})")
        seen: set[str] = set()
        chosen = []
        for name in hosts:
            if name not in by_name:
                raise LaunchError(f"--hosts: {name!r} is not a host of the topology (hosts: {valid})")
            if name in seen:
                raise LaunchError(f"--hosts: {name} is named twice; to start several ranks on one host use "
                                  "--nproc-per-host N")
            seen.add(name)
            chosen.append(by_name[name])
    if not chosen:
        raise LaunchError("the topology has no hosts to start ranks on")
    total = len(chosen) * nproc_per_host
    cap = max_ranks() if limit is None else limit
    if total > cap:
        raise LaunchError(
            f"{total} ranks ({len(chosen)} hosts x {nproc_per_host} per host) are more than this machine can hold: "
            f"at most {cap} (max({MIN_MAX_RANKS}, memory / {RANK_MEMORY_BYTES // 2**20} MiB per rank)); "
            "pick fewer hosts with --hosts, lower --nproc-per-host, or use a machine with more memory")
    return [RankPlan(rank=g * nproc_per_host + k, local_rank=k, local_world_size=nproc_per_host, group_rank=g,
                     host=slot)
            for g, slot in enumerate(chosen) for k in range(nproc_per_host)]


def parse_hosts(value: str | None) -> list[str] | None:
    """``--hosts dc1-h1,dc2-h1`` as a list (None when not given); blanks are ignored."""
    if value is None:
        return None
    return [h.strip() for h in value.split(",") if h.strip()]


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict (the last one of a key wins)."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise LaunchError(f"--env {item!r}: give KEY=VALUE (e.g. --env BACKEND=gloo)")
        if not key.strip():
            raise LaunchError(f"--env {item!r}: the KEY before '=' is empty (e.g. --env BACKEND=gloo)")
        if key != key.strip() or "\0" in key or "\0" in value:
            raise LaunchError(f"--env {item!r}: KEY must not have spaces around it or NUL characters")
        env[key] = value
    return env


def resolve_command(command: Sequence[str], cwd: str | Path, path: str | None = None) -> str:
    """The program the ranks will run (command[0]) as found here: a path (relative to
    `cwd`) that is an executable file, or a name on PATH. LaunchError when the command
    is empty or the program is not found or not executable."""
    if not command:
        raise LaunchError("no command to launch: put it after `--`, e.g. "
                          "testbed launch topologies/2dc.yaml -- .venv/bin/python train.py")
    prog = command[0]
    if os.sep in prog:
        full = Path(prog) if os.path.isabs(prog) else Path(cwd) / prog
        if not full.exists():
            raise LaunchError(f"command not found: {prog} (no such file, looked in {Path(cwd)})")
        if full.is_dir() or not os.access(full, os.X_OK):
            raise LaunchError(f"command {prog} is not an executable file; run it through its interpreter, "
                              f"e.g. -- python {prog}")
        return str(full)
    found = shutil.which(prog, path=path)
    if found is None:
        raise LaunchError(f"command not found: {prog} (not on PATH; give its path, e.g. .venv/bin/{prog})")
    return found


def rank_env(base: Mapping[str, str], plan: RankPlan, world_size: int, master_addr: str, master_port: int,
             extra: Mapping[str, str], run_id: str = "") -> dict[str, str]:
    """The environment of one rank: the caller's (`base`), torchrun's variables, where
    it runs, the interface gloo and TensorPipe must bind to, then `extra` (``--env``),
    which wins over everything. ``OMP_NUM_THREADS=1`` and ``PYTHONUNBUFFERED=1`` unless
    the caller set them (ranks share the machine's cores; output streams line by line);
    ``ATLAS_SITE`` (the atlas backend's site label: ranks with the same label share a
    LAN) is the rank's DC unless the caller set it."""
    env = dict(base)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("ATLAS_SITE", plan.host.dc)  # the atlas backend's locality (ranks sharing a DC)
    env.update({
        "RANK": str(plan.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(plan.local_rank),
        "LOCAL_WORLD_SIZE": str(plan.local_world_size),
        "GROUP_RANK": str(plan.group_rank),
        "ROLE_RANK": str(plan.rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id or "none",
        "TESTBED_DC": plan.host.dc,
        "TESTBED_HOST": plan.host.name,
        "TESTBED_HOST_IP": plan.host.ip,
    })
    if plan.host.intf:
        env["GLOO_SOCKET_IFNAME"] = plan.host.intf
        env["TP_SOCKET_IFNAME"] = plan.host.intf
    env.update(extra)
    return env


def rank_label(plan: RankPlan) -> str:
    """``rank 3 dc2/dc2-h2``: how output lines and messages name a rank."""
    return f"rank {plan.rank} {plan.host.dc}/{plan.host.name}"
