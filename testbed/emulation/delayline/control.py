"""The delay line's control protocol (one command per line on stdin or --control-fd),
parsed without I/O.

    set [a2b|b2a|both] delay=50ms jitter=1ms loss=0.01   change parameters (default: both)
    set offset=0.12ms                                    the path's own one-way latency, left
                                                         out of the queue's delay
    set down=on | down=off                               cut the link (every frame dropped) or
                                                         restore it (a fault on purpose)
    stats                                                print a STATS line now
    quit                                                 exit (like SIGTERM)

Replies are one line each: ``OK <what now applies>`` or ``ERROR <why>``. Blank lines
and ``#`` comments are ignored. Rate is not the relay's business: HTB on the node's
egress shapes it (`testbed.emulation.shaping.change_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from testbed.emulation.delayline.schedule import LinkParams, ParamError
from testbed_core.units import UnitError, parse_duration, parse_fraction

Direction = Literal["a2b", "b2a", "both"]
_DIRECTIONS = ("a2b", "b2a", "both")
_KEYS = {"delay": "delay_s", "jitter": "jitter_s", "loss": "loss", "offset": "offset_s"}
_ALLOWED = "delay, jitter, loss, offset, down"
_ON = {"on": True, "1": True, "true": True, "yes": True, "off": False, "0": False, "false": False, "no": False}


class ControlError(ValueError):
    """A control line that cannot be understood; the message is sent back as ERROR."""


@dataclass(frozen=True)
class SetCommand:
    direction: Direction
    delay_s: float | None = None
    jitter_s: float | None = None
    loss: float | None = None
    offset_s: float | None = None
    down: bool | None = None

    def apply(self, current: LinkParams) -> LinkParams:
        """New parameters for one direction; raises ControlError when out of range."""
        changes = {k: v for k, v in (("delay_s", self.delay_s), ("jitter_s", self.jitter_s), ("loss", self.loss),
                                     ("offset_s", self.offset_s), ("down", self.down)) if v is not None}
        try:
            return replace(current, **changes)
        except ParamError as exc:
            raise ControlError(str(exc)) from None


@dataclass(frozen=True)
class StatsCommand:
    pass


@dataclass(frozen=True)
class QuitCommand:
    pass


Command = SetCommand | StatsCommand | QuitCommand


def parse_control(line: str) -> Command | None:
    """One control line to a command (None for blank lines and comments)."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    words = text.split()
    verb = words[0].lower()
    if verb in ("stats", "quit", "exit"):
        if len(words) > 1:
            raise ControlError(f"'{verb}' takes no arguments, got {' '.join(words[1:])!r}")
        return StatsCommand() if verb == "stats" else QuitCommand()
    if verb != "set":
        raise ControlError(f"unknown command {words[0]!r} (allowed: set, stats, quit)")
    args = words[1:]
    direction: Direction = "both"
    if args and args[0].lower() in _DIRECTIONS:
        direction = args.pop(0).lower()  # type: ignore[assignment]
    if not args:
        raise ControlError("'set' needs at least one of delay=, jitter=, loss=, offset=, down= "
                           "(e.g. 'set delay=50ms')")
    values: dict[str, float] = {}
    down: bool | None = None
    for arg in args:
        key, sep, raw = arg.partition("=")
        key = key.lower()
        if not sep or not raw:
            raise ControlError(f"expected key=value, got {arg!r} (e.g. delay=25ms)")
        if key == "dir":
            if raw.lower() not in _DIRECTIONS:
                raise ControlError(f"dir={raw!r}: allowed directions are a2b, b2a, both")
            direction = raw.lower()  # type: ignore[assignment]
            continue
        if key == "down":
            if down is not None:
                raise ControlError("down given twice")
            if raw.lower() not in _ON:
                raise ControlError(f"down={raw!r}: allowed on or off (also 1/0, true/false, yes/no)")
            down = _ON[raw.lower()]
            continue
        if key == "rate":
            raise ControlError(
                "the delay line does not shape rate: HTB on the WAN node's egress does "
                "(testbed.emulation.shaping.change_rate)"
            )
        field = _KEYS.get(key)
        if field is None:
            raise ControlError(f"unknown parameter {key!r} (allowed: {_ALLOWED})")
        if field in values:
            raise ControlError(f"{key} given twice")
        try:
            values[field] = parse_fraction(raw) if key == "loss" else parse_duration(raw)
        except UnitError as exc:
            raise ControlError(f"{key}: {exc}") from None
        if values[field] < 0:
            raise ControlError(f"{key} must not be negative, got {raw!r}")
    if not any(k in values for k in _KEYS.values()) and down is None:
        raise ControlError("'set' needs at least one of delay=, jitter=, loss=, offset=, down=")
    cmd = SetCommand(direction=direction, down=down, **values)
    cmd.apply(LinkParams())  # range check now, so the reply names the problem
    return cmd
