"""Batched socket I/O of the delay line (recvmmsg/sendmmsg through ctypes) over
AF_UNIX datagram socketpairs: frames, lengths, truncation, kernel stamps, refusals."""

from __future__ import annotations

import errno
import socket
import time

import pytest

from testbed.emulation.delayline.batch import BatchReceiver, BatchSender


@pytest.fixture
def pair() -> tuple[socket.socket, socket.socket]:
    far, near = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    near.setblocking(False)
    yield far, near
    far.close()
    near.close()


def test_one_call_reads_every_waiting_frame_with_its_arrival_stamp(pair) -> None:
    far, near = pair
    rx = BatchReceiver(near, slot=2048, vlen=8)
    assert rx.recv() == []
    frames = [bytes([i]) * (100 + i) for i in range(5)]
    t0 = time.monotonic()
    for f in frames:
        far.send(f)
    time.sleep(0.05)  # they wait in the socket; the stamps say when they arrived
    got = rx.recv()
    t1 = time.monotonic()
    assert [bytes(rx.view[off : off + n]) for off, n, _ in got] == frames
    stamps = [s for _, _, s in got]
    assert stamps == sorted(stamps)
    assert t0 - 0.001 <= stamps[0] and stamps[-1] <= t1
    assert t1 - stamps[-1] >= 0.04  # the kernel's time, not the read's
    assert rx.recv() == []


def test_more_frames_than_vlen_take_several_calls(pair) -> None:
    far, near = pair
    rx = BatchReceiver(near, slot=256, vlen=4)
    for i in range(6):
        far.send(bytes([i]) * 10)
    first, second = rx.recv(), rx.recv()
    assert (len(first), len(second)) == (4, 2)
    assert bytes(rx.view[second[1][0] : second[1][0] + 10]) == bytes([5]) * 10


def test_a_frame_larger_than_the_slot_is_reported_truncated(pair) -> None:
    far, near = pair
    rx = BatchReceiver(near, slot=64, vlen=4)
    far.send(b"x" * 500)
    far.send(b"y" * 10)
    (_, n_big, _), (off, n_small, _) = rx.recv()
    assert n_big >= 64  # the relay counts it as truncated
    assert n_small == 10 and bytes(rx.view[off : off + 10]) == b"y" * 10


def test_sender_sends_a_batch_in_order_and_reports_a_refusal(pair) -> None:
    far, near = pair
    far.setblocking(False)
    tx = BatchSender(near, vlen=4)
    frames = [bytes([i]) * 50 for i in range(6)]
    assert tx.send(frames) == (4, 0)  # at most vlen per call
    assert tx.send(frames, 4) == (2, 0)
    assert [far.recv(100) for _ in range(6)] == frames
    # the receiving socket full: the kernel takes some, then refuses with EAGAIN
    far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = [b"z" * 2000] * 4
    taken = 0
    for _ in range(200):
        n, err = tx.send(big)
        taken += n
        if err:
            break
    assert err == errno.EAGAIN and taken > 0


def test_the_clock_shift_ignores_a_read_preempted_between_its_two_clocks() -> None:
    """Realtime runs 1000 s ahead of the monotonic clock; the first bracket loses a
    millisecond between its reads (a busy core). Read the old way (realtime after one
    monotonic read) every stamp of that batch would fall 1 ms early and the relay would
    release its frames 1 ms before their delay; the tightest bracket is kept instead."""
    from testbed.emulation.delayline.batch import realtime_shift

    t = [10.0]
    steps = iter([0.0, 1e-3, 2e-6, 2e-6, 2e-6, 2e-6, 2e-6, 2e-6, 2e-6])  # time lost before each read

    def tick() -> float:
        t[0] += next(steps)
        return t[0]

    def realtime() -> float:
        return tick() + 1000.0

    assert realtime_shift(tick, realtime) == pytest.approx(1000.0, abs=5e-6)


def test_the_clock_shift_of_this_machine_matches_its_clocks() -> None:
    from testbed.emulation.delayline.batch import realtime_shift

    got = realtime_shift()
    assert abs(got - (time.time() - time.monotonic())) < 0.01
