"""The controller's side of remote execution (testbed/emulation/remote/client.py): the
first stdin line an ssh client hands the remote side (the program's environment)."""

from __future__ import annotations

import subprocess

from testbed.emulation.remote.client import send_first_line


def test_the_first_line_goes_out_and_stdin_closes_unless_kept() -> None:
    for text in (True, False):
        proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=text)
        send_first_line(proc, '{"A": "1"}\n', keep_stdin=False)
        assert proc.stdin is None  # closed: the program sees end of input after the line
        out, _ = proc.communicate(timeout=10)
        assert out == ('{"A": "1"}\n' if text else b'{"A": "1"}\n')


def test_a_kept_stdin_stays_open_for_the_program() -> None:
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    send_first_line(proc, "env\n", keep_stdin=True)
    assert proc.stdin is not None
    proc.stdin.write("more\n")
    out, _ = proc.communicate(timeout=10)
    assert out == "env\nmore\n"


def test_an_ssh_that_ended_already_is_no_error() -> None:
    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE, text=True)
    proc.wait(timeout=10)
    send_first_line(proc, "x" * (1 << 20) + "\n", keep_stdin=False)  # the pipe is broken: nothing raised
