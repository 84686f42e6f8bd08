"""Following a growing JSON-lines file (bubbletea_agent/tail.py): complete lines only,
numbered, a half-written line kept until its newline, a missing file is empty."""

from __future__ import annotations

import json

from bubbletea_agent.runtime import TimelineTail
from bubbletea_agent.tail import JsonlTail


def test_lines_are_returned_once_complete_and_numbered(tmp_path):
    path = tmp_path / "f.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == []  # not written yet
    path.write_bytes(b'{"a": 1}\n{"b"')
    assert tail.poll() == [(1, b'{"a": 1}')]
    assert tail.poll() == []
    with path.open("ab") as f:
        f.write(b': 2}\n\n{"c": 3}\n')
    assert tail.poll() == [(2, b'{"b": 2}'), (3, b""), (4, b'{"c": 3}')]


def test_timeline_tail_reads_work_and_skips_bad_lines(tmp_path, caplog):
    path = tmp_path / "dev.timeline.jsonl"
    rec = {"kind": "forward", "owner": "train:w", "label": "it0", "start": 1.0, "end": 1.5}
    path.write_text(json.dumps(rec) + "\nnot json\n" + json.dumps(dict(rec, requested=0.9, start=2.0)) + "\n")
    work = TimelineTail(path).poll()
    assert [(w.kind, w.requested, w.start, w.end) for w in work] == [("forward", 1.0, 1.0, 1.5),
                                                                     ("forward", 0.9, 2.0, 1.5)]
    assert "skipping unreadable timeline line" in caplog.text
