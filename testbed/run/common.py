"""Small pieces every part of `testbed run` shares (testbed/run/runner.py and the modules it
uses): the run's error, how a worker process is
started (environment, command line), how processes we started are ended, the tail of
a log for an error message, the transport part of a job, and the WAN path between two
DCs. The run's ports are handed out by testbed/run/ports.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from testbed_core.constants import REPO_ROOT
from testbed_core.contracts.calibration import dc_of_host
from testbed_core.contracts.worker_job import TransportJob

if TYPE_CHECKING:
    from testbed.run.scenario import Scenario, TransportSettings
    from testbed_core.topology import Topology


class RunnerError(RuntimeError):
    """A run that could not be carried out; the message says where and what to do."""


def worker_env(secret: str) -> dict[str, str]:
    """The environment of a worker process: the channels' secret (never in a job file)
    and the repository on the import path."""
    env = dict(os.environ)
    env["ATLAS_SECRET"] = secret
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # modelled workers do no math; keep torch from spawning threads
    return env


# what a warm-started process of a run finds imported (testbed/emulation/warmstart.py): torch, the
# training loop (workers, probe agents) and the BubbleTea programs (agents, decode servers, controller)
RUN_PRELOAD = ("torch", "testbed.training.worker.train", "testbed.training.executor",
               "testbed.training.transport_comm", "atlas_transport", "bubbletea_agent.__main__")


def run_preload(scenario: Scenario) -> tuple[str, ...]:
    """What the fork server of `scenario`'s run imports (its first warm start decides, so
    every warm start of a run passes this): RUN_PRELOAD, and with real devices
    (``gpu.mode: real``) torch._dynamo too, which torch's optimizers import on first use,
    about a CPU second in every training worker otherwise (once in the server instead)."""
    return (*RUN_PRELOAD, "torch._dynamo") if scenario.workload.gpu.mode == "real" else RUN_PRELOAD


def worker_argv(job_path: Path) -> list[str]:
    """The command line of a worker or probe process (testbed/training/worker/)."""
    return [sys.executable, "-m", "testbed.training.worker", str(job_path)]


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a process's log, indented, for an error message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:]) or "    (empty log)"


def stop_processes(procs: Mapping[str, subprocess.Popen], grace_s: float = 3.0) -> None:
    """End processes we started (TERM, then KILL after a grace period)."""
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.terminate()
    for p in procs.values():
        try:
            p.wait(max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait(2.0)


# SO_MAX_PACING_RATE of a paced stream: any value turns Linux's internal TCP pacing on; this
# one (a C int of bytes/s) never binds on an emulated link, so TCP's own rate applies
PACING_CAP_MBPS = 10_000.0


CONNECT_TIMEOUT_S = 10.0  # to open all streams of a channel and finish its handshake, once the peer listens


def transport_job(settings: TransportSettings) -> TransportJob:
    """The transport part of a worker's or probe's job, from the scenario's `transport`."""
    return TransportJob(chunk_bytes=chunk_bytes(settings.chunk), congestion=settings.congestion,
                        pacing_rate_mbps=PACING_CAP_MBPS if settings.pacing is True else None,  # auto: resolved by the run
                        connect_timeout_s=CONNECT_TIMEOUT_S)


def chunk_bytes(value: str | int) -> int:
    """``transport.chunk`` in bytes (a size like "4MiB", or a number of bytes)."""
    from testbed_core.units import parse_size

    return parse_size(value) if isinstance(value, str) else int(value)


def path_links(topology: Topology, a: str, b: str) -> tuple[tuple[str, ...], float]:
    """WAN link directions from DC a to DC b (lowest latency route) and its delay."""
    from testbed_core.topology import shortest_path

    if a == b:
        return (), 0.0
    path = shortest_path(a, b, topology.wan)
    return tuple(f"{x}->{y}" for x, y in zip(path, path[1:], strict=False)), topology.path_delay(a, b)


def nominal_link(topo: Topology, pair: tuple[str, str]) -> float | None:
    """The nominal rate of the slowest WAN link between the DCs of two hosts (None
    inside one DC)."""
    a, b = dc_of_host(pair[0]), dc_of_host(pair[1])
    if a == b:
        return None
    from testbed_core.topology import shortest_path

    path = shortest_path(a, b, topo.wan)
    return min(topo.link(x, y).rate for x, y in zip(path, path[1:], strict=False))
