"""A BubbleTea agent stopped (SIGSTOP) and another killed (SIGKILL) while each holds its
device, in a real `testbed run` (root, the 2dc topology): training takes the device back
at the hold's deadline plus the guard (at once from the stopped one), the run completes,
and summary.json names the revoked lease, its request and its cause (issue 30)."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.device_records import Lease

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


def _devices(variant: Path) -> Path | None:
    """The device folder the variant plays in: its jobs name it (in memory while it plays,
    testbed/emulation/memfs.py; copied to ``<variant>/run/devices`` after)."""
    for job in sorted((variant / "jobs").glob("p*.json")) if (variant / "jobs").exists() else []:
        try:
            return Path(json.loads(job.read_text())["device"]["run_dir"]) / "devices"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _saboteur(variant: Path, done: threading.Event, acts: list[tuple[str, str, int]]) -> None:
    """Stop the first agent seen holding a device (and let it go on 2 s later), then kill
    the first one seen holding another device."""
    stopped: tuple[int, float] | None = None
    devices: Path | None = None
    while not done.is_set():
        devices = devices or _devices(variant)
        for path in sorted(devices.glob("*.lease.json")) if devices is not None and devices.exists() else []:
            try:
                lease = Lease.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            device = path.name.removesuffix(".lease.json")
            if any(d == device for _, d, _ in acts):
                continue
            if stopped is None:
                os.kill(lease.pid, signal.SIGSTOP)
                stopped = (lease.pid, time.time())
                acts.append(("stop", device, lease.pid))
            elif not any(a == "kill" for a, _, _ in acts) and lease.pid != stopped[0]:
                os.kill(lease.pid, signal.SIGKILL)
                acts.append(("kill", device, lease.pid))
        if stopped is not None and stopped[1] and time.time() - stopped[1] > 2.0:
            os.kill(stopped[0], signal.SIGCONT)
            stopped = (stopped[0], 0.0)
        time.sleep(0.002)
    if stopped is not None and stopped[1]:
        os.kill(stopped[0], signal.SIGCONT)


@pytest.mark.timeout(600)
def test_a_stopped_and_a_killed_agent_cannot_stall_training(tmp_path: Path, namespaces) -> None:
    scenario, resolved = load_scenario(ROOT / "scenarios/quickstart.yaml", {
        "variants": ["atlas"], "workload.warmup": 1, "workload.iterations": 3, "runner.calibrate": False,
        "runner.base_port": 39700, "bubbletea.requests.rate": 80, "runner.bubbletea_idle_twin": False,
    })
    out = tmp_path / "out"
    acts: list[tuple[str, str, int]] = []
    done = threading.Event()
    spy = threading.Thread(target=_saboteur, args=(out / "atlas+bubbletea", done, acts))
    spy.start()
    log = io.StringIO()
    try:
        run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    finally:
        done.set()
        spy.join(10)
    print(log.getvalue(), acts)
    assert [a for a, _, _ in acts][:1] == ["stop"], acts
    summary = json.loads((out / "summary.json").read_text())
    plain, bt = summary["variants"]["atlas"], summary["variants"]["atlas+bubbletea"]
    assert "error" not in plain, plain.get("error")
    # the stopped holder's lease was revoked, named with its request and why
    events = [json.loads(line) for p in (out / "atlas+bubbletea" / "run" / "devices").glob("*.overruns.jsonl")
              for line in p.read_text().splitlines()]
    stopped_device = acts[0][1]
    revoked = [e for e in events if e["event"] == "revoked" and e["device"] == stopped_device]
    assert revoked and "stopped (SIGSTOP)" in revoked[0]["cause"] and revoked[0]["label"].endswith(":hold")
    assert "error" not in bt, bt.get("error")  # the run completed, the killed agent's requests as far as it got
    g = bt["guard_overruns"]
    print("guard_overruns:", json.dumps({k: g[k] for k in ("worst_training_wait_s", "lease_revocations")}),
          g["lease_overruns"][:3])
    assert g["lease_revocations"] >= 1
    # training never waited for the stopped holder: a revocation is at once, the guard is 5 ms
    stopped_waits = [w for w in g["worst"] if w["device"] == stopped_device]
    assert all(w["waited_s"] < 0.5 for w in stopped_waits), stopped_waits  # not its 2 s stop
    assert len(bt["iteration_times_s"]) == 3
