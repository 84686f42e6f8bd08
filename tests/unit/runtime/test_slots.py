"""The slot feed's writer (testbed_runtime/slots.py): whole lines, one write each, and
every line read back as it was published."""

from __future__ import annotations

import os

from testbed_runtime.slots import EndOfSlots, Slot, SlotPublisher, parse_line


def test_publisher_writes_whole_lines_in_one_write(tmp_path):
    path = tmp_path / "s.jsonl"
    pub = SlotPublisher(path)
    pub.publish(Slot(0, 0, 1.0, 1.0))
    pub.close()
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 2
    assert os.stat(path).st_size == len(data)


def test_every_published_line_parses_back(tmp_path):
    path = tmp_path / "s.jsonl"
    with SlotPublisher(path, worker="dc0-h1", stage=1) as pub:
        pub.publish([Slot(2, 0, 10.0, 0.25, 1), Slot(2, 1, 11.0, 0.5, 1)])
        pub.end()
    got = [parse_line(line, f"{path}:{n}") for n, line in enumerate(path.read_text().splitlines(), 1)]
    assert got == [None, Slot(2, 0, 10.0, 0.25, 1), Slot(2, 1, 11.0, 0.5, 1), EndOfSlots()]
