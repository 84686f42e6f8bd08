"""The child's half of the readiness pipe: one JSON line on the descriptor named in
TESTBED_READY_FD, then closed; nothing without the variable; loud on a bad one."""

from __future__ import annotations

import json
import os

import pytest

from testbed_runtime.readiness import READY_FD_ENV, ReadinessError, announce_ready


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_writes_one_json_line_and_closes_the_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    monkeypatch.setenv(READY_FD_ENV, str(w))
    try:
        assert announce_ready(port=4242, host="dc1-h1", ranks=[0, 1]) is True
        data = os.read(r, 4096)
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        assert json.loads(data) == {"port": 4242, "host": "dc1-h1", "ranks": [0, 1]}
        assert os.read(r, 10) == b""  # the write end is closed: the parent sees end of file
        assert _closed(w)
        assert READY_FD_ENV not in os.environ  # a second call, or a grandchild, does nothing
        assert announce_ready(port=1) is False
    finally:
        os.close(r)


def test_without_the_variable_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(READY_FD_ENV, raising=False)
    assert announce_ready(port=1) is False
    monkeypatch.setenv(READY_FD_ENV, "")
    assert announce_ready() is False


def test_a_parent_that_stopped_listening_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    os.close(r)  # the parent gave up waiting
    monkeypatch.setenv(READY_FD_ENV, str(w))
    assert announce_ready(port=1) is False
    assert _closed(w)


@pytest.mark.parametrize("value", ["three", "1", "-4"])
def test_a_value_that_is_no_passed_pipe_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(READY_FD_ENV, value)
    with pytest.raises(ReadinessError, match=rf"{READY_FD_ENV}='{value}' is not the number of a passed pipe"):
        announce_ready(port=1)
    assert not _closed(1)  # stdout untouched


def test_a_descriptor_that_is_not_a_pipe_is_left_alone(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    path = tmp_path / "own.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        monkeypatch.setenv(READY_FD_ENV, str(fd))
        with pytest.raises(ReadinessError, match=rf"{READY_FD_ENV}={fd} names no open pipe.*pass_fds"):
            announce_ready(port=1)
        assert not _closed(fd) and path.read_bytes() == b""  # neither written nor closed
    finally:
        os.close(fd)
    monkeypatch.setenv(READY_FD_ENV, str(fd))  # closed now: not open at all
    with pytest.raises(ReadinessError, match="names no open pipe"):
        announce_ready(port=1)


def test_info_that_is_not_json_fails_before_touching_the_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    monkeypatch.setenv(READY_FD_ENV, str(w))
    try:
        with pytest.raises(TypeError):
            announce_ready(when=object())
        assert os.environ[READY_FD_ENV] == str(w) and not _closed(w)
        assert announce_ready(ok=True) is True  # the caller can still announce
        assert json.loads(os.read(r, 100)) == {"ok": True}
    finally:
        os.close(r)
