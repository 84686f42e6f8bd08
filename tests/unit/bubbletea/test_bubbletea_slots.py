"""The agent's side of the slot feed (bubbletea_agent/slots.py): tailing it, and the
tracker's corrections from observation."""

from __future__ import annotations

import json

import pytest

from bubbletea_agent.slots import SlotFeed, SlotTracker, merge_busy
from testbed_runtime.slots import EndOfSlots, Slot, SlotFormatError, SlotPublisher


def test_publish_and_tail_roundtrip(tmp_path):
    path = tmp_path / "w0.slots.jsonl"
    feed = SlotFeed(path)
    assert feed.poll() == []  # nothing published yet
    with SlotPublisher(path, worker="dc0-h1", stage=2) as pub:
        pub.publish(Slot(0, 0, 100.0, 0.05, stage=2))
        assert feed.poll() == [Slot(0, 0, 100.0, 0.05, 2)]
        pub.publish([Slot(0, 1, 100.2, 0.1, 2), Slot(1, 0, 101.0, 0.05, 2)])
        pub.end()
    assert feed.poll() == [Slot(0, 1, 100.2, 0.1, 2), Slot(1, 0, 101.0, 0.05, 2), EndOfSlots()]
    assert feed.poll() == []


def test_feed_waits_for_the_rest_of_a_half_written_line(tmp_path):
    path = tmp_path / "s.jsonl"
    line = json.dumps(Slot(3, 1, 5.0, 0.5).to_json()) + "\n"
    with open(path, "w") as f:
        f.write(line[:10])
    feed = SlotFeed(path)
    assert feed.poll() == []
    with open(path, "a") as f:
        f.write(line[10:])
    assert feed.poll() == [Slot(3, 1, 5.0, 0.5)]


@pytest.mark.parametrize("line, message", [
    ("not json", r"s.jsonl:2: not JSON"),
    ('{"iteration": 1}', r"s.jsonl:2: expected an object with a 'type'"),
    ('{"type": "bubble"}', r"s.jsonl:2: unknown message type 'bubble'"),
    ('{"type": "slot", "iteration": 1, "index": 0, "start": 1.0}', r"s.jsonl:2: slot message lacks field 'length'"),
    ('{"type": "slot", "iteration": 1, "index": 0, "start": "soon", "length": 1}', r"s.jsonl:2: slot fields must be numbers"),
    ('{"type": "slot", "iteration": 1, "index": 0, "start": 1.0, "length": 0}', r"s.jsonl:2: slot length 0.0 must be > 0"),
    ('{"type": "hello", "v": 2}', r"s.jsonl:2: slot protocol version 2"),
    ('{"type": "hello", "clock": "monotonic"}', r"s.jsonl:2: clock 'monotonic' unsupported; publish time.time"),
])
def test_malformed_publications_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "s.jsonl"
    path.write_text('{"type": "hello", "v": 1, "clock": "time"}\n' + line + "\n")
    with pytest.raises(SlotFormatError, match=message):
        SlotFeed(path).poll()


def test_merge_busy_ignores_tiny_gaps():
    assert merge_busy([(0, 1), (1.0001, 2), (3, 4)], min_gap_s=0.001) == [(0, 2), (3, 4)]


def iteration_busy(t0: float, late: float = 0.0, early_end: float = 0.0):
    """Training of one iteration: busy [t0, t0+1) and [t0+1.5, t0+2): the slot is [1, 1.5).
    In reality the slot starts `late` later and ends `early_end` earlier."""
    return [(t0, t0 + 1 + late), (t0 + 1.5 - early_end, t0 + 2)]


def test_tracker_learns_late_starts_and_early_ends():
    tr = SlotTracker(quantile=0.9)
    busy = []
    for it in range(5):
        t0 = 10.0 * it
        tr.publish(Slot(it, 0, t0 + 1.0, 0.5))
        busy += iteration_busy(t0, late=0.05, early_end=0.02)
        assert tr.observe(busy, now=t0 + 2.0) == 1
    ds, de = tr.offsets(0)
    assert ds == pytest.approx(0.05) and de == pytest.approx(-0.02)
    tr.publish(Slot(5, 0, 51.0, 0.5))
    c = tr.corrected(Slot(5, 0, 51.0, 0.5))
    assert c.start == pytest.approx(51.05) and c.end == pytest.approx(51.48)
    assert tr.current(51.02) is None  # predicted open, but it really starts later
    assert tr.current(51.1).key == (5, 0)
    assert tr.current(51.49) is None
    assert tr.next_start(50.0) == pytest.approx(51.05)
    assert tr.longest_s() == pytest.approx(0.43)
    assert tr.matched == 5 and tr.unmatched == 0


def test_tracker_waits_until_the_gap_has_closed():
    tr = SlotTracker()
    tr.publish(Slot(0, 0, 1.0, 0.5))
    # training after the slot has not started yet: the actual slot end is unknown
    assert tr.observe([(0.0, 1.0)], now=1.6) == 0
    assert tr.observe([(0.0, 1.0), (1.7, 2.0)], now=2.0) == 1
    assert tr.offsets(0) == pytest.approx((0.0, 0.2))


def test_tracker_uses_the_best_overlapping_gap_and_per_index_offsets():
    tr = SlotTracker(quantile=0.5, min_gap_s=0.001)
    tr.publish(Slot(0, 0, 1.0, 0.5))
    tr.publish(Slot(0, 1, 3.0, 1.0))
    busy = [(0, 1.0), (1.0002, 1.1), (1.5, 3.2), (3.9, 5.0)]  # tiny gap at 1.0 is not a slot
    assert tr.observe(busy, now=5.0) == 2
    assert tr.offsets(0) == pytest.approx((0.1, 0.0))
    assert tr.offsets(1) == pytest.approx((0.2, -0.1))
    assert tr.offsets(7) == pytest.approx((0.15, -0.05))  # unseen index: pooled estimate


def test_tracker_counts_slots_that_never_happened():
    tr = SlotTracker()
    tr.publish(Slot(0, 0, 1.0, 0.5))
    assert tr.observe([(0.0, 5.0), (5.0, 6.0)], now=6.0) == 0
    assert tr.unmatched == 1


def test_republished_slot_replaces_the_prediction_and_end_is_kept():
    tr = SlotTracker()
    tr.publish(Slot(0, 0, 1.0, 0.5))
    tr.publish(Slot(0, 0, 1.2, 0.2))
    assert tr.current(1.1) is None and tr.current(1.3).length == pytest.approx(0.2)
    tr.publish(EndOfSlots())
    assert tr.ended
    tr.prune(before=10.0)  # unmatched slots are kept until matched
    assert tr.slots
