"""Warming a real-device worker's WAN channels before its first iteration, as the
calibration warms its probes' channels before it times them.

The calibration sends one large untimed tensor over each probe channel first (a few
windows per stream, testbed/run/calibration.py ``PROBE_WARMUP_BYTES_PER_STREAM``) and
then times the workload's wire-size tensors over streams whose congestion windows are
open. A real model's boundary tensors can be far smaller than a window (the tiny GPT's
are 16 KiB, 12 segments): streams that only ever carry them keep windows of a few
segments, and with pacing on (``transport.pacing``, Linux's internal pacing at about
cwnd / RTT) each such tensor leaves over a good part of a round trip instead of at
once, so the run's transfers take longer than the calibration timed, and an Atlas token
holder announces later ends. Each WAN boundary channel therefore carries the same
untimed warm-up tensor each way before the worker reports ready: the run's streams are
in the state the calibration measured (``tcp_slow_start_after_idle`` is off on the
emulated hosts, so the windows stay open between iterations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from testbed.training.worker.job import WorkerError
from testbed_core.constants import WARMUP_BYTES_PER_STREAM, warmup_bytes

if TYPE_CHECKING:
    from atlas_transport.channel import Channel
    from testbed_core.contracts.worker_job import ChannelJob

WARM_BYTES_PER_STREAM = WARMUP_BYTES_PER_STREAM  # the calibration's (testbed_core/constants.py)
WARM_TAG = (1 << 63) - 1  # above every training tag (testbed/training/transport_comm.py tag_for)


warm_bytes = warmup_bytes  # the warm-up tensor of a channel of `streams` streams (the calibration's)


def warm_wan_channels(channels: Mapping[int, Channel], specs: Sequence[ChannelJob], timeout_s: float) -> float:
    """Send the warm-up tensor each way over every WAN boundary channel (both ends call
    this: each sends its own and receives its peer's), all channels at once; returns
    the bytes sent. Channels inside a DC (no WAN link either way) are left alone."""
    import torch

    sends, recvs = [], []
    sent = 0
    for spec in specs:
        if not spec.links and not spec.recv_links:
            continue
        ch = channels.get(spec.boundary)
        if ch is None:
            raise WorkerError(f"boundary {spec.boundary}: no channel open to warm (peer {spec.peer})")
        n = warm_bytes(spec.streams)
        recvs.append((spec, ch.irecv(WARM_TAG)))
        sends.append((spec, ch.isend(torch.zeros(n, dtype=torch.uint8), WARM_TAG)))
        sent += n
    for spec, handle in sends + recvs:
        try:
            handle.wait(timeout_s)
        except TimeoutError:
            raise WorkerError(f"boundary {spec.boundary}: the warm-up tensor to or from {spec.peer} did not complete "
                              f"within {timeout_s:g} s") from None
    return sent
