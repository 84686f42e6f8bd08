"""Time intervals: merging, overlap and covered length. Pure; the one home of this
math for the planner (busy WAN paths), the device timelines (busy time) and
BubbleTea's utilization."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """`intervals` merged where they overlap or touch, in time order (empty ones dropped)."""
    out: list[Interval] = []
    for start, end in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(intervals: Iterable[Interval]) -> float:
    """Seconds covered by at least one of `intervals`."""
    return sum(end - start for start, end in union(intervals))


def overlap(a: list[Interval], b: list[Interval]) -> float:
    """Seconds two merged, time-ordered interval lists (`union`) have in common."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
