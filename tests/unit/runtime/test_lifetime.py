"""testbed_runtime/lifetime.py: the owner mark, and a process that ends itself once its
run's controller is gone (real processes, no root needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from testbed_runtime.lifetime import (
    EXIT_OWNER_GONE,
    OWNER_ENV,
    owner_alive,
    owner_mark,
    parse_mark,
    start_time,
)


def test_mark_names_this_process_and_only_here() -> None:
    mark = owner_mark()
    assert parse_mark(mark) == (os.getpid(), start_time(os.getpid()))
    assert owner_alive(mark)
    boot, ns, pid, start = mark.rsplit(":", 3)
    assert parse_mark(f"another-boot:{ns}:{pid}:{start}") is None  # another machine: nothing to watch
    assert parse_mark(f"{boot}:1:{pid}:{start}") is None  # another PID namespace
    assert parse_mark("garbage") is None
    assert owner_alive("garbage")  # what cannot be seen is not declared gone


def test_a_reused_pid_is_not_the_owner() -> None:
    boot, ns, pid, start = owner_mark().rsplit(":", 3)
    assert not owner_alive(f"{boot}:{ns}:{pid}:{int(start) + 1}")  # same PID, another start time


WATCHER = textwrap.dedent("""
    import time
    from testbed_runtime.lifetime import watch_owner
    assert watch_owner(poll_s=0.05) is not None
    print("watching", flush=True)
    time.sleep(60)
""")


def test_watcher_ends_its_process_when_the_owner_is_gone() -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        env = dict(os.environ, **{OWNER_ENV: owner_mark(owner.pid)})
        child = subprocess.Popen([sys.executable, "-c", WATCHER], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "watching"
        assert child.poll() is None  # the owner runs: so does it
        owner.kill()
        owner.wait()
        assert child.wait(timeout=30) == EXIT_OWNER_GONE
        assert f"the run's controller (pid {owner.pid}) is gone; exiting" in (child.stderr.read() if child.stderr else "")
    finally:
        owner.kill()


def test_no_mark_no_watch() -> None:
    out = subprocess.run([sys.executable, "-c", "from testbed_runtime.lifetime import watch_owner; print(watch_owner())"],
                         env={k: v for k, v in os.environ.items() if k != OWNER_ENV}, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "None"
