"""Striping bookkeeping without sockets: work stealing, re-sends after a stream loss,
and reassembly of chunks in any order with duplicates."""

from __future__ import annotations

import random

import pytest

from atlas_transport import protocol as P
from atlas_transport.errors import ProtocolError
from atlas_transport.scheduler import OutTransfer, Reassembly, SendQueue


def transfer(tid: int, total: int = 10 * 4096, chunk: int = 4096, lanes: int | None = None) -> OutTransfer:
    m = P.TensorMeta(0, tid, "uint8", (total,), total, chunk)
    return OutTransfer(tid, m, memoryview(bytearray(total)), lanes=lanes)


def test_streams_pull_chunks_in_order_and_meta_once_per_stream() -> None:
    q = SendQueue()
    q.add(transfer(0, total=3 * 4096))
    a, b, c = q.next_chunk(0), q.next_chunk(1), q.next_chunk(0)
    assert [(x.offset, x.with_meta) for x in (a, b, c)] == [(0, True), (4096, True), (8192, False)]
    assert q.next_chunk(1) is None


def test_lost_stream_chunks_go_first_to_survivors() -> None:
    q = SendQueue()
    t = transfer(0)
    q.add(t)
    taken = {0: [], 1: []}
    for _ in range(3):
        for s in (0, 1):
            taken[s].append(q.next_chunk(s).offset)
    assert q.stream_lost(1) == [0]  # its DONE may be lost too: caller queries transfer 0
    again = [q.next_chunk(0) for _ in range(3)]
    assert [c.offset for c in again] == taken[1]
    assert again[0].with_meta is False  # stream 0 already described transfer 0
    assert q.next_chunk(0).offset == 6 * 4096  # then the never-sent rest


def test_pending_bytes_count_untaken_and_requeued_chunks() -> None:
    q = SendQueue()
    q.add(transfer(0, total=3 * 4096 + 100))  # last chunk 100 bytes
    q.add(transfer(1, total=4096))
    assert q.pending_bytes() == 4 * 4096 + 100
    q.next_chunk(0)
    q.next_chunk(1)
    assert q.pending_bytes() == 2 * 4096 + 100
    q.stream_lost(1)  # its chunk (offset 4096) goes back
    assert q.pending_bytes() == 3 * 4096 + 100
    while q.next_chunk(0) is not None:
        pass
    assert q.pending_bytes() == 0


def test_done_drops_pending_resends_and_repeated_done_is_harmless() -> None:
    q = SendQueue()
    t = transfer(0)
    q.add(t)
    q.next_chunk(1)
    q.stream_lost(1)
    assert q.complete(0) is t
    assert q.complete(0) is None
    assert q.next_chunk(0) is None and not q.inflight


def test_lanes_restrict_streams() -> None:
    q = SendQueue()
    q.add(transfer(0, lanes=2))
    assert q.next_chunk(2) is None and q.next_chunk(3) is None
    assert q.next_chunk(1) is not None


def test_empty_tensor_is_one_empty_chunk() -> None:
    q = SendQueue()
    q.add(transfer(0, total=0))
    c = q.next_chunk(0)
    assert (c.offset, c.length, c.with_meta) == (0, 0, True)
    assert q.next_chunk(0) is None


def test_reassembly_any_order_with_duplicates() -> None:
    rnd = random.Random(7)
    m = P.TensorMeta(0, 0, "uint8", (10 * 4096 - 100,), 10 * 4096 - 100, 4096)
    rx = Reassembly()
    t, new = rx.announce(0, m)
    assert new
    order = list(range(m.n_chunks)) * 2
    rnd.shuffle(order)
    finished = 0
    landed = set()
    for i in order:
        off = i * 4096
        got = rx.begin_chunk(0, off, m.chunk_length(off)) if not rx.is_complete(0) else None
        if got is None:
            assert i in landed or rx.is_complete(0)
            continue
        landed.add(i)
        finished += rx.end_chunk(got, off, ok=True)
    assert finished == 1 and rx.is_complete(0) and not rx.active
    # Late duplicates of a finished transfer are discarded, even with a description.
    assert rx.announce(0, m) == (None, False)
    assert rx.begin_chunk(0, 0, 4096) is None


