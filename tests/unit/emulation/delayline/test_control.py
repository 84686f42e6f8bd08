"""The delay line's control protocol: `set`/`stats`/`quit` lines, their errors, and
`set_command`, which formats the lines the builder sends for time-varying links."""

from __future__ import annotations

import pytest

from testbed.emulation.delayline import LinkParams, set_command
from testbed.emulation.delayline.control import (
    ControlError,
    QuitCommand,
    SetCommand,
    StatsCommand,
    parse_control,
)


def test_set_defaults_to_both_directions() -> None:
    cmd = parse_control("set delay=50ms jitter=1ms loss=1%")
    assert cmd == SetCommand("both", delay_s=pytest.approx(0.05), jitter_s=pytest.approx(0.001), loss=pytest.approx(0.01))


def test_set_one_direction_and_partial_change() -> None:
    cmd = parse_control("  set b2a loss=0.001   # comment")
    assert isinstance(cmd, SetCommand) and cmd.direction == "b2a" and cmd.delay_s is None
    new = cmd.apply(LinkParams(delay_s=0.02, jitter_s=0.001))
    assert new == LinkParams(delay_s=0.02, jitter_s=0.001, loss=0.001)
    assert parse_control("set dir=a2b delay=1s").direction == "a2b"  # type: ignore[union-attr]


def test_other_commands_and_blank_lines() -> None:
    assert parse_control("stats") == StatsCommand()
    assert parse_control("QUIT") == QuitCommand()
    assert parse_control("") is None
    assert parse_control("   # just a comment") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("jump", "unknown command 'jump' (allowed: set, stats, quit)"),
        ("set", "'set' needs at least one of delay=, jitter=, loss=, offset="),
        ("set a2b", "'set' needs at least one of"),
        ("set delay", "expected key=value, got 'delay'"),
        ("set delay=", "expected key=value"),
        ("set delay=5parsec", "delay: '5parsec': unknown time unit 'parsec'"),
        ("set rate=1Gbit", "does not shape rate: HTB on the WAN node's egress"),
        ("set colour=red", "unknown parameter 'colour' (allowed: delay, jitter, loss, offset, down)"),
        ("set offset=-1ms", "offset must not be negative"),
        ("set loss=2", "loss is a probability between 0 and 1"),
        ("set delay=-5ms", "delay must not be negative"),
        ("set delay=1ms delay=2ms", "delay given twice"),
        ("set dir=up delay=1ms", "allowed directions are a2b, b2a, both"),
        ("stats now", "'stats' takes no arguments"),
    ],
)
def test_bad_control_lines_are_explained(line: str, message: str) -> None:
    with pytest.raises(ControlError) as info:
        parse_control(line)
    assert message in str(info.value)


def test_set_command_round_trips() -> None:
    line = set_command("a2b", delay_s=0.0125, loss=0.002)
    assert line.endswith("\n")
    assert parse_control(line) == SetCommand("a2b", delay_s=pytest.approx(0.0125), loss=pytest.approx(0.002))
    with pytest.raises(ValueError, match="at least one"):
        set_command("both")


def test_offset_is_set_on_its_own_and_survives_delay_changes() -> None:
    """The calibrated path latency stays when a time-varying link changes its delay."""
    cmd = parse_control(set_command("both", offset_s=0.00012))
    assert cmd == SetCommand("both", offset_s=pytest.approx(0.00012))
    calibrated = cmd.apply(LinkParams(delay_s=0.025))
    changed = parse_control(set_command("both", delay_s=0.05)).apply(calibrated)  # type: ignore[union-attr]
    assert changed.offset_s == pytest.approx(0.00012) and changed.delay_s == pytest.approx(0.05)
    assert "offset=0.12ms" in changed.describe()
