"""The worker's side of the live status (testbed_runtime/live_reporter.py): the learned
and the byte-count bounds, the watched receive handle, and the states between iterations."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testbed_runtime.live import LiveState, LiveStatus, Nudger, StatusWriter, Waker
from testbed_runtime.live_reporter import (
    ArrivalFloor,
    LiveComm,
    LiveReporter,
    ProgressBound,
    WatchedChannel,
)


def test_arrival_floor_starts_nominal_then_learns_the_shortest_transfer() -> None:
    f = ArrivalFloor(0.067, min_samples=3, margin_s=0.003, margin_rel=0.03)
    assert f.floor_s == 0.067
    for d in (0.120, 0.095, float("nan"), -1.0, 0.110):
        f.observe(d)
    assert f.floor_s == pytest.approx(0.095 * 0.97 - 0.003)


def test_progress_bound_is_what_the_missing_bytes_need_at_the_shaped_rate() -> None:
    got = {"n": 1000}  # the handshake
    p = ProgressBound(lambda: got["n"], rate_bps=8e9, slack_bytes=0)  # 1 GB/s
    assert p.bound(100.0, 10_000_000) == pytest.approx(100.010)
    got["n"] += 4_000_000
    assert p.bound(100.0, 10_000_000) == pytest.approx(100.006)
    got["n"] += 6_000_000 + 500  # the rest, and a control frame
    p.completed(10_000_000)
    assert p.bound(200.0, 10_000_000) == pytest.approx(200.0 + (10_000_000 - 500) / 1e9)
    assert ProgressBound(lambda: 0, 8e9, slack_bytes=20_000_000).bound(5.0, 10_000_000) == 5.0

class FakeHandle:
    """An atlas_transport receive handle: tid appears with the first frame, then done."""

    def __init__(self, announce_after: float, done_after: float, nbytes: int = 8_000_000) -> None:
        self.t0 = time.monotonic()
        self.announce_after, self.done_after, self.size = announce_after, done_after, nbytes
        self.completed_at: float | None = None
        self._event = threading.Event()

    @property
    def tid(self) -> int | None:
        return 7 if time.monotonic() - self.t0 >= self.announce_after else None

    @property
    def nbytes(self) -> int | None:
        return self.size if self.tid is not None else None

    def done(self) -> bool:
        if not self._event.is_set() and time.monotonic() - self.t0 >= self.done_after:
            self.completed_at = self.t0 + self.done_after
            self._event.set()
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> str:
        if not self.done():
            raise TimeoutError("fake handle not complete")
        return "tensor"

    def describe(self) -> str:
        return "recv of a fake transfer"


class FakeChannel:
    def __init__(self, handle: FakeHandle) -> None:
        self.handle = handle
        self.closed = False

    def irecv(self, tag: int) -> FakeHandle:
        return self.handle

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


class Recorder(StatusWriter):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.history: list[LiveStatus] = []

    def write(self, state, free_until, confirmed, iteration):  # type: ignore[override]
        rec = super().write(state, free_until, confirmed, iteration)
        self.history.append(rec)
        return rec


def test_watched_wait_rolls_then_fixes_the_bound_and_learns_the_transfer(tmp_path: Path) -> None:
    writer = Recorder(tmp_path / "w.status")
    rep = LiveReporter(writer, poll_s=0.002)
    floor = ArrivalFloor(0.030)
    ch = WatchedChannel(FakeChannel(FakeHandle(0.05, 0.10)), rep, floor, 8_000_000)
    assert ch.irecv(1).wait(5.0) == "tensor"
    states = [h.state for h in writer.history]
    assert states[0] is LiveState.WAITING and LiveState.ARRIVING in states and states[-1] is LiveState.BUSY
    waiting = [h for h in writer.history if h.state is LiveState.WAITING]
    assert all(h.free_until == pytest.approx(h.confirmed + 0.030) for h in waiting)  # rolls with each poll
    assert waiting[-1].confirmed > waiting[0].confirmed
    arriving = [h for h in writer.history if h.state is LiveState.ARRIVING]
    assert len({h.free_until for h in arriving}) == 1  # fixed once the first frame is in
    assert arriving[0].free_until == pytest.approx(waiting[-1].confirmed + 0.030)
    assert floor.samples and 0.045 <= floor.samples[0] <= 0.2  # last unseen poll -> completion
    assert rep.stats["waits"] == 1 and rep.stats["announced_at_entry"] == 0
    assert ch.closed is False and ch.floor is floor  # the rest passes through


def test_watched_wait_with_byte_counts_uses_the_missing_bytes(tmp_path: Path) -> None:
    writer = Recorder(tmp_path / "w.status")
    rep = LiveReporter(writer, poll_s=0.002)
    # bytes arrive once the wait was announced (not after a wall-clock delay: on a busy machine
    # a timer could fire before the reporter's first poll), and the transfer ends well after
    def received() -> int:
        return 3_000_000 if any(h.state is LiveState.WAITING for h in writer.history) else 0

    progress = ProgressBound(received, rate_bps=8e8, slack_bytes=0)  # 100 MB/s
    handle = FakeHandle(0.02, 0.5, nbytes=5_000_000)
    ch = WatchedChannel(FakeChannel(handle), rep, ArrivalFloor(0.0), 5_000_000, progress)
    ch.irecv(1).wait(5.0)
    bounds = [(h.state, h.free_until - h.confirmed) for h in writer.history if h.state is not LiveState.BUSY]
    assert bounds[0][0] is LiveState.WAITING and bounds[0][1] == pytest.approx(0.05, abs=0.005)
    assert any(s is LiveState.ARRIVING for s, _ in bounds)
    assert progress.consumed == 5_000_000  # the next tensor starts counting from here


def test_watched_wait_times_out_like_the_transport(tmp_path: Path) -> None:
    rep = LiveReporter(StatusWriter(tmp_path / "w.status"), poll_s=0.002)
    ch = WatchedChannel(FakeChannel(FakeHandle(10, 10)), rep, ArrivalFloor(0.01), 1)
    with pytest.raises(TimeoutError, match="fake transfer not complete after 0.05 s"):
        ch.irecv(1).wait(0.05)
    assert rep.state is LiveState.BUSY  # no guarantee left behind


def test_reporter_states_between_iterations(tmp_path: Path) -> None:
    now = {"t": 100.0}
    writer = Recorder(tmp_path / "w.status")
    waker = Waker(tmp_path / "w.wake")
    rep = LiveReporter(writer, Nudger(tmp_path / "w.wake"), lead_s=0.05, clock=lambda: now["t"])
    rep.between()
    assert writer.last.state is LiveState.BETWEEN and writer.last.free_until == pytest.approx(100.05)
    rep.scheduled(3, 101.0)
    assert (writer.last.state, writer.last.free_until, writer.last.iteration) == (LiveState.SCHEDULED, 101.0, 3)
    assert waker.wait(0.5) is True  # state changes wake the agent
    comm_calls = []

    class Comm:
        def send(self, key, payload):
            comm_calls.append(("send", key))

        def recv(self, key):
            return "x"

        def flush(self):
            comm_calls.append(("flush", writer.last.state))

    live = LiveComm(Comm(), rep)
    live.send("k", None)
    assert live.recv("k") == "x"
    now["t"] = 102.0
    live.flush()
    assert comm_calls == [("send", "k"), ("flush", LiveState.BETWEEN)]  # the bound is set before flushing
    rep.ended()
    assert writer.last.state is LiveState.ENDED
    rep.close()
    waker.close()
