"""Test-suite wiring shared by the tests of every layer.

Markers (registered in pyproject.toml):

* ``root``: needs root and network namespaces; skipped, with the reason, when not root.
* ``gpu``: needs a CUDA GPU; skipped, with the reason, where torch sees none. torch is
  imported for that check only when a collected test carries the marker.
* ``long``: a whole end-to-end run of a minute or more on 2 cores (the multi-server and
  real-machine runs, the 3-DC run, real prefill in real training); skipped unless
  ``TESTBED_LONG_TESTS=1`` (``make test-long``), so ``make test`` stays within its time.
* ``alone``: a root test whose checks are measurements of the emulated network (RTT,
  loss, order) that a concurrent run would skew; ``make test`` runs these one at a time,
  after the others. The other root and cluster tests run three at a time there (xdist
  ``--dist loadgroup``): each test file is one group, so the tests of a file never
  overlap (and share one rig); the tests that crash runs on purpose and clean up after
  them (``_CLEANING`` files, and single tests marked ``cleans``) are one group,
  "clean": one ``testbed clean`` at a time, and no dead record of one test in view of
  another's clean.
* ``floor``: asserts a throughput, a speedup ratio or a duration that depends on the
  machine's speed (a benchmark floor, mostly under ``tests/floors/``); skipped unless
  ``TESTBED_FLOOR_TESTS=1`` (``make floors``, on a quiet machine), so that noise on busy
  cores never fails ``make test``. The default suite checks the same runs for correctness
  and prints their figures.

Fixtures:

* ``child_env``: the environment for a Python child process that must import this
  checkout (the repository root first on PYTHONPATH), whatever the child's working
  directory and whether or not the package is installed.
* ``tiny_workload``: the shipped ``scenarios/workloads/tiny.yaml``, loaded.

Measuring the suite: with ``TESTBED_TEST_TIMES=<file>`` each test appends a JSON line to
that file with its node id, its wall time and the CPU time it used (this process and the
children it waited for), so a slow test shows whether it computes or waits, and its xdist
worker and end time (epoch seconds), so the order of each worker's tests shows.

Paths to shipped files come from ``testbed_core.constants`` (REPO_ROOT,
TOPOLOGIES_DIR, SCENARIOS_DIR, WORKLOADS_DIR), not from each test's own ``__file__``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Generator
from pathlib import Path

import pytest

from testbed_core.constants import REPO_ROOT, WORKLOADS_DIR

# Test files that crash a run on purpose or leave a dead run's record, and then end what
# it left with `testbed clean` (which ends every dead run on the machine) or its record's
# plan; single such tests elsewhere carry the `cleans` mark. With pytest-xdist they share
# one group, "clean", so that no other test's clean ends their leftovers first, and no
# clean from one rig's head tries another rig's dead run over SSH (both rigs have the
# same addresses, each in its own namespaces).
_CLEANING = {"test_teardown.py", "test_kill_anywhere.py", "test_launch.py", "test_cluster_clean_remote.py"}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_configure(config: pytest.Config) -> None:
    """Give SIGINT its default meaning back when the suite was started with it ignored.

    A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and an
    ignored signal stays ignored across exec: every toolkit command the tests start would
    then ignore the Ctrl-C that the teardown tests send it, and those tests would fail for
    a reason that is not the toolkit's.

    Under pytest-xdist, in a fresh checkout, the controller compiles for all its workers
    once what each of them compiled again: the what-if kernel numba has not cached yet
    (`_warm_whatif_kernel`) and the test modules' assertion rewrites (`_rewrite_test_modules`)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(config, "workerinput"):
        if os.environ.get(_KERNEL_LOCK_ENV):
            _await_whatif_kernel(os.environ[_KERNEL_LOCK_ENV])
    elif config.getoption("dist", "no") != "no" and not config.getoption("collectonly"):
        _warm_whatif_kernel(config)
        _rewrite_test_modules(config)


