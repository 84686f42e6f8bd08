"""Nothing of the toolkit remains (process, namespace, interface, record, temporary
folder or socket) after (a) a normal run of `testbed topo up`, (b) Ctrl-C in the
middle of `testbed topo check`, (c) SIGKILL of the toolkit followed by `testbed clean`,
(d) SIGKILL of `testbed run` at random moments followed by `testbed clean`."""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed.emulation.records import ENV_RUN, RECORD_DIR, ProcFS

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TOPO = str(REPO / "topologies" / "2dc.yaml")
TESTBED = [sys.executable, "-m", "testbed.cli"]


def leftovers(prefix: str, netns: set[int]) -> list[str]:
    """Everything of run `prefix` still on the machine."""
    procfs = ProcFS()
    found = []
    for pid in procfs.pids():
        if pid == os.getpid():
            continue
        cmd = procfs.cmdline(pid) or ""
        in_ns = procfs.netns(pid) in netns and not _other_run(pid, prefix, cmd)
        if prefix in cmd or procfs.environ_has(pid, ENV_RUN, prefix) or in_ns:
            if procfs.start_time(pid) is not None and not _zombie(pid):
                found.append(f"process {pid}: {cmd[:80]}")
    found += [f"interface {n}" for n in os.listdir("/sys/class/net") if n.startswith(prefix)]
    if os.path.isdir("/run/netns"):
        found += [f"netns {n}" for n in os.listdir("/run/netns") if n.startswith(prefix)]
    if (RECORD_DIR / f"{prefix}.json").exists():
        found.append(f"record {RECORD_DIR / f'{prefix}.json'}")
    for tmp in (Path(tempfile.gettempdir()), Path("/dev/shm")):  # /dev/shm: a variant's step files (memfs.py)
        if tmp.is_dir():
            found += [f"temporary {p}" for p in tmp.iterdir() if p.name.startswith(f"{prefix}-")]
    return found


def _other_run(pid: int, prefix: str, cmd: str) -> bool:
    """Whether `pid` or one of its ancestors carries another run's mark: the kernel gives
    a freed namespace's number to the next one made, and other runs may be making
    namespaces meanwhile (e.g. a test rig's sshd whose pre-auth child, `sshd: [accepted]`,
    carries no mark of its own)."""
    procfs = ProcFS()
    for _ in range(64):
        if _marked_by_other(pid, prefix, cmd):
            return True
        pid = procfs.ppid(pid) or 0
        if pid <= 1:
            return False
        cmd = procfs.cmdline(pid) or ""
    return False


def _marked_by_other(pid: int, prefix: str, cmd: str) -> bool:
    if re.search(r"mininet:tb[0-9a-f]{3}", cmd) and f"mininet:{prefix}" not in cmd:
        return True
    marks = set(re.findall(r"/tb[0-9a-f]{3}(?=-)", cmd))  # a run's folder: /tmp/tbXXX-rig-..., /tmp/tbXXX-ctl-...
    if marks and f"/{prefix}" not in marks:  # e.g. a test rig's ssh in a namespace that got a freed number
        return True
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(e.startswith(f"{ENV_RUN}=".encode()) and e != f"{ENV_RUN}={prefix}".encode() for e in env)


def clean_failures(done: subprocess.CompletedProcess, prefix: str) -> list[str]:
    """The failures `testbed clean` reported about run `prefix` (other runs' records on a
    shared machine may fail for reasons of their own)."""
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("failed") and prefix in line]


def _zombie(pid: int) -> bool:
    """Gone or a zombie (ProcFS reads /proc/<pid>/stat, as `testbed clean` does)."""
    return ProcFS().state(pid) in (None, "Z")


def read_until(proc: subprocess.Popen, pattern: str, timeout: float, stream: str = "stderr") -> tuple[str, str]:
    """Read lines of proc's `stream` until one matches `pattern`; returns (match, all text).
    Reads the pipe's fd directly: select() on a text pipe misses lines its reader has
    already buffered (two lines written together)."""
    fd = getattr(proc, stream).fileno()
    pending = proc.__dict__.setdefault("_pending_" + stream, [""])  # what followed the last match
    text = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while "\n" in pending[0]:
            line, pending[0] = pending[0].split("\n", 1)
            text += line + "\n"
            m = re.search(pattern, line)
            if m:
                return m.group(1) if m.groups() else m.group(0), text
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            pending[0] += chunk.decode(errors="replace")
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got:\n{text}")


def record_netns(prefix: str) -> set[int]:
    data = json.loads((RECORD_DIR / f"{prefix}.json").read_text())
    return {n["netns"] for n in data["nodes"] if n.get("netns")}


