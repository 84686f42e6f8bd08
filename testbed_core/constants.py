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


RMEM_FRACTION = 0.66
"""The share of its receive buffer a Linux receiver advertises as window at most. Before
Linux 6.6 it was tcp_adv_win_scale's 1/2; since, the kernel scales the buffer by the
payload / truesize ratio of the segments it receives (tp->scaling_ratio). Measured on
this machine's kernel (6.18) over the emulation's veths: a stream to a receiver with
tcp_rmem max 4,000,000 saw snd_wnd 2,653,440, 0.663 of it (results/window-fraction).
At 0.5 the planner held a one-stream channel's second 1 MiB tensor back a round trip
behind the first (2 x 1.05 MB past a 2 MB window): 4dc-regions' baseline was predicted
2.036 s and ran 1.717 (the kept run at 085e8ae)."""
