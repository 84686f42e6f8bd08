"""The worker's live guarantees (bubbletea_agent/live.py): the status record, wake-ups,
the bounds each state gives, the learned and the byte-count bounds, the watched receive
handle, and the runner's gate."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest

from bubbletea_agent.live import (
    ArrivalFloor,
    Gate,
    LiveComm,
    LiveReporter,
    LiveState,
    LiveStatus,
    Nudger,
    ProgressBound,
    StatusReader,
    StatusWriter,
    Waker,
    WatchedChannel,
    bound_from,
    gate_path,
    status_path,
    wake_path,
)


def st(state: LiveState, free_until: float, iteration: int = 0) -> LiveStatus:
    return LiveStatus(state, free_until, 0.0, iteration)


# ------------------------------------------------------------------ records


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


# ------------------------------------------------------------------ bounds


def test_bounds_by_state() -> None:
    assert bound_from(None, None) == -math.inf
    assert bound_from(st(LiveState.BUSY, 50.0), None) == -math.inf
    assert bound_from(st(LiveState.ENDED, math.inf), None) == -math.inf
    for s in (LiveState.WAITING, LiveState.ARRIVING, LiveState.SCHEDULED):
        assert bound_from(st(s, 7.0), None) == 7.0


def test_between_iterations_the_gate_extends_the_workers_bound() -> None:
    worker = st(LiveState.BETWEEN, 10.0, iteration=4)
    assert bound_from(worker, None) == 10.0
    assert bound_from(worker, st(LiveState.GATE_ROLLING, 10.4, iteration=5)) == 10.4
    assert bound_from(worker, st(LiveState.GATE_NEXT, 11.0, iteration=5)) == 11.0
    assert bound_from(worker, st(LiveState.GATE_NEXT, 9.0, iteration=5)) == 10.0  # never shortens it
    # a gate about another iteration says nothing about this worker's next start
    assert bound_from(worker, st(LiveState.GATE_ROLLING, 30.0, iteration=4)) == 10.0
    assert bound_from(worker, st(LiveState.GATE_NEXT, 30.0, iteration=6)) == 10.0


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


# ------------------------------------------------------------------ worker side


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
    got = {"n": 0}
    progress = ProgressBound(lambda: got["n"], rate_bps=8e8, slack_bytes=0)  # 100 MB/s
    handle = FakeHandle(0.02, 0.06, nbytes=5_000_000)
    ch = WatchedChannel(FakeChannel(handle), rep, ArrivalFloor(0.0), 5_000_000, progress)
    threading.Timer(0.03, lambda: got.update(n=3_000_000)).start()
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


# ------------------------------------------------------------------ gate


def test_gate_rolling_bounds_stay_below_the_start_it_decides(tmp_path: Path) -> None:
    path = gate_path(tmp_path)
    gate = Gate(path, lead_s=0.05, period_s=0.002)
    reader = StatusReader(path)
    seen = []
    deadline = time.monotonic() + 2.0
    while len(seen) < 5 and time.monotonic() < deadline:
        s = reader.read()
        if s is not None and s.state is LiveState.GATE_ROLLING and (not seen or s.seq != seen[-1].seq):
            seen.append(s)
        time.sleep(0.003)
    assert seen and all(s.iteration == 0 for s in seen)
    at = gate.decide(0, 0.2)
    assert max(s.free_until for s in seen) < at
    nxt = reader.read()
    assert (nxt.state, nxt.iteration, nxt.free_until) == (LiveState.GATE_NEXT, 0, at)
    gate.close()
    assert os.path.exists(path)