def wait_gone(prefix: str, netns: set[int], timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(prefix, netns)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_normal_run_of_topo_up_leaves_nothing():
    proc = subprocess.Popen([*TESTBED, "topo", "up", TOPO], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        prefix, _ = read_until(proc, r"run (tb[0-9a-f]{3}):", 30)
        read_until(proc, r"built in", 30)
        netns = record_netns(prefix)
        assert len(netns) == 7
        out, err = proc.communicate("dc1-h1 ping -c2 -W2 dc2-h2\nnodes\nexit\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    both = out + err  # Mininet's CLI prints node output through its logger (stderr)
    assert "2 received" in both  # dc2-h2 was replaced by its address and answered
    assert "wan-dc1-dc2" in both
    assert "torn down in" in err
    assert wait_gone(prefix, netns) == []


def test_b_ctrl_c_in_the_middle_of_topo_check_leaves_nothing():
    proc = subprocess.Popen([*TESTBED, "topo", "check", TOPO, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        prefix, _ = read_until(proc, r"run (tb[0-9a-f]{3}):", 30)
        netns = record_netns(prefix)
        read_until(proc, r"goodput dc1-h1", 60)
        time.sleep(1.5)  # iperf3 is running now, relay busy
        assert leftovers(prefix, netns), "the run should be alive before Ctrl-C"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted: the emulation was torn down" in err
    assert out == ""
    assert wait_gone(prefix, netns) == []


KILLED_SCRIPT = """
import sys, time
from testbed.emulation.network import Emulation
emu = Emulation.from_file(sys.argv[1])
emu.start()
emu.host("dc2", 0).popen(["sleep", "300"])
emu.host("dc1", 1).popen(["python3", "-c", "import time; time.sleep(300)"])
import socket
ctl = emu.temp_dir("ctl")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(str(ctl / "runner.sock"))
print("READY", emu.prefix, flush=True)
time.sleep(300)
"""


def test_c_sigkill_then_testbed_clean_leaves_nothing():
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, TOPO], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        prefix, _ = read_until(proc, r"READY (tb[0-9a-f]{3})", 60, stream="stdout")
        netns = record_netns(prefix)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(1.0)  # node shells see EOF, the relay its parent's death
    left = leftovers(prefix, netns)
    print("\nleft behind by SIGKILL:", left)
    assert any("sleep 300" in item for item in left), "the spawned processes survive SIGKILL"
    assert not any("testbed.emulation.delayline" in item for item in left), "relays die with their parent"
    assert any(item.startswith("temporary ") for item in left), "the run's temporary folder survives SIGKILL"
    dry = subprocess.run([*TESTBED, "clean", "--dry-run"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert dry.returncode == 0 and "would kill" in dry.stdout
    assert leftovers(prefix, netns) == left
    done = subprocess.run([*TESTBED, "clean"], capture_output=True, text=True, cwd=REPO, timeout=60)
    print(done.stdout)
    assert clean_failures(done, prefix) == [], done.stderr
    assert f"did remove-record   {RECORD_DIR / prefix}.json" in done.stdout and "did kill" in done.stdout
    assert leftovers(prefix, netns) == []  # at once: clean returns when all of it is gone
    assert "did remove-path" in done.stdout


def test_d_testbed_run_killed_at_random_moments_then_clean_leaves_nothing():
    """`testbed run` of the quickstart (its workers, agents, decode servers, relays,
    control sockets) killed with SIGKILL at a random moment of its setup or training
    (seeded: the moments are printed; TESTBED_KILLS=N kills N runs, TESTBED_KILL_SEED
    picks the moments), then `testbed clean`: nothing of it is left."""
    rng = random.Random(int(os.environ.get("TESTBED_KILL_SEED", "11")))
    scenario = str(REPO / "scenarios" / "quickstart.yaml")
    for _ in range(int(os.environ.get("TESTBED_KILLS", "1"))):
        out_dir = Path(tempfile.mkdtemp(prefix="tbtest-kill-"))
        proc = subprocess.Popen([*TESTBED, "run", scenario, "-o", str(out_dir), "--variants", "atlas+bubbletea"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            prefix, _ = read_until(proc, r"run (tb[0-9a-f]{3}):", 60)
            netns = record_netns(prefix)
            moment = rng.uniform(1.0, 25.0)
            print(f"\nrun {prefix}: SIGKILL after {moment:.1f} s")
            time.sleep(moment)
            proc.kill()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        print("left behind:", leftovers(prefix, netns))
        done = subprocess.run([*TESTBED, "clean"], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert clean_failures(done, prefix) == [], done.stdout + done.stderr
        assert leftovers(prefix, netns) == [], done.stdout  # at once, no waiting
        subprocess.run(["rm", "-rf", str(out_dir)], check=False)