def _rewrite_test_modules(config: pytest.Config) -> None:
    """Under pytest-xdist in a fresh checkout each worker rewrites every test module
    (pytest's assertion rewriting) and caches it in __pycache__ itself, about 5 CPU s a
    worker; done here once instead, before the workers start, in two processes, for the
    modules without a cached rewrite (those the workers then load; a stale one they redo)."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
        )
    except ImportError:  # another pytest: the workers rewrite, as without this
        return
    if sys.dont_write_bytecode or assertstate_key not in config.stash:
        return
    ignored = [os.path.abspath(p) for p in config.getoption("ignore") or []]
    todo = []
    for arg in config.args:
        root = os.path.abspath(arg.split("::")[0])
        files = [root] if root.endswith(".py") else sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
        for fn in files:
            name = os.path.basename(fn)
            if not (name.startswith("test_") or name == "conftest.py") or any(
                    fn == i or fn.startswith(i + os.sep) for i in ignored):
                continue
            path = Path(fn)
            if not (get_cache_dir(path) / (name[:-3] + PYC_TAIL)).exists():
                todo.append(path)
    if len(todo) < 8:
        return
    state = config.stash[assertstate_key]

    def rewrite(paths: list[Path]) -> None:
        for path in paths:
            try:
                os.makedirs(get_cache_dir(path), exist_ok=True)
                source_hash, co = _rewrite_test(path, config)
                _write_pyc(state, co, source_hash, get_cache_dir(path) / (path.name[:-3] + PYC_TAIL))
            except Exception:  # noqa: BLE001 (a file that does not compile: its worker reports it)
                continue

    pid = os.fork()
    if pid == 0:  # half of them in a child (no threads run yet: xdist starts its gateways later)
        try:
            rewrite(todo[::2])
        finally:
            os._exit(0)
    rewrite(todo[1::2])
    os.waitpid(pid, 0)


# The what-if engine's loop (testbed_core/whatif/kernel.py) is compiled by numba on first
# use and cached next to it (__pycache__), once per checkout: in a fresh clone each xdist
# worker that reached a what-if before another had written the cache compiled it too, about
# 5 CPU s each. Instead, the controller compiles it once in a background process, started
# before the workers (which take seconds to start and collect), holding a lock until it
# is cached; a worker's first call of the kernel waits for that lock, then loads the cache.
_KERNEL_LOCK_ENV = "TESTBED_TEST_KERNEL_LOCK"
_WHATIF_KERNEL = REPO_ROOT / "testbed_core" / "whatif" / "kernel.py"
_WARM_KERNEL = ("from testbed.cli import main; main(['whatif', '--topology', 'topologies/2dc.yaml', "
                "'--workload', 'scenarios/workloads/tiny.yaml', '--variants', 'baseline'], standalone_mode=False)")


def _kernel_cached() -> bool:
    """Whether numba's cache index of the kernel is there and no older than its source."""
    source = _WHATIF_KERNEL.stat().st_mtime
    return any(p.stat().st_mtime >= source for p in (_WHATIF_KERNEL.parent / "__pycache__").glob("kernel.run_steps-*.nbi"))


def _warm_whatif_kernel(config: pytest.Config) -> None:
    import fcntl
    import tempfile

    if _kernel_cached():
        return
    lock = os.path.join(tempfile.mkdtemp(prefix="testbed-kernel-"), "lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by the compiling child (it inherits this open file) until it exits
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen([sys.executable, "-c", _WARM_KERNEL], cwd=REPO_ROOT, env=env, pass_fds=(fd,),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return  # the workers compile it, as without this
    finally:
        os.close(fd)  # the child's copy keeps the lock
    os.environ[_KERNEL_LOCK_ENV] = lock  # inherited by the workers, started after this hook
    config.add_cleanup(lambda: _end(proc, lock))


def _end(proc: subprocess.Popen, lock: str) -> None:
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(os.path.dirname(lock), ignore_errors=True)


def _await_whatif_kernel(lock: str) -> None:
    """In a worker: the kernel's first call waits until the controller's compile has
    ended (its lock is free), then runs the kernel numba loads from the cache."""
    import fcntl

    from testbed_core.whatif import kernel

    compiled = kernel.run_steps

    def run_steps(*args: object, **kwargs: object) -> object:
        try:
            with open(lock) as f:
                fcntl.flock(f, fcntl.LOCK_SH)
        except OSError:
            pass
        kernel.run_steps = compiled
        return compiled(*args, **kwargs)

    kernel.run_steps = run_steps


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook turns xdist_group marks into groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _CLEANING or "cleans" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("clean"))
        elif "root" in item.keywords or "cluster" in item.keywords or "spread" not in item.keywords:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))  # as --dist loadfile: one worker a file
        else:  # slow tests that share nothing: each its own group, so they spread over the workers
            item.add_marker(pytest.mark.xdist_group(re.sub(r"[^\w.-]", "_", f"{item.path.stem}-{item.name}")))
    if config.getoption("loadgroup", default=False):
        _group_ids(items)
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root and network namespaces (run as root, e.g. sudo make test)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)
    if os.environ.get("TESTBED_LONG_TESTS") != "1":
        skip = pytest.mark.skip(reason="a long end-to-end run: set TESTBED_LONG_TESTS=1 (make test-long)")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip)
    if os.environ.get("TESTBED_FLOOR_TESTS") != "1":
        skip = pytest.mark.skip(reason="a benchmark floor: set TESTBED_FLOOR_TESTS=1 (make floors) to run it")
        for item in items:
            if "floor" in item.keywords:
                item.add_marker(skip)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false here)")
        for item in gpu_items:
            item.add_marker(skip)


def _group_ids(items: list[pytest.Item]) -> None:
    """What pytest-xdist's --dist loadgroup does to a grouped test's id (the group after an
    ``@``, from which its scheduler groups the tests), done here on the id pytest 9 reads:
    xdist 3.8 writes ``item._nodeid``, which pytest 9 no longer uses, so its groups were
    silently dropped (every test its own group)."""
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """With TESTBED_TEST_TIMES set: the test's wall and CPU seconds (setup to teardown),
    its worker and when it ended, appended to that file as a JSON line."""
    path = os.environ.get("TESTBED_TEST_TIMES")
    if not path:
        return (yield)
    wall0, cpu0 = time.monotonic(), _cpu_s()
    try:
        return (yield)
    finally:
        line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall0, 2),
                "cpu_s": round(_cpu_s() - cpu0, 2), "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                "end": round(time.time(), 2)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


@pytest.fixture()
def child_env() -> dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH, for `python -c ...` children."""
    path = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


@pytest.fixture()
def tiny_workload():
    """scenarios/workloads/tiny.yaml: the small real-mode model (dp=2, pp=2)."""
    from testbed_core.workload import load_workload

    return load_workload(WORKLOADS_DIR / "tiny.yaml")
