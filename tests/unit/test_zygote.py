"""tests/zygote.py: a program forked from the zygote ends, prints and exits as
``python SCRIPT`` would, so the tests that use it check what a plain run would give."""

from __future__ import annotations

import signal
import textwrap
import time
from pathlib import Path

import zygote

PROGRAM = """\
import os, sys, threading, time, atexit
import torch
atexit.register(lambda: print("atexit ran", flush=True))
print("argv", sys.argv[1:], "env", os.environ.get("WHO"), "main", __name__, "threads", torch.get_num_threads())
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
elif mode == "exit3":
    sys.exit(3)
elif mode == "message":
    sys.exit("a message")
elif mode == "raise":
    raise ValueError("boom")
elif mode == "os_exit":
    sys.stdout.flush()
    os._exit(5)
elif mode == "sleep":
    time.sleep(60)
"""


def _run(tmp_path: Path, mode: str) -> tuple[int, str, str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    proc = zygote.popen([str(script), mode], {"WHO": "me", "OMP_NUM_THREADS": "1"}, cwd=str(tmp_path))
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err  # type: ignore[return-value]


def test_a_forked_program_is_a_plain_run(tmp_path: Path) -> None:
    rc, out, err = _run(tmp_path, "thread")
    assert rc == 0, err
    assert "argv ['thread'] env me main __main__ threads 1" in out
    assert out.index("thread done") < out.index("atexit ran")  # threads joined, then atexit
    assert err.strip() == "to stderr"


def test_exit_statuses_are_those_of_a_plain_interpreter(tmp_path: Path) -> None:
    assert _run(tmp_path, "exit3")[0] == 3
    rc, out, err = _run(tmp_path, "message")
    assert rc == 1 and err.strip().endswith("a message")
    rc, out, err = _run(tmp_path, "raise")
    assert rc == 1 and "ValueError: boom" in err and "atexit ran" in out
    rc, out, _ = _run(tmp_path, "os_exit")
    assert rc == 5 and "atexit ran" not in out


def test_a_killed_program_reports_its_signal(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    proc = zygote.popen([str(script), "sleep"], {}, cwd=str(tmp_path))
    time.sleep(0.5)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL


def test_a_piped_program_reads_its_stdin_and_writes_its_stdout(tmp_path: Path) -> None:
    script = tmp_path / "echo.py"
    script.write_text("import sys\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)\n"
                      "print('end of input', flush=True)\nprint('to stderr', file=sys.stderr)\n")
    proc = zygote.popen([str(script)], {}, cwd=str(tmp_path), pipes=True, err=str(tmp_path / "err.log"))
    for word in ("one", "two"):  # each answer comes before the next line is sent
        proc.stdin.write(word + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == word.upper() + "\n"
    proc.stdin.close()
    assert proc.stdout.read() == "end of input\n"  # then the end of its output, as it exits
    assert proc.wait(30) == 0
    assert (tmp_path / "err.log").read_text() == "to stderr\n"
