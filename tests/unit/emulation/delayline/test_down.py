"""A delay line taken down on purpose drops every frame, both those it receives and
those already on the wire, and carries frames again once restored."""

from __future__ import annotations

import random

import pytest

from testbed.emulation.delayline import set_command
from testbed.emulation.delayline.control import ControlError, SetCommand, parse_control
from testbed.emulation.delayline.schedule import DelayQueue, LinkParams
from testbed.emulation.delayline.stats import RelaySnapshot, window


def _queue() -> DelayQueue:
    return DelayQueue(LinkParams(delay_s=0.01), random.Random(1), vnet=False)


def test_down_drops_received_and_queued_frames_and_up_carries_again() -> None:
    q = _queue()
    q.push(b"x" * 100, 0.0)  # on the wire when the link goes down
    q.set_params(LinkParams(delay_s=0.01, down=True))
    q.push(b"y" * 100, 0.001)
    assert list(q.pop_due(1.0)) == []
    assert q.counters.down_drops == 2 and q.queued_bytes == 0
    q.set_params(LinkParams(delay_s=0.01))
    q.push(b"z" * 100, 2.0)
    assert list(q.pop_due(2.02)) == [b"z" * 100]
    assert q.counters.down_drops == 2


def test_control_line_takes_the_link_down_and_up() -> None:
    cmd = parse_control("set down=on")
    assert isinstance(cmd, SetCommand) and cmd.down is True
    assert cmd.apply(LinkParams(delay_s=0.02)) == LinkParams(delay_s=0.02, down=True)
    assert parse_control(set_command("both", delay_s=0.025, down=False)).down is False  # type: ignore[union-attr]
    assert "down" in LinkParams(down=True).describe()


@pytest.mark.parametrize(("line", "message"), [
    ("set down=maybe", "down='maybe': allowed on or off"),
    ("set down=on down=off", "down given twice"),
])
def test_bad_down_lines_are_explained(line: str, message: str) -> None:
    with pytest.raises(ControlError, match=message):
        parse_control(line)


def test_stats_window_reports_down_drops() -> None:
    before = RelaySnapshot.model_validate({"a": "dc1", "b": "dc2", "a2b": {"down_drops": 1}, "b2a": {}})
    after = RelaySnapshot.model_validate({"a": "dc1", "b": "dc2", "a2b": {"down_drops": 5}, "b2a": {"down_drops": 2}})
    w = window(before, after)
    assert w.directions()["dc1->dc2"].down_drops == 4 and w.directions()["dc2->dc1"].down_drops == 2
    assert w.relay_drops == 0  # an outage on purpose is not the emulator's fault