def test_transfer_not_handed_over_while_a_duplicate_is_being_written() -> None:
    m = P.TensorMeta(0, 0, "uint8", (8192,), 8192, 4096)
    rx = Reassembly()
    t, _ = rx.announce(0, m)
    first = rx.begin_chunk(0, 0, 4096)  # stream A starts chunk 0
    dup = rx.begin_chunk(0, 0, 4096)  # stream B got the re-sent chunk 0
    assert first is dup is t
    last = rx.begin_chunk(0, 4096, 4096)
    assert not rx.end_chunk(last, 4096, ok=True)
    assert not rx.end_chunk(dup, 0, ok=True)  # whole, but stream A still writes
    assert rx.end_chunk(first, 0, ok=False)  # A broke mid-chunk: now it is safe


def test_reassembly_refuses_inconsistent_peers() -> None:
    m = P.TensorMeta(0, 0, "uint8", (8192,), 8192, 4096)
    rx = Reassembly()
    rx.announce(3, m)
    with pytest.raises(ProtocolError, match="re-announced"):
        rx.announce(3, P.TensorMeta(0, 0, "uint8", (4096,), 4096, 4096))
    with pytest.raises(ProtocolError, match="before its description"):
        rx.begin_chunk(4, 0, 4096)
    with pytest.raises(ProtocolError, match="does not fit"):
        rx.begin_chunk(3, 4096, 100)


def test_completion_watermark_keeps_memory_bounded() -> None:
    rx = Reassembly()
    m = P.TensorMeta(0, 0, "uint8", (0,), 0, 4096)
    for tid in (2, 0, 1, 3):
        t, _ = rx.announce(tid, m)
        assert rx.end_chunk(rx.begin_chunk(tid, 0, 0), 0, ok=True)
    assert rx._done_below == 4 and not rx._done_above


def test_soft_lanes_are_lifted_when_a_stream_is_lost() -> None:
    q = SendQueue()
    t = transfer(1, total=4 * 4096, lanes=2)
    t.soft_lanes = True
    q.add(t)
    assert q.next_chunk(5) is None  # a preference for streams 0 and 1 ...
    assert q.next_chunk(0).offset == 0
    assert q.next_chunk(1).offset == 4096
    q.stream_lost(1)
    assert t.lanes is None  # ... that no longer binds once one of them is gone
    assert [q.next_chunk(5).offset for _ in range(3)] == [4096, 8192, 12288]
    probe = transfer(2, total=2 * 4096, lanes=1)  # a probe's lanes stay hard
    q.add(probe)
    q.stream_lost(0)
    assert probe.lanes == 1


def test_a_quota_holds_each_stream_to_its_share_until_the_spread_ends() -> None:
    q = SendQueue()
    t = transfer(0, total=4 * 4096)
    t.quota, t.spread_until = 1, 10.0
    q.add(t)
    assert q.next_chunk(0, now=1.0).offset == 0
    assert q.next_chunk(0, now=1.0) is None  # the chunks left are the other streams' share ...
    assert q.opens_at == 10.0  # ... until the spread ends
    assert q.next_chunk(1, now=1.0).offset == 4096 and q.opens_at is None
    assert q.next_chunk(0, now=10.0).offset == 8192  # then any stream takes what is left
    later = transfer(1, total=4096)
    q.add(later)
    t.spread_until = 20.0
    assert q.next_chunk(0, now=11.0).transfer is later  # a held chunk does not hold back the next transfer


def test_a_lost_stream_lifts_the_quota() -> None:
    q = SendQueue()
    t = transfer(0, total=4 * 4096)
    t.quota, t.spread_until = 2, 10.0
    q.add(t)
    assert [q.next_chunk(0, now=1.0).offset for _ in range(2)] == [0, 4096]
    assert q.next_chunk(0, now=1.0) is None
    q.next_chunk(1, now=1.0)
    q.stream_lost(1)
    assert t.quota is None
    assert [q.next_chunk(0, now=1.0).offset for _ in range(2)] == [8192, 12288]
