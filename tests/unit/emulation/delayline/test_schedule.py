"""The delay line's sans-IO scheduler: deadlines, jitter order, loss, counters."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_frames import make_tcp_gso  # same folder (rootdir-less import)

from testbed.emulation.delayline import frames as fr
from testbed.emulation.delayline.schedule import DelayQueue, LinkParams, ParamError


def plain(i: int, size: int = 100) -> bytes:
    """A non-GSO frame carrying its index."""
    return fr.VNET.pack(0, 0, 0, 0, 0, 0) + i.to_bytes(4, "big") + b"\x00" * (size - 4)


def drain(q: DelayQueue, now: float) -> list[bytes]:
    return list(q.pop_due(now))


def test_frames_leave_exactly_after_the_delay() -> None:
    q = DelayQueue(LinkParams(delay_s=0.025), random.Random(1))
    q.push(plain(0), now=10.0)
    q.push(plain(1), now=10.001)
    assert q.next_deadline() == pytest.approx(10.025)
    assert drain(q, 10.0249) == []  # never early
    assert drain(q, 10.025) == [plain(0)]
    assert drain(q, 10.0259) == []
    assert drain(q, 10.026) == [plain(1)]
    assert q.next_deadline() is None and len(q) == 0 and q.queued_bytes == 0


def test_offset_shortens_the_queue_delay_never_below_zero() -> None:
    """The path's own latency is left out of the queue, so the path's total is the delay."""
    q = DelayQueue(LinkParams(delay_s=0.025, offset_s=0.0002), random.Random(1))
    q.push(plain(0), now=10.0)
    assert q.next_deadline() == pytest.approx(10.0248)
    q = DelayQueue(LinkParams(delay_s=0.0001, offset_s=0.0002), random.Random(1))
    q.push(plain(0), now=10.0)
    assert q.next_deadline() == pytest.approx(10.0)


def test_counters_count_l2_bytes() -> None:
    q = DelayQueue(LinkParams(delay_s=0.0), random.Random(1))
    for i in range(3):
        q.push(plain(i, 200), now=1.0)
    for f in drain(q, 1.0):
        q.sent(f)
    c = q.counters
    assert (c.rx_frames, c.rx_bytes, c.tx_frames, c.tx_bytes) == (3, 600, 3, 600)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(0, 0.1),
    st.floats(0, 0.05),
    st.lists(st.floats(0, 0.01), min_size=1, max_size=200),
    st.integers(0, 2**32),
)
def test_jitter_never_reorders_and_respects_bounds(delay: float, jitter: float, gaps: list[float], seed: int) -> None:
    q = DelayQueue(LinkParams(delay_s=delay, jitter_s=jitter), random.Random(seed))
    now = 0.0
    prev = -1.0
    for i, gap in enumerate(gaps):
        now += gap
        q.push(plain(i), now)
        d = q._q[-1][0]
        assert d >= prev  # FIFO
        assert d >= now + max(0.0, delay - jitter) - 1e-12
        assert d <= max(prev, now + delay + jitter) + 1e-12
        prev = d
    out = drain(q, now + delay + jitter + 1)
    assert [int.from_bytes(f[10:14], "big") for f in out] == list(range(len(gaps)))


def test_jitter_spreads_delays() -> None:
    q = DelayQueue(LinkParams(delay_s=0.010, jitter_s=0.002), random.Random(7))
    delays = []
    for i in range(2000):
        now = i * 1.0  # far apart: no ordering clamp
        q.push(plain(i), now)
        delays.append(q._q[-1][0] - now)
    assert min(delays) >= 0.008 and max(delays) <= 0.012
    assert max(delays) - min(delays) > 0.003  # really jittered
    assert sum(delays) / len(delays) == pytest.approx(0.010, abs=2e-4)


def test_loss_is_seeded_and_near_the_rate() -> None:
    def run(seed: int) -> list[bytes]:
        q = DelayQueue(LinkParams(loss=0.1), random.Random(seed))
        for i in range(5000):
            q.push(plain(i), 0.0)
        return drain(q, 0.0)

    a, b = run(3), run(3)
    assert a == b  # reproducible
    assert 0.085 < 1 - len(a) / 5000 < 0.115
    assert run(4) != a


def test_loss_is_per_segment_of_a_super_packet() -> None:
    payload = bytes(1448 * 40)
    q = DelayQueue(LinkParams(loss=0.01), random.Random(11))
    n = 500
    for _ in range(n):
        q.push(make_tcp_gso(payload=payload), 0.0)
    out = drain(q, 0.0)
    c = q.counters
    # 40 segments each: about 0.4 lost per super-packet, not whole 40-segment bursts
    assert 0.6 * n * 40 * 0.01 < c.lost_segments < 1.4 * n * 40 * 0.01
    assert c.split_frames > 0 and c.lost_frames == 0
    sent_payload = sum(len(f) - (fr.gso_layout(f) or fr.gso_layout(make_tcp_gso())).hdr_end for f in out)
    assert sent_payload == n * len(payload) - c.lost_segments * 1448


def test_zero_and_full_loss() -> None:
    q = DelayQueue(LinkParams(loss=0.0), random.Random(1))
    q.push(make_tcp_gso(), 0.0)
    assert len(drain(q, 0.0)) == 1
    q.set_params(LinkParams(loss=1.0))
    q.push(make_tcp_gso(), 0.0)
    q.push(plain(1), 0.0)
    assert drain(q, 1.0) == []
    assert q.counters.lost_frames == 2


def test_new_parameters_apply_to_new_frames_only() -> None:
    q = DelayQueue(LinkParams(delay_s=0.050), random.Random(1))
    q.push(plain(0), 0.0)
    q.set_params(LinkParams(delay_s=0.010))
    q.push(plain(1), 0.001)  # would be due at 0.011, but FIFO keeps it behind frame 0
    q.push(plain(2), 0.045)
    assert drain(q, 0.049) == []
    assert drain(q, 0.050) == [plain(0), plain(1)]
    assert drain(q, 0.055) == [plain(2)]


def test_own_queue_cap_drops_and_counts() -> None:
    q = DelayQueue(LinkParams(delay_s=1.0), random.Random(1), max_queue_bytes=250)
    for i in range(3):
        q.push(plain(i, 100), 0.0)
    assert len(q) == 2 and q.counters.overflow_drops == 1
    assert q.clear() == 2 and drain(q, 5.0) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay_s": -0.001}, "delay must be between 0"),
        ({"jitter_s": float("nan")}, "jitter must be between 0"),
        ({"loss": 1.5}, "loss is a probability between 0 and 1"),
        ({"delay_s": 1e9}, "delay must be between 0 and 3600"),
    ],
)
def test_bad_parameters_say_what_is_wrong(kwargs: dict, message: str) -> None:
    with pytest.raises(ParamError, match=message):
        LinkParams(**kwargs)
