"""The live status files (testbed_runtime/live.py): the status record, its torn reads,
and the wake-up FIFO."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testbed_runtime.live import (
    LiveState,
    Nudger,
    StatusReader,
    StatusWriter,
    Waker,
    status_path,
    wake_path,
)


def test_status_record_round_trips_and_is_rewritten_in_place(tmp_path: Path) -> None:
    path = status_path(tmp_path, "dc1-h1-p0r0")
    reader = StatusReader(path)
    assert reader.read() is None  # nothing published yet
    w = StatusWriter(path)
    w.write(LiveState.WAITING, 12.5, 10.0, 3)
    got = reader.read()
    assert got is not None and (got.state, got.free_until, got.confirmed, got.iteration) == (
        LiveState.WAITING, 12.5, 10.0, 3)
    w.write(LiveState.BUSY, 0.0, 11.0, 3)
    assert reader.read().state is LiveState.BUSY
    assert path.stat().st_size == 40  # one fixed-size record, never appended
    w.close()
    reader.close()


def test_a_torn_record_is_not_believed(tmp_path: Path) -> None:
    path = tmp_path / "s.status"
    StatusWriter(path).write(LiveState.WAITING, 99.0, 1.0, 0)
    raw = bytearray(path.read_bytes())
    raw[-8:] = (12345).to_bytes(8, "little")  # sequence numbers at both ends disagree
    path.write_bytes(bytes(raw))
    assert StatusReader(path).read() is None  # no guarantee rather than a wrong one


def test_waker_wakes_on_a_poke_and_times_out_without_one(tmp_path: Path) -> None:
    path = wake_path(tmp_path, "dev")
    waker = Waker(path)
    t0 = time.monotonic()
    assert waker.wait(0.05) is False
    assert time.monotonic() - t0 >= 0.04
    nudger = Nudger(path)
    threading.Timer(0.02, nudger.poke).start()
    t0 = time.monotonic()
    assert waker.wait(5.0) is True
    assert time.monotonic() - t0 < 2.0
    assert waker.wait(0.0) is False  # the poke was consumed
    nudger.close()
    waker.close()


def test_a_poke_with_nobody_listening_is_harmless(tmp_path: Path) -> None:
    Nudger(tmp_path / "live" / "x.wake").poke()  # no reader: no error, no block


def test_a_wake_path_that_is_not_a_fifo_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("x")
    with pytest.raises(ValueError, match="not a FIFO"):
        Waker(path)
