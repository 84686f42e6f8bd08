"""Idle slots: the interface from the training worker to the BubbleTea agent.

The interface (one file per device, JSON lines, append-only, written by the training
worker, tailed by the agent):

    {"type": "hello", "v": 1, "clock": "time", "worker": "dc0-w0", "stage": 0}
    {"type": "slot", "iteration": 3, "index": 1, "stage": 0, "start": 1718000123.417, "length": 0.120}
    {"type": "end"}

* `start` is the predicted slot start in `time.time()` seconds, the clock of the device
  timeline (testbed_runtime/device.py; one clock for every process and network namespace
  of the machine), `length` its predicted duration in wall seconds. `index` is the slot's
  position within an iteration (the same bubble of the schedule has the same index every iteration: that is what
  corrections are learned per). A slot published again (same iteration and index)
  replaces the earlier prediction.
* `end` says the worker will publish no more slots (training is over).
* Writers emit each line with a single write() so a reader never sees half a record;
  `SlotPublisher` does this. Publish a slot before it starts (e.g. all of an iteration's
  slots when the iteration begins). `parse_line` reads a line back.

The agent's side, which tails the file and corrects the predictions from what the device
timeline showed, is bubbletea_agent/slots.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class Slot:
    iteration: int
    index: int
    start: float
    length: float
    stage: int = 0

    @property
    def end(self) -> float:
        return self.start + self.length

    @property
    def key(self) -> tuple[int, int]:
        return (self.iteration, self.index)

    def to_json(self) -> dict:
        return {"type": "slot", "iteration": self.iteration, "index": self.index,
                "stage": self.stage, "start": self.start, "length": self.length}


@dataclass(frozen=True)
class EndOfSlots:
    """The worker publishes no more slots."""


class SlotFormatError(ValueError):
    """A slot publication line that does not follow the protocol; names file and line."""


def parse_line(text: str, where: str) -> Slot | EndOfSlots | None:
    """One publication line -> Slot / EndOfSlots / None (hello, blank). `where` is
    'file:line' for messages."""
    text = text.strip()
    if not text:
        return None
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlotFormatError(f"{where}: not JSON ({exc.msg}): {text[:80]!r}") from None
    if not isinstance(msg, dict) or "type" not in msg:
        raise SlotFormatError(f"{where}: expected an object with a 'type' field, got {text[:80]!r}")
    kind = msg["type"]
    if kind == "hello":
        v = msg.get("v", PROTOCOL_VERSION)
        if v != PROTOCOL_VERSION:
            raise SlotFormatError(f"{where}: slot protocol version {v}, this agent speaks {PROTOCOL_VERSION}")
        clock = msg.get("clock", "time")
        if clock != "time":
            raise SlotFormatError(f"{where}: clock {clock!r} unsupported; publish time.time() seconds "
                                  "(the device timeline's clock) and say \"clock\": \"time\"")
        return None
    if kind == "end":
        return EndOfSlots()
    if kind != "slot":
        raise SlotFormatError(f"{where}: unknown message type {kind!r} (expected hello, slot or end)")
    try:
        slot = Slot(int(msg["iteration"]), int(msg["index"]), float(msg["start"]),
                    float(msg["length"]), int(msg.get("stage", 0)))
    except KeyError as exc:
        raise SlotFormatError(f"{where}: slot message lacks field {exc.args[0]!r}") from None
    except (TypeError, ValueError):
        raise SlotFormatError(f"{where}: slot fields must be numbers: {text[:120]!r}") from None
    if not slot.length > 0:
        raise SlotFormatError(f"{where}: slot length {slot.length} must be > 0")
    return slot


class SlotPublisher:
    """Training-worker side: append slot predictions to the publication file."""

    def __init__(self, path: str | os.PathLike, worker: str = "", stage: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._write({"type": "hello", "v": PROTOCOL_VERSION, "clock": "time",
                     "worker": worker, "stage": stage})

    def _write(self, msg: dict) -> None:
        os.write(self._fd, (json.dumps(msg, separators=(",", ":")) + "\n").encode())

    def publish(self, slots: Slot | Iterable[Slot]) -> None:
        for s in [slots] if isinstance(slots, Slot) else slots:
            self._write(s.to_json())

    def end(self) -> None:
        self._write({"type": "end"})

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SlotPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
