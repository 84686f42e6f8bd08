"""Constants shared across the layers: where the source tree and its shipped files lie."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout (or installed tree) that holds the packages and the shipped files."""

TOPOLOGIES_DIR = REPO_ROOT / "topologies"
SCENARIOS_DIR = REPO_ROOT / "scenarios"
WORKLOADS_DIR = SCENARIOS_DIR / "workloads"

WARMUP_BYTES_PER_STREAM = 2 << 20
"""The untimed tensor a channel carries first, per stream (a few windows each), before
its tensors are timed (the calibration's probes) or carry a real model's (its workers):
the one rule for both, so that a run's streams are in the state the calibration timed."""

WARMUP_MAX_BYTES = 64 << 20
"""The cap on one channel's warm-up tensor."""


def warmup_bytes(streams: int) -> int:
    """The warm-up tensor of a channel of `streams` streams."""
    return min(WARMUP_BYTES_PER_STREAM * streams, WARMUP_MAX_BYTES)
