"""Idle slots as the agent sees them: the worker's slot feed, tailed, and the agent's
corrected view of it.

The feed's format and its writer are the runtime's (testbed_runtime/slots.py: one JSON
line per predicted slot, written by the training worker); `SlotFeed` tails it.

The agent does not trust predictions blindly: `SlotTracker` matches each past slot
against the idle gap the device timeline actually showed between training work, and
learns per slot index how slots start and end against their prediction. The corrected
slot is start + (low quantile of start delays), end + (low quantile of end errors):
the end is conservative (a prefill must be over before training wants the device back);
the start may be early because nothing starts before the device is free (`try_run`), so
an early guess costs a few polls, a late one costs idle time.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bubbletea_agent.tail import JsonlTail
from testbed_runtime.slots import EndOfSlots, Slot, SlotFormatError, parse_line


class SlotFeed:
    """Agent side: tail the publication file; a missing file means nothing published yet."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._tail = JsonlTail(path)
        self.path = self._tail.path

    def poll(self) -> list[Slot | EndOfSlots]:
        out: list[Slot | EndOfSlots] = []
        for line, raw in self._tail.poll():
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise SlotFormatError(f"{self.path}:{line}: not UTF-8 text") from None
            msg = parse_line(text, f"{self.path}:{line}")
            if msg is not None:
                out.append(msg)
        return out


def merge_busy(intervals: Iterable[tuple[float, float]], min_gap_s: float) -> list[tuple[float, float]]:
    """Sort and merge busy intervals; gaps shorter than min_gap_s are not idle slots."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s - merged[-1][1] < min_gap_s:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


@dataclass
class SlotTracker:
    """Predicted slots, corrected by what the device timeline showed (sans-IO)."""

    quantile: float = 0.9  # how conservative the corrections are
    window: int = 32  # observations kept per slot index
    min_gap_s: float = 0.0005  # training gaps shorter than this are not slots
    slots: dict[tuple[int, int], Slot] = field(default_factory=dict)
    ended: bool = False
    _pending_match: set[tuple[int, int]] = field(default_factory=set)
    _obs: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)
    _obs_all: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=128))
    matched: int = 0
    unmatched: int = 0
    published: int = 0
    _offsets: dict[int, tuple[float, float]] = field(default_factory=dict)

    # -- input
    def publish(self, msg: Slot | EndOfSlots) -> None:
        if isinstance(msg, EndOfSlots):
            self.ended = True
            return
        if msg.key not in self.slots:
            self.published += 1
        self.slots[msg.key] = msg
        self._pending_match.add(msg.key)

    def observe(self, training_busy: Sequence[tuple[float, float]], now: float) -> int:
        """Learn from past slots. `training_busy` holds (start, end) of the training
        work on the device (not the agent's own prefills), covering at least the unmatched
        slots. Returns how many slots were matched now."""
        due = sorted((k for k in self._pending_match if self.slots[k].end <= now),
                     key=lambda k: self.slots[k].start)
        if not due:
            return 0
        busy = merge_busy(training_busy, self.min_gap_s)
        gaps = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]
        n = 0
        for key in due:
            slot = self.slots[key]
            if not busy or busy[-1][1] < slot.end:
                continue  # no training seen past the slot's end: its gap may still be open
            gap = _best_gap(gaps, slot)
            self._pending_match.discard(key)
            if gap is None:
                self.unmatched += 1
                continue
            obs = (gap[0] - slot.start, gap[1] - slot.end)
            self._obs.setdefault(slot.index, deque(maxlen=self.window)).append(obs)
            self._obs_all.append(obs)
            self._offsets.clear()
            self.matched += 1
            n += 1
        return n

    # -- output
    def _learned(self, index: int) -> tuple[float, float, float]:
        """(early start shift, sure start shift, end shift) for a slot index."""
        cached = self._offsets.get(index)
        if cached is not None:
            return cached
        obs = self._obs.get(index) or self._obs_all
        if not obs:
            return 0.0, 0.0, 0.0
        arr = np.asarray(obs)
        out = (float(np.quantile(arr[:, 0], 1.0 - self.quantile)),
               float(np.quantile(arr[:, 0], self.quantile)),
               float(np.quantile(arr[:, 1], 1.0 - self.quantile)))
        self._offsets[index] = out
        return out

    def offsets(self, index: int) -> tuple[float, float]:
        """(start shift, end shift) learned for a slot index (0, 0 before any data)."""
        early, _, end = self._learned(index)
        return early, end

    def corrected(self, slot: Slot) -> Slot:
        ds, de = self.offsets(slot.index)
        start, end = slot.start + ds, slot.end + de
        return replace(slot, start=start, length=max(0.0, end - start))

    def observed(self, index: int) -> int:
        """How many past slots of this index were matched with the timeline."""
        return len(self._obs.get(index, ()))

    def sure_start(self, corrected: Slot) -> float:
        """When the slot has almost surely begun (the high quantile of start delays): before
        this, a free device may only be a gap between two training pieces."""
        early, sure, _ = self._learned(corrected.index)
        return corrected.start - early + sure

    def current(self, now: float) -> Slot | None:
        """The corrected slot containing `now`, if any."""
        for slot in self.slots.values():
            c = self.corrected(slot)
            if c.length > 0 and c.start <= now < c.end:
                return c
        return None

    def next_start(self, now: float) -> float | None:
        starts = [c.start for c in map(self.corrected, self.slots.values())
                  if c.length > 0 and c.start > now]
        return min(starts, default=None)

    def longest_s(self) -> float | None:
        lengths = [self.corrected(s).length for s in self.slots.values()]
        return max(lengths, default=None)

    def horizon_start(self) -> float | None:
        """Earliest start among slots still waiting to be matched (timeline needed from here)."""
        return min((self.slots[k].start for k in self._pending_match), default=None)

    def prune(self, before: float) -> None:
        """Forget slots that ended (and were matched) before `before`."""
        for key in [k for k, s in self.slots.items()
                    if s.end < before and k not in self._pending_match]:
            del self.slots[key]

    def stats(self) -> dict:
        return {"slots_published": self.published, "matched": self.matched,
                "unmatched": self.unmatched,
                "offsets_by_index": {i: self.offsets(i) for i in sorted(self._obs)}}


def _best_gap(gaps: Sequence[tuple[float, float]], slot: Slot) -> tuple[float, float] | None:
    """The observed idle gap that best overlaps the predicted slot; else the nearest one
    starting within one slot length of it; else None."""
    best, best_overlap = None, 0.0
    for g0, g1 in gaps:
        overlap = min(g1, slot.end) - max(g0, slot.start)
        if overlap > best_overlap:
            best, best_overlap = (g0, g1), overlap
    if best is not None:
        return best
    near = [g for g in gaps if abs(g[0] - slot.start) <= slot.length]
    return min(near, key=lambda g: abs(g[0] - slot.start), default=None)
